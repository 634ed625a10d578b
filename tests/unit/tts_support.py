"""Shared helpers of the text-to-speech unit tests: the tiny Orpheus model and random codec frames."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

from serve_app.codecs.orpheus import CODEBOOK_SIZE, FRAME_SIZE
from serve_app.models.tiny_orpheus import ensure_tiny_orpheus_model

REPO = Path(__file__).resolve().parents[2]


@cache
def tiny_orpheus_path() -> Path:
    """The tiny Orpheus model, built on first use (about 10 s) into the path the app's config names."""
    return ensure_tiny_orpheus_model(REPO / "models" / "tiny-orpheus")


def random_frames(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CODEBOOK_SIZE) for _ in range(FRAME_SIZE)] for _ in range(count)]
