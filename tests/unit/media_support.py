"""Images for the media tests, made with Pillow or written chunk by chunk: no binary fixtures."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

from PIL import Image


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
