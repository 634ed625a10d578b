"""Decoding and resizing client images, which are untrusted bytes.

Every image comes from a client, so a bad one must end as a 400 naming the problem, never as a 500, a
hang or an out-of-memory replica: sizes are bounded before anything is decoded, the pixel count is
checked from the header before any pixel is allocated (decompression bombs), and truncated files fail
instead of being padded with grey. The functions are synchronous: callers run them in worker threads.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

from serve_app.config import MultimodalConfig
from serve_app.errors import BadRequestError

# Pillow raises these for broken image data, whichever plugin finds the problem.
_CORRUPT_ERRORS = (OSError, SyntaxError, ValueError, EOFError)
_BASE64_WHITESPACE = str.maketrans("", "", " \t\r\n\f\v")
_WHITE = (255, 255, 255, 255)


def decode_image(data: bytes, config: MultimodalConfig, fit: ImageSize | None = None) -> Image.Image:
    """A fully loaded RGB image from encoded bytes, or BadRequestError saying why not.

    With `fit`, a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that still leaves it at
    least as large as `fit_image` will make it: a phone photo fitted to a few hundred pixels decodes
    several times faster, and `fit_image` then resizes from a smaller image. An image whose resize for
    `fit` would exceed `max_image_pixels` is refused before it is decoded.
    """
    if len(data) > config.max_image_bytes:
        raise BadRequestError(
            f"The image is {len(data)} bytes, larger than the limit of {config.max_image_bytes} bytes.",
            code="image_too_large",
        )
    try:
        # Pillow checks its own pixel limit (Image.MAX_IMAGE_PIXELS) inside open() and load(): over it a
        # warning, which is an exception where warnings are errors, over twice it an error. Both are the
        # same client mistake as going over our limit, so both become the same 400.
        with Image.open(io.BytesIO(data), formats=tuple(config.formats)) as opened:
            _check_pixels(opened.size, config)
            target = None if fit is None else _resize_target(*opened.size, fit)
            if fit is not None and target is not None:
                _check_fitted_pixels(opened.size, target, config)
                if opened.format == "JPEG":
                    # Square: EXIF orientation may still swap width and height. A shortest-edge fit only
                    # needs the shorter side, whichever it is, to stay at least that edge.
                    side = fit.shortest_edge or max(target)
                    side = max(side, fit.crop_width or 0, fit.crop_height or 0)
                    opened.draft("RGB", (side, side))
            # Frames after the first of an animated GIF/WEBP are never read: load() decodes the first.
            opened.load()
            _check_pixels(opened.size, config)
            return _to_rgb(ImageOps.exif_transpose(opened))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadRequestError(f"The image is too large to decode: {exc}", code="image_too_large") from exc
    except UnidentifiedImageError as exc:
        raise BadRequestError(
            f"The image data is not a supported image ({', '.join(config.formats)}).", code="invalid_image"
        ) from exc
    except _CORRUPT_ERRORS as exc:
        raise BadRequestError(f"The image is truncated or corrupt: {exc}", code="invalid_image") from exc


def _check_pixels(size: tuple[int, int], config: MultimodalConfig) -> None:
    width, height = size
    if width * height > config.max_image_pixels:
        raise BadRequestError(
            f"The image is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{config.max_image_pixels} pixels.",
            code="image_too_large",
        )


def _check_fitted_pixels(size: tuple[int, int], target: tuple[int, int], config: MultimodalConfig) -> None:
    """The resize before the crop is as large as the aspect ratio makes it: a 1 x 5,000,000 image (10 KB as
    a PNG) fitted to a 336-pixel shortest edge would be 336 x 1.68e9 pixels, allocated before any crop."""
    width, height = target
    if width * height > config.max_image_pixels:
        raise BadRequestError(
            f"The image is {size[0]}x{size[1]}; fitting it to the model's image size would resize it to "
            f"{width}x{height} = {width * height} pixels, more than the limit of {config.max_image_pixels} "
            "pixels.",
            code="image_too_large",
        )


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.has_transparency_data:
        # Models see RGB; transparent areas become white, as a browser shows them, not black as convert() does.
        background = Image.new("RGBA", image.size, _WHITE)
        background.alpha_composite(image.convert("RGBA"))
        return background.convert("RGB")
    if image.mode.startswith("I;16"):
        # Pillow clips 16-bit values into 8 bits on convert(); scale them instead so mid-grey stays mid-grey.
        return image.convert("I").point(lambda value: value / 256).convert("RGB")
    return image.convert("RGB")


@dataclass(frozen=True)
class ImageSize:
    """The size a model's image processor wants, in the terms of Hugging Face image processors.

    The resize step is `shortest_edge` (keep aspect, shorter side to it), else `height` and `width`
    (exactly), else `max_pixels` (keep aspect, shrink only, for processors with a dynamic resolution);
    then a center crop to `crop_height` x `crop_width` when set.
    """

    shortest_edge: int | None = None
    height: int | None = None
    width: int | None = None
    crop_height: int | None = None
    crop_width: int | None = None
    max_pixels: int | None = None
    resample: int = Image.Resampling.BICUBIC

    @classmethod
    def from_hf_image_processor(cls, processor: Any) -> ImageSize:
        """The size of a `transformers` image processor, read from its attributes; missing ones are None."""
        resample = getattr(processor, "resample", None)
        resample = Image.Resampling.BICUBIC if resample is None else int(resample)
        crop = getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", True) else None
        crop_height, crop_width = _size_field(crop, "height"), _size_field(crop, "width")
        if not getattr(processor, "do_resize", True):
            return cls(crop_height=crop_height, crop_width=crop_width, resample=resample)
        size = getattr(processor, "size", None)
        max_pixels = getattr(processor, "max_pixels", None) or _size_field(size, "max_pixels")
        if max_pixels is None and hasattr(processor, "merge_size"):
            # Qwen2-VL-style processors keep their pixel budget in size["longest_edge"] and the minimum in
            # size["shortest_edge"]: pixel counts, not edges, so they must not be read as edge lengths.
            max_pixels = _size_field(size, "longest_edge")
        if max_pixels is not None:
            return cls(max_pixels=int(max_pixels), crop_height=crop_height, crop_width=crop_width, resample=resample)
        return cls(
            shortest_edge=_size_field(size, "shortest_edge"),
            height=_size_field(size, "height"),
            width=_size_field(size, "width"),
            crop_height=crop_height,
            crop_width=crop_width,
            resample=resample,
        )


def _size_field(size: Any, key: str) -> int | None:
    # Processors hold sizes as dicts (transformers 4) or SizeDicts (transformers 5); both have get().
    getter = getattr(size, "get", None)
    value = getter(key) if getter is not None else None
    return None if value is None else int(value)


def fit_image(image: Image.Image, size: ImageSize) -> Image.Image:
    """`image` resized and center-cropped to `size`, the way the model's own image processor would."""
    target = _resize_target(image.width, image.height, size)
    if target is not None and target != image.size:
        image = image.resize(target, resample=size.resample)
    crop_width, crop_height = size.crop_width or image.width, size.crop_height or image.height
    if (crop_width, crop_height) != image.size:
        # Like Hugging Face's center_crop, an image smaller than the crop is padded with black: crop()
        # fills the area outside the image with zeros.
        left, top = (image.width - crop_width) // 2, (image.height - crop_height) // 2
        image = image.crop((left, top, left + crop_width, top + crop_height))
    return image


