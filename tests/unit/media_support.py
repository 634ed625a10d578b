"""Images for the media tests, made with Pillow or written chunk by chunk (no binary fixtures), and a fake
multimodal stage for the ingress's image tests."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image

from serve_app.errors import BadRequestError
from serve_app.messages import ImagesRequest, ProcessedImage, ProcessedImages

TOKENS_PER_IMAGE = 16


def encode(image: Image.Image, image_format: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def blank_bilevel_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of `width` x `height` black pixels, compressed row block by row block.

    Written by hand because making it with Pillow would allocate the whole image: the point of a
    decompression bomb is a small file whose pixels do not fit in memory.
    """
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte, then the packed bits
    compressor = zlib.compressobj(9)
    rows_per_block = max(1, 2**20 // len(row))
    idat = bytearray()
    for start in range(0, height, rows_per_block):
        idat += compressor.compress(row * min(rows_per_block, height - start))
    idat += compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", bytes(idat)) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


class FakeMultimodal:
    """Every URL is an image of TOKENS_PER_IMAGE tokens; a URL seen before is a cache hit."""

    def __init__(self) -> None:
        self.requests: list[ImagesRequest] = []
        self.seen: set[str] = set()

    async def process(self, request: ImagesRequest) -> ProcessedImages:
        self.requests.append(request)
        if any(url.startswith("bad:") for url in request.urls):
            raise BadRequestError("Image 1: not an image", param="messages", code="invalid_image")
        images = []
        for url in request.urls:
            images.append(ProcessedImage(np.zeros((2, 2, 3), np.uint8), url, TOKENS_PER_IMAGE, url in self.seen))
            self.seen.add(url)
        return ProcessedImages(images, 0.002)

    async def check_health(self) -> None:
        return None


def image_message(*urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]
