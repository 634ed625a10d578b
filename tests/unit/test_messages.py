"""The stage messages pickle as their class and field values, and come back equal."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, field, fields
from typing import Any, cast

import numpy as np
import pytest
from ray import cloudpickle

from serve_app import messages
from serve_app.messages import (
    ChoiceDelta,
    Deadline,
    GenerateRequest,
    GenerationChunk,
    ImagesRequest,
    ProcessedImage,
    ProcessedImages,
    SamplingSpec,
    TokenLogprob,
)

CHUNK = GenerationChunk(
    [ChoiceDelta(0, " a", [7], "stop", 2, [TokenLogprob(" a", -0.5, [32, 97], [(" a", -0.5, [32, 97])])])],
    finished=True,
    engine_ttft_s=0.25,
)
REQUEST = GenerateRequest(
    "cmpl-1-0", [1, 2, 3], SamplingSpec(max_tokens=4, stop=["x"], priority=-1), deadline=Deadline(9.5)
)
IMAGES = ProcessedImages([ProcessedImage(np.zeros((2, 3, 3), np.uint8), "h", 4, cache_hit=False)], elapsed_s=0.1)


@pytest.mark.parametrize("message", [CHUNK, REQUEST, ImagesRequest(["data:,"])])
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_round_trip_is_equal(message: object, dumps: object) -> None:
    assert pickle.loads(dumps(message)) == message  # type: ignore[operator]


def test_reduce_is_class_and_values_in_field_order() -> None:
    cls, values = cast(tuple[Any, Any], REQUEST.__reduce__())  # typed as object's: `str | tuple`
    assert cls is GenerateRequest
    assert values == tuple(getattr(REQUEST, f.name) for f in fields(REQUEST))


def test_single_field_message_reduces_to_a_one_tuple() -> None:
    @messages.message
    class One:
        value: int

    assert One(3).__reduce__() == (One, (3,))


def test_arrays_survive() -> None:
    back = pickle.loads(pickle.dumps(IMAGES))
    assert back.images[0].pixels.shape == (2, 3, 3)
    assert back.images[0].content_hash == "h"


def test_messages_stay_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        CHUNK.finished = False  # type: ignore[misc]


def test_a_field_not_set_by_position_is_refused() -> None:
    with pytest.raises(TypeError, match="positional"):

        @messages.message
        class KeywordOnly:
            value: int
            extra: int = field(default=0, kw_only=True)
