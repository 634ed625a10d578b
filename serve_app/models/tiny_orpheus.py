"""Build the default text-to-speech model locally: a tiny random Orpheus talker and a random SNAC.

Like `tiny_chat`, nothing is downloaded. The layout is canopylabs/orpheus-3b-0.1-ft's: a Llama talker
whose tokenizer has `<|begin_of_text|>` (added as BOS), `<|eot_id|>` and the added tokens
`<custom_token_0>` ... `<custom_token_28681>`, of which the last 7 * 4096 carry SNAC codes, and a
24 kHz SNAC in `snac/`. Only the scale differs (an 8000-token BPE instead of Llama-3's 128256, the
tiny chat model's width) and the weights are random, so the talker emits arbitrary audio tokens and
the codec turns them into noise through the real code paths. The talker's `eos_token_id` is
`<custom_token_2>`, Orpheus' end of speech, so vLLM stops there without being told.
Run `python -m serve_app.models.tiny_orpheus models/tiny-orpheus`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serve_app.codecs.orpheus import (
    CODEBOOK_SIZE,
    END_OF_SPEECH,
    END_OF_TEXT,
    FIRST_AUDIO_INDEX,
    FRAME_SIZE,
    custom_token,
)
from serve_app.codecs.snac import save_random_snac
from serve_app.models.tiny_chat import SEED, SPECIAL_TOKENS, build_tokenizer, cli, ensure_built, text_config

BEGIN_OF_TEXT = "<|begin_of_text|>"
NUM_CUSTOM_TOKENS = FIRST_AUDIO_INDEX + FRAME_SIZE * CODEBOOK_SIZE
SNAC_DIR = "snac"


def build_orpheus_tokenizer(out_dir: Path) -> Any:
    from tokenizers.processors import TemplateProcessing

    tokenizer = build_tokenizer(out_dir, [*SPECIAL_TOKENS, BEGIN_OF_TEXT, END_OF_TEXT])
    # Added after training: as the trainer's special tokens they would fill its whole vocabulary and
    # leave no room for merges.
    tokenizer.add_tokens([custom_token(i) for i in range(NUM_CUSTOM_TOKENS)], special_tokens=True)
    bos_id = tokenizer.convert_tokens_to_ids(BEGIN_OF_TEXT)
    # Llama-3's post-processor: encoding with special tokens prepends BOS, as Orpheus' prompt expects.
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{BEGIN_OF_TEXT} $A",
        pair=f"{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT} $B",
        special_tokens=[(BEGIN_OF_TEXT, bos_id)],
    )
    tokenizer.bos_token = BEGIN_OF_TEXT
    tokenizer.eos_token = END_OF_SPEECH
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build(out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    tokenizer = build_orpheus_tokenizer(out_dir)
    config = text_config(tokenizer)
    config.bos_token_id = tokenizer.bos_token_id
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers mis-types its wrapped `to`
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_random_snac(out_dir / SNAC_DIR, SEED)


def ensure_tiny_orpheus_model(out_dir: str | Path) -> Path:
    return ensure_built(out_dir, build)


def main() -> None:
    cli(__doc__, "models/tiny-orpheus", ensure_tiny_orpheus_model)


if __name__ == "__main__":
    main()