def _resize_target(width: int, height: int, size: ImageSize) -> tuple[int, int] | None:
    if size.shortest_edge:
        # Truncation, not rounding, of the long side: Hugging Face's get_resize_output_image_size does the same.
        if width <= height:
            return size.shortest_edge, int(size.shortest_edge * height / width)
        return int(size.shortest_edge * width / height), size.shortest_edge
    if size.height and size.width:
        return size.width, size.height
    if size.max_pixels and width * height > size.max_pixels:
        scale = math.sqrt(size.max_pixels / (width * height))
        new_width, new_height = max(1, int(width * scale)), max(1, int(height * scale))
        # Float rounding in sqrt can leave the product one row or column over the budget.
        while new_width * new_height > size.max_pixels:
            if new_width >= new_height:
                new_width -= 1
            else:
                new_height -= 1
        return new_width, new_height
    return None


def parse_data_url(url: str, config: MultimodalConfig) -> bytes:
    """The bytes of a `data:image/...;base64,...` URL; the MIME type is not trusted, decode_image sniffs."""
    header, comma, payload = url.partition(",")
    params = header[len("data:") :].split(";") if header[:5].lower() == "data:" else []
    if not comma or len(params) < 2 or params[-1].strip().lower() != "base64":
        raise BadRequestError(
            "An image data URL must be `data:image/<format>;base64,<data>`.", code="invalid_image_url"
        )
    if not params[0].strip().lower().startswith("image/"):
        raise BadRequestError(
            f"The data URL has MIME type {params[0].strip()[:64]!r}, not an image type.", code="invalid_image_url"
        )
    payload = payload.translate(_BASE64_WHITESPACE)
    # Bounded before decoding: base64 decodes 4 characters to 3 bytes, less the `=` padding.
    decoded_size = len(payload) * 3 // 4 - payload[-2:].count("=")
    if decoded_size > config.max_image_bytes:
        raise BadRequestError(
            f"The image is {decoded_size} bytes, larger than the limit of {config.max_image_bytes} bytes.",
            code="image_too_large",
        )
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError as exc:  # binascii.Error, and non-ASCII characters
        raise BadRequestError(f"The image data URL is not valid base64: {exc}", code="invalid_base64") from exc
