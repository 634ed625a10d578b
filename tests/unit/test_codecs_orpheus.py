"""The Orpheus token layout, read from the tiny model's tokenizer, and frame assembly from a token stream."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.codecs.orpheus import FrameAssembler, OrpheusLayout
from tests.unit.tts_support import tiny_orpheus_path


@pytest.fixture(scope="session")
def orpheus_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_orpheus_path()))


@pytest.fixture(scope="session")
def layout(orpheus_tokenizer: Any) -> OrpheusLayout:
    return OrpheusLayout.from_tokenizer(orpheus_tokenizer)


def audio_id(layout: OrpheusLayout, position: int, code: int) -> int:
    return layout.audio_offset + position * layout.codebook_size + code


def test_layout_ids_match_token_strings(layout: OrpheusLayout, orpheus_tokenizer: Any) -> None:
    ids = orpheus_tokenizer.convert_tokens_to_ids
    assert layout.start_ids == [ids("<custom_token_3>")]
    assert layout.end_ids == [ids("<|eot_id|>"), ids("<custom_token_4>")]
    assert layout.stop_id == ids("<custom_token_2>")
    assert layout.audio_offset == ids("<custom_token_10>")
    assert (layout.codebook_size, layout.frame_size) == (4096, 7)


def test_audio_token_ids_cover_every_position_and_code(layout: OrpheusLayout, orpheus_tokenizer: Any) -> None:
    ids = layout.audio_token_ids()
    assert len(ids) == 7 * 4096
    assert ids[0] == layout.audio_offset
    assert ids[-1] == orpheus_tokenizer.convert_tokens_to_ids(f"<custom_token_{10 + 7 * 4096 - 1}>")
    assert ids[-1] == len(orpheus_tokenizer) - 1
    assert layout.stop_id not in ids


def test_talker_stops_at_end_of_speech(layout: OrpheusLayout, orpheus_tokenizer: Any) -> None:
    import json

    config = json.loads((tiny_orpheus_path() / "config.json").read_text())
    assert config["eos_token_id"] == layout.stop_id
    assert config["vocab_size"] == len(orpheus_tokenizer)


def test_prompt_text_starts_with_bos(orpheus_tokenizer: Any) -> None:
    ids = orpheus_tokenizer("tara: hello").input_ids
    assert ids[0] == orpheus_tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert ids[1:] == orpheus_tokenizer("tara: hello", add_special_tokens=False).input_ids


def test_from_tokenizer_names_missing_tokens() -> None:
    class Plain:
        def get_vocab(self) -> dict[str, int]:
            return {"<|eot_id|>": 0, "<custom_token_2>": 1}

    with pytest.raises(ValueError, match=r"<custom_token_3>.*<custom_token_4>.*<custom_token_10>"):
        OrpheusLayout.from_tokenizer(Plain())


def test_codes_drop_other_tokens_and_wrap_positions(layout: OrpheusLayout) -> None:
    tokens = [
        layout.start_ids[0],
        audio_id(layout, 0, 5),
        layout.stop_id,
        audio_id(layout, 6, 4095),
        # A code at the wrong position still decodes to itself.
        audio_id(layout, 3, 17),
        layout.audio_offset - 1,
        layout.audio_offset + 7 * 4096,
    ]
    assert layout.codes(tokens) == [5, 4095, 17]


def test_frame_assembler_across_uneven_chunks(layout: OrpheusLayout) -> None:
    codes = list(range(100, 121))  # three frames
    tokens = [audio_id(layout, i % 7, code) for i, code in enumerate(codes)]
    assembler = FrameAssembler(layout)
    assert assembler.add(tokens[:3]) == []
    assert assembler.add([layout.stop_id, *tokens[3:10]]) == [codes[:7]]
    assert assembler.add(tokens[10:11]) == []
    assert assembler.add(tokens[11:]) == [codes[7:14], codes[14:21]]
    assert assembler.add([]) == []
    assert assembler.add(tokens[:6]) == []
