"""The image-chat workload: generated images, their data URLs, repeats and the chat request they go in."""

from __future__ import annotations

import base64
import io
from collections import Counter

import pytest
from PIL import Image

from load.bench.client import request_body
from load.bench.datasets import WordDataset
from load.bench.images import HOT_SETS, POOL, ImageDataset, Images, image_numbers

SIZE = (64, 48)
WORDS = ("the", "of", "and", "to")


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@pytest.fixture(scope="module", params=["jpeg", "png"])
def images(request: pytest.FixtureRequest) -> Images:
    return Images(SIZE, request.param, seed=1)


def test_images_decode_at_the_requested_size_and_format(images: Images) -> None:
    for n in (0, 1, POOL + 1, 10**6):
        image = decoded(images.encoded(n))
        assert (image.format, image.size, image.mode) == (images.image_format.upper(), SIZE, "RGB")


def test_images_are_deterministic(images: Images) -> None:
    again = Images(SIZE, images.image_format, seed=1)
    assert [again.encoded(n) for n in range(3)] == [images.encoded(n) for n in range(3)]
    other_seed = Images(SIZE, images.image_format, seed=2)
    assert decoded(other_seed.encoded(0)).tobytes() != decoded(images.encoded(0)).tobytes()


def test_every_image_number_has_its_own_bytes(images: Images) -> None:
    encoded = [images.encoded(n) for n in range(3 * POOL)]
    assert len(set(encoded)) == len(encoded)
    # The pixels come from the pool: image n + POOL differs from image n in its comment only.
    assert decoded(encoded[1]).tobytes() == decoded(encoded[1 + POOL]).tobytes()
    assert decoded(encoded[1]).tobytes() != decoded(encoded[2]).tobytes()


def test_data_urls(images: Images) -> None:
    prefix, _, payload = images.data_url(7).partition(",")
    assert prefix == f"data:image/{images.image_format};base64"
    assert base64.b64decode(payload, validate=True) == images.encoded(7)


def test_a_1024x768_jpeg_is_photo_sized() -> None:
    sizes = [len(picture) for picture in Images((1024, 768), "jpeg").pictures]
    assert all(100_000 < size < 400_000 for size in sizes), sizes


@pytest.mark.parametrize("per_request", [1, 3])
def test_without_repeats_every_image_is_distinct(per_request: int) -> None:
    numbers = [n for i in range(500) for n in image_numbers(i, per_request, repeat=0.0)]
    assert len(numbers) == 500 * per_request == len(set(numbers))


@pytest.mark.parametrize("repeat", [0.25, 0.5, 1.0])
def test_repeat_is_the_share_of_requests_with_recurring_images(repeat: float) -> None:
    per_request = 2
    requests = [tuple(image_numbers(i, per_request, repeat, seed=5)) for i in range(2000)]
    hot = [r for r in requests if r[0] < HOT_SETS * per_request]
    assert len(hot) / len(requests) == pytest.approx(repeat, abs=0.03)
    # A repeated request gets one of the few hot sets; every other request has images of its own.
    assert len(set(hot)) == HOT_SETS
    assert max(Counter(r for r in requests if r not in hot).values(), default=1) == 1
    assert all(len(set(r)) == per_request for r in requests)


def test_image_chat_request_body(images: Images) -> None:
    text = WordDataset(WORDS, (5,), output_len=3, seed=2)
    dataset = ImageDataset(text, images, per_request=2)
    prompt = dataset.prompt(4)
    assert (prompt.text, prompt.input_len, prompt.output_len) == (text.prompt(4).text, 5, 3)
    assert dataset.input_lens == (5,)
    assert dataset.prompt(4) == prompt

    body = request_body("chat", "tiny-llava", prompt)
    (message,) = body["messages"]
    assert message["role"] == "user"
    text_part, *image_parts = message["content"]
    assert text_part == {"type": "text", "text": prompt.text}
    assert [part["type"] for part in image_parts] == ["image_url", "image_url"]
    urls = [part["image_url"]["url"] for part in image_parts]
    assert urls == [images.data_url(n) for n in image_numbers(4, 2, 0.0, seed=2)]
    for url in urls:
        assert decoded(base64.b64decode(url.partition(",")[2], validate=True)).size == SIZE
    # Text-only prompts keep the plain string content.
    assert request_body("chat", "m", text.prompt(4))["messages"][0]["content"] == text.prompt(4).text
