"""The image-chat workload, shared by the bench (`--dataset image`) and locust (`ImageChatUser`).

Request `i` is the text of the word dataset's prompt `i` plus `--images-per-request` images as
base64 data URLs, all made here with Pillow, deterministically from the seed.

Images are not encoded during the run. Encoding a 1024x768 picture takes tens of ms of CPU (PNG
hundreds), which a client on the servers' machine would take from them mid-run. Instead, POOL
pictures are encoded before the run, and image number `n` is picture `n % POOL` with a comment that
names `n` (a JPEG COM segment, a PNG tEXt chunk) spliced in: its own bytes, for a copy's cost.
Distinct bytes are what the caches see: this project's multimodal stage and vLLM 0.32
(`MultiModalHasher`, on the uploaded bytes) key images by a hash of the encoded file. A server that
hashed decoded pixels would see each picture again every POOL images. A request's data URLs are
built with its prompt, before its clock starts (1024x768: ~0.5 ms a JPEG, ~6 ms a 1.5 MB PNG).
"""

from __future__ import annotations

import argparse
import base64
import io
import random
import zlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image, ImageChops

from load.bench.datasets import Prompt, WordDataset, positive_int

# --image-format -> Pillow's format name and the options of a typical export (a phone's JPEG quality).
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {"jpeg": ("JPEG", {"quality": 90}), "png": ("PNG", {})}
# Enough for a variety of content; 16 PNGs of 1024x768 already take ~3 s to encode on 2 cores.
POOL = 16
# Requests that repeat images (--image-repeat) reuse one of this many image sets, so that after the
# first few they hit the server's content-hash cache.
HOT_SETS = 4
# Where the tag goes in a PNG: after the 8-byte signature and the IHDR chunk (4 + 4 + 13 + 4 bytes).
PNG_HEADER_END = 8 + 25
JPEG_APP_MARKERS = range(0xE0, 0xF0)


def picture(seed: int, index: int, size: tuple[int, int]) -> Image.Image:
    """Smooth colour fields (a 4x3 grid of random colours, upscaled bicubic) plus pixel noise: in
    JPEG about the size of a phone photo downscaled to 1024x768 (~200 KB); noise-free gradients would
    compress to a fraction of that and be decoded faster than any real upload."""
    rng = np.random.default_rng([seed, index])
    width, height = size
    smooth = Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)
    noise = Image.fromarray(rng.integers(0, 25, (height, width, 3), dtype=np.uint8))
    return ImageChops.add(smooth, noise, offset=-12)


def tagged(data: bytes, image_format: str, text: bytes) -> bytes:
    """`data` (an encoded JPEG or PNG) with `text` as a comment: other bytes, the same pixels."""
    if image_format == "jpeg":
        pos = 2  # after SOI, and after the APPn segments: JFIF readers expect APP0 right after SOI
        while data[pos] == 0xFF and data[pos + 1] in JPEG_APP_MARKERS:
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        return data[:pos] + b"\xff\xfe" + (2 + len(text)).to_bytes(2, "big") + text + data[pos:]
    body = b"tEXtComment\x00" + text
    chunk = (len(body) - 4).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
    return data[:PNG_HEADER_END] + chunk + data[PNG_HEADER_END:]


class Images:
    """Image number `n` of a run, encoded. Builds the POOL pictures when created (seconds for PNG)."""

    def __init__(self, size: tuple[int, int], image_format: str, seed: int = 0) -> None:
        self.image_format = image_format
        pillow_format, options = FORMATS[image_format]
        self.pictures = []
        for index in range(POOL):
            buffer = io.BytesIO()
            picture(seed, index, size).save(buffer, pillow_format, **options)
            self.pictures.append(buffer.getvalue())

    def encoded(self, n: int) -> bytes:
        return tagged(self.pictures[n % POOL], self.image_format, f"load.bench image {n}".encode())

    def data_url(self, n: int) -> str:
        return f"data:image/{self.image_format};base64,{base64.b64encode(self.encoded(n)).decode('ascii')}"


def image_numbers(index: int, per_request: int, repeat: float, seed: int = 0) -> range:
    """The images of request `index`: with probability `repeat` one of HOT_SETS sets that other
    requests get too, otherwise images of its own (numbered after the hot sets')."""
    rng = random.Random(f"{seed}:{index}:images")
    chosen = rng.randrange(HOT_SETS) if rng.random() < repeat else HOT_SETS + index
    return range(chosen * per_request, (chosen + 1) * per_request)


@dataclass(frozen=True)
class ImageDataset:
    """Prompt `i`: the text of `text.prompt(i)`, with its images as data URLs."""

    text: WordDataset
    images: Images
    per_request: int = 1
    repeat: float = 0.0

    @property
    def input_lens(self) -> tuple[int, ...]:
        """Text tokens only: how many tokens an image becomes depends on the model."""
        return self.text.input_lens

    def prompt(self, index: int) -> Prompt:
        numbers = image_numbers(index, self.per_request, self.repeat, self.text.seed)
        return replace(self.text.prompt(index), images=tuple(self.images.data_url(n) for n in numbers))


def image_size(text: str) -> tuple[int, int]:
    """`--image-size WxH` -> (W, H)."""
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, got {text!r}")
    return int(width), int(height)


def checked_size(text: str) -> str:
    """`--image-size`, checked but kept a string: locust's web UI converts an edited option to the type
    of its value, and a tuple made from a string would be its characters."""
    image_size(text)
    return text


def fraction(text: str) -> float:
    if not 0.0 <= float(text) <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text}")
    return float(text)


def add_options(parser: Any) -> None:
    """The image options, on the bench's command line and on locust's (an argparse parser either way)."""
    parser.add_argument("--images-per-request", type=positive_int, default=1, help="image chat: images per request")
    parser.add_argument(
        "--image-size", type=checked_size, default="1024x768", metavar="WxH", help="image chat: pixels of each image"
    )
    parser.add_argument("--image-format", choices=sorted(FORMATS), default="jpeg", help="image chat: encoding")
    parser.add_argument(
        "--image-repeat", type=fraction, default=0.0,
        help=f"image chat: share of requests that reuse one of {HOT_SETS} image sets (server cache hits); "
        "0: every image distinct",
    )  # fmt: skip


def from_options(opts: Any, text: WordDataset) -> ImageDataset:
    """The image-chat dataset that the options of `add_options` describe, with `text` as the prompts'
    text. Encodes the pictures: seconds for PNG."""
    pictures = Images(image_size(opts.image_size), opts.image_format, text.seed)
    return ImageDataset(text, pictures, opts.images_per_request, opts.image_repeat)
