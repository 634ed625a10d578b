"""The Orpheus token layout: which talker tokens frame the prompt and which carry SNAC codes.

Orpheus (canopylabs/orpheus-3b-0.1-ft) is a Llama whose vocabulary is Llama-3's plus added tokens
`<custom_token_N>`. Each audio token is `<custom_token_{10 + p*4096 + c}>`: code `c` of SNAC at
position `p` of a 7-token frame. Every id is read from the tokenizer's token strings rather than
hard-coded, so the same code serves the real model (offset 128266) and the tiny local one. Pure
Python, so the ingress and the tokenizer stage can use it without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

START_OF_HUMAN = "<custom_token_3>"
END_OF_TEXT = "<|eot_id|>"
END_OF_HUMAN = "<custom_token_4>"
END_OF_SPEECH = "<custom_token_2>"
FIRST_AUDIO_INDEX = 10
CODEBOOK_SIZE = 4096
FRAME_SIZE = 7


def custom_token(index: int) -> str:
    return f"<custom_token_{index}>"


@dataclass(frozen=True, slots=True)
class OrpheusLayout:
    """Token ids of one Orpheus tokenizer.

    The prompt is `start_ids + tokenizer(f"{voice}: {text}") + end_ids` (the text with its BOS), and
    generation stops at `stop_id`.
    """

    audio_offset: int
    start_ids: list[int]
    end_ids: list[int]
    stop_id: int
    codebook_size: int = CODEBOOK_SIZE
    frame_size: int = FRAME_SIZE

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> OrpheusLayout:
        """The layout of a Hugging Face tokenizer; ValueError names every token it lacks."""
        vocab: dict[str, int] = tokenizer.get_vocab()  # built anew on each call: 28k added tokens
        last_audio = custom_token(FIRST_AUDIO_INDEX + FRAME_SIZE * CODEBOOK_SIZE - 1)
        wanted = [START_OF_HUMAN, END_OF_TEXT, END_OF_HUMAN, END_OF_SPEECH, custom_token(FIRST_AUDIO_INDEX), last_audio]
        missing = [token for token in wanted if token not in vocab]
        if missing:
            raise ValueError(f"Not an Orpheus tokenizer: it lacks {', '.join(missing)}.")
        offset = vocab[custom_token(FIRST_AUDIO_INDEX)]
        # `codes` relies on the audio ids being one contiguous range.
        if vocab[last_audio] != offset + FRAME_SIZE * CODEBOOK_SIZE - 1:
            raise ValueError(f"Not an Orpheus tokenizer: its audio tokens are not contiguous from id {offset}.")
        return cls(
            audio_offset=offset,
            start_ids=[vocab[START_OF_HUMAN]],
            end_ids=[vocab[END_OF_TEXT], vocab[END_OF_HUMAN]],
            stop_id=vocab[END_OF_SPEECH],
        )

    @property
    def audio_end(self) -> int:
        """One past the last audio token id."""
        return self.audio_offset + self.frame_size * self.codebook_size

    def audio_token_ids(self) -> list[int]:
        """Every audio token id: vLLM's `allowed_token_ids` (add `stop_id` so generation can end)."""
        return list(range(self.audio_offset, self.audio_end))

    def codes(self, token_ids: Iterable[int]) -> list[int]:
        """The SNAC codes of the audio tokens among `token_ids`, in order; other tokens are dropped.

        The position within the frame is not checked: the code is taken modulo the codebook, so a
        token at the wrong position still decodes. A trained talker never does that; a random one
        restricted to the audio ids does it all the time.
        """
        offset, end, size = self.audio_offset, self.audio_end, self.codebook_size
        return [(t - offset) % size for t in token_ids if offset <= t < end]


class FrameAssembler:
    """Groups a stream of talker tokens into complete codec frames, keeping the partial one between calls."""

    def __init__(self, layout: OrpheusLayout) -> None:
        self._layout = layout
        self._pending: list[int] = []

    def add(self, token_ids: Iterable[int]) -> list[list[int]]:
        """The frames that `token_ids` complete, each `frame_size` codes long."""
        self._pending.extend(self._layout.codes(token_ids))
        size = self._layout.frame_size
        complete = len(self._pending) - len(self._pending) % size
        frames = [self._pending[i : i + size] for i in range(0, complete, size)]
        del self._pending[:complete]
        return frames
