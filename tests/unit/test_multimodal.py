"""serve_app/stages/multimodal.py: images in, model-sized RGB arrays and token counts out, cached."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from serve_app.config import MultimodalConfig, parse_app_args
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.media.images import ImageSize
from serve_app.messages import Deadline, ImagesRequest
from serve_app.stages.multimodal import ImageCache, MultimodalStage
from tests.unit.media_support import data_url, encode

SIZE = ImageSize(shortest_edge=56, crop_height=56, crop_width=56)


def photo(colour: tuple[int, int, int], size: tuple[int, int] = (320, 200)) -> str:
    return data_url(encode(Image.new("RGB", size, colour), "JPEG"), "image/jpeg")


def make_stage(**config: object) -> MultimodalStage:
    return MultimodalStage(MultimodalConfig.model_validate(config), SIZE, lambda h, w: h * w // 196)


async def test_images_come_back_at_the_model_size_in_request_order() -> None:
    stage = make_stage()
    result = await stage.process(ImagesRequest([photo((255, 0, 0)), photo((0, 0, 255), (100, 400))]))
    assert [image.pixels.shape for image in result.images] == [(56, 56, 3), (56, 56, 3)]
    assert [image.num_tokens for image in result.images] == [16, 16]
    red, blue = (image.pixels.mean(axis=(0, 1)) for image in result.images)
    assert red[0] > 200 > red[2] and blue[2] > 200 > blue[0]
    assert result.images[0].pixels.dtype == np.uint8
    assert result.elapsed_s > 0
    await stage.close()


async def test_identical_bytes_are_decoded_once_and_share_a_hash() -> None:
    stage = make_stage()
    url = photo((10, 200, 10))
    first = await stage.process(ImagesRequest([url, url]))
    assert [i.cache_hit for i in first.images] == [False, False]
    assert first.images[0].content_hash == first.images[1].content_hash
    assert first.images[0].pixels is first.images[1].pixels
    second = await stage.process(ImagesRequest([url, photo((1, 2, 3))]))
    assert [i.cache_hit for i in second.images] == [True, False]
    assert second.images[0].content_hash == first.images[0].content_hash
    third = await stage.process(ImagesRequest([photo((1, 2, 3)), url]))
    assert [i.cache_hit for i in third.images] == [True, True]  # both kept
    await stage.close()


async def test_cache_off_never_hits() -> None:
    stage = make_stage(cache_entries=0)
    url = photo((9, 9, 9))
    await stage.process(ImagesRequest([url]))
    assert not (await stage.process(ImagesRequest([url]))).images[0].cache_hit
    await stage.close()


def test_cache_evicts_the_least_recently_used() -> None:
    cache = ImageCache(2)
    cache.put("a", (1, 1))
    cache.put("b", (2, 2))
    assert cache.get("a") == (1, 1)
    cache.put("c", (3, 3))
    assert cache.get("b") is None
    assert cache.get("a") == (1, 1) and cache.get("c") == (3, 3)
    assert len(cache) == 2


async def test_too_many_images() -> None:
    stage = make_stage(max_images_per_request=2)
    with pytest.raises(BadRequestError, match="At most 2 images") as info:
        await stage.process(ImagesRequest([photo((1, 1, 1))] * 3))
    assert info.value.code == "too_many_images"
    await stage.close()


async def test_errors_name_the_image() -> None:
    stage = make_stage()
    with pytest.raises(BadRequestError, match=r"^Image 2: ") as info:
        await stage.process(ImagesRequest([photo((1, 1, 1)), "data:image/png;base64,bm90IGFuIGltYWdl"]))
    assert info.value.param == "messages"
    assert info.value.code == "invalid_image"
    await stage.close()


async def test_a_refused_image_cancels_the_other_fetches() -> None:
    class Fetcher:
        cancelled = False

        async def fetch(self, url: str) -> bytes:
            if url == "slow":
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    Fetcher.cancelled = True
                    raise
            raise BadRequestError("refused", param="messages", code="url_not_allowed")

        async def aclose(self) -> None:
            return None

    stage = MultimodalStage(MultimodalConfig(), SIZE, lambda h, w: 1, Fetcher())  # type: ignore[arg-type]
    with pytest.raises(BadRequestError, match=r"^Image 2: refused"):
        await asyncio.wait_for(stage.process(ImagesRequest(["slow", "bad"])), 5)
    await asyncio.sleep(0)  # the cancelled fetch runs to its end
    assert Fetcher.cancelled
    await stage.close()


async def test_refused_url_names_the_image() -> None:
    stage = make_stage()
    with pytest.raises(BadRequestError, match=r"^Image 1: ") as info:
        await stage.process(ImagesRequest(["http://127.0.0.1:9/x.png"]))
    assert info.value.code == "url_not_allowed"
    await stage.close()


async def test_from_args_reads_the_models_processor(tiny_vision_model_path: Path) -> None:
    args = parse_app_args({"model": {"path": str(tiny_vision_model_path), "max_model_len": 256}, "multimodal": {}})
    stage = MultimodalStage.from_args(args)
    result = await stage.process(ImagesRequest([photo((5, 5, 5), (640, 480))]))
    assert result.images[0].pixels.shape == (56, 56, 3)
    assert result.images[0].num_tokens == 16
    await stage.close()


def test_from_args_needs_the_multimodal_block(tiny_vision_model_path: Path) -> None:
    args = parse_app_args({"model": {"path": str(tiny_vision_model_path), "max_model_len": 256}})
    with pytest.raises(ValueError, match="multimodal"):
        MultimodalStage.from_args(args)


def test_a_text_model_is_refused_at_startup(tiny_model_path: Path) -> None:
    args = parse_app_args({"model": {"path": str(tiny_model_path), "max_model_len": 256}, "multimodal": {}})
    with pytest.raises(ValueError, match="not a vision model"):
        MultimodalStage.from_args(args)


async def test_a_request_past_its_deadline_is_refused() -> None:
    with pytest.raises(DeadlineExceededError, match="multimodal"):
        await make_stage().process(ImagesRequest([photo((1, 2, 3))], deadline=Deadline.after(-1)))
