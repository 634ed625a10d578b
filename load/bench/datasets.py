"""Prompts built locally, with an exact number of input tokens, for random and long-context workloads
(and for the text of image-chat requests, see `images.py`).

A prompt is a sequence of words that the target's tokenizer encodes as one token each when preceded
by a space. Byte-level BPE tokenizers (GPT-2, Llama 3, this project's tiny model) never merge across
such a pre-token boundary, so N words are exactly N tokens: no tokenizer is needed on the client,
only one `/tokenize` call per candidate word at startup. Requests ask for exactly `output_len`
tokens with `ignore_eos`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "that", "with", "on", "as", "be", "this", "by", "it", "an",
    "are", "from", "or", "at", "not", "if", "return", "self", "value", "data", "file", "name", "time", "list",
    "code", "type", "error", "line", "first", "other", "which", "when", "each", "used", "more", "can", "all",
    "new", "may", "any", "will", "only", "one", "two", "use", "set", "get", "such", "its", "has", "must",
    "also", "into", "test", "case", "should", "result", "string", "object", "default",
)  # fmt: skip
# Fewer distinct words would make prompts repeat whole prefix-cache blocks between requests.
MIN_WORDS = 16
# Room left in a near-limit prompt for the chat template's tokens (Llama 3's header is ~30).
TEMPLATE_MARGIN = 64
# Default --input-len: text prompts, and the short question that goes with the images of image chat.
TEXT_INPUT_LEN = 256
IMAGE_TEXT_LEN = 32


@dataclass(frozen=True)
class Prompt:
    text: str
    input_len: int
    output_len: int
    images: tuple[str, ...] = ()  # image URLs (data URLs), sent after the text in a chat message
    voice: str | None = None  # speech: the voice that speaks the text
    priority: int = 0  # vLLM's request priority (lower first), sent when not 0


class Dataset(Protocol):
    """What the runner sends: prompt `i` is the same for every target."""

    @property
    def input_lens(self) -> tuple[int, ...]: ...

    def prompt(self, index: int) -> Prompt: ...


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int | None


def positive_int(text: str) -> int:
    """An argparse type, for the bench's options and locust's."""
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return int(text)


# What a dataset needs of a model, as the graph's `/v1/models` lists it in each card's `capabilities`.
CAPABILITY = {"image": "vision", "image chat": "vision", "tts": "speech", "speech": "speech"}


def fetch_model(client: httpx.Client, base_url: str, needs: str | None = None) -> ModelInfo:
    """The served model, as `GET /v1/models` reports it: with several behind one base URL, the first whose
    `capabilities` include `needs` (vision, speech; servers that list none: the first model), else the first."""
    response = client.get(f"{base_url}/v1/models")
    response.raise_for_status()
    cards = response.json()["data"]
    able = [c for c in cards if needs is not None and needs in c.get("capabilities", ())]
    card = able[0] if able else cards[0]
    return ModelInfo(str(card["id"]), card.get("max_model_len"))


def single_token_words(client: httpx.Client, base_url: str, model: str, words: Sequence[str] = WORDS) -> list[str]:
    """The words that the target's tokenizer encodes as exactly one token after a space."""

    def count(text: str) -> int:
        response = client.post(
            f"{base_url}/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False}
        )
        response.raise_for_status()
        return int(response.json()["count"])

    return keep_single_tokens(count, model, words)


def keep_single_tokens(count: Callable[[str], int], model: str, words: Sequence[str] = WORDS) -> list[str]:
    """The words that `count` (a server's `/tokenize`, or a tokenizer in this process) says are one token
    after a space, without special tokens."""
    kept = [word for word in words if count(" " + word) == 1]
    if len(kept) < MIN_WORDS:
        raise RuntimeError(f"only {len(kept)} of {len(words)} words are single tokens for {model}; need {MIN_WORDS}")
    return kept


@dataclass(frozen=True)
class WordDataset:
    """Prompt `i` has `input_lens[i % len(input_lens)]` tokens; the same `i` always gives the same prompt."""

    words: tuple[str, ...]
    input_lens: tuple[int, ...]
    output_len: int
    seed: int = 0
    priority: int = 0

    def prompt(self, index: int) -> Prompt:
        length = self.input_lens[index % len(self.input_lens)]
        rng = random.Random(f"{self.seed}:{index}")
        text = "".join(" " + rng.choice(self.words) for _ in range(length))
        return Prompt(text, length, self.output_len, priority=self.priority)


def long_input_lens(max_model_len: int, output_len: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Input lengths at `fractions` of the context: below 1 they still fit with the output and template
    (the longest prompt the server must accept), from 1 on they exceed it (tokenized, then rejected)."""
    fit = max_model_len - output_len - TEMPLATE_MARGIN
    if fit < 1:
        raise ValueError(f"output_len {output_len} leaves no room for a prompt in a {max_model_len}-token context")
    return tuple(min(round(f * max_model_len), fit) if f < 1 else round(f * max_model_len) for f in fractions)
