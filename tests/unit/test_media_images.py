"""decode_image, fit_image and parse_data_url on hostile and awkward images, all made in the test."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile

from serve_app.config import MultimodalConfig
from serve_app.errors import BadRequestError
from serve_app.media.images import ImageSize, decode_image, fit_image, parse_data_url
from tests.unit.media_support import blank_bilevel_png, data_url, encode

CONFIG = MultimodalConfig()
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def rejected(data: bytes, config: MultimodalConfig = CONFIG) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        decode_image(data, config)
    return info.value


def near(actual: Any, expected: tuple[int, ...], tolerance: int = 12) -> bool:
    return all(abs(a - e) <= tolerance for a, e in zip(actual, expected, strict=True))


def test_png_decodes_to_rgb() -> None:
    image = decode_image(encode(Image.new("RGB", (7, 5), RED), "PNG"), CONFIG)
    assert (image.mode, image.size, image.getpixel((3, 2))) == ("RGB", (7, 5), RED)


def test_decompression_bomb_is_rejected_from_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = blank_bilevel_png(6000, 6000)  # 36 M pixels, over the default 25 M, in a few KB
    assert len(bomb) < 10_000

    def no_decoding(self: Any) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    error = rejected(bomb)
    assert error.code == "image_too_large"
    assert "36000000 pixels" in error.message


def test_extreme_aspect_ratio_is_refused_before_its_resize_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 M pixels, under the limit, but a 56-pixel shortest edge makes it 56 x 280 M before the crop.
    sliver = blank_bilevel_png(1, 5_000_000)
    assert len(sliver) < 20_000

    def no_decoding(self: Any) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    fit = ImageSize(shortest_edge=56, crop_height=56, crop_width=56)
    with pytest.raises(BadRequestError) as info:
        decode_image(sliver, CONFIG, fit)
    assert info.value.code == "image_too_large"
    assert "56x280000000" in info.value.message
    monkeypatch.undo()
    # The same ratio within the limit is fitted as before: 1 x 1,000 fitted to 5 is 5 x 5,000, then cropped.
    fitted = fit_image(
        decode_image(blank_bilevel_png(1, 1000), CONFIG, ImageSize(shortest_edge=5)),
        ImageSize(shortest_edge=5, crop_height=5, crop_width=5),
    )
    assert fitted.size == (5, 5)


def test_pillows_own_bomb_error_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    error = rejected(encode(Image.new("L", (100, 100)), "PNG"), MultimodalConfig(max_image_pixels=10**8))
    assert error.code == "image_too_large"


def test_pillows_bomb_warning_as_error_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    png = encode(Image.new("L", (40, 40)), "PNG")  # between Pillow's warning and error limits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rejected(png).code == "image_too_large"


def test_too_many_bytes() -> None:
    error = rejected(b"\x89PNG" + b"\x00" * 2000, MultimodalConfig(max_image_bytes=1024))
    assert error.code == "image_too_large"
    assert "2004 bytes" in error.message


def test_truncated_jpeg() -> None:
    noisy = Image.effect_noise((64, 64), 50).convert("RGB")
    jpeg = encode(noisy, "JPEG")
    error = rejected(jpeg[: len(jpeg) // 2])
    assert error.code == "invalid_image"
    assert "truncated or corrupt" in error.message


@pytest.mark.parametrize(
    "payload",
    [
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>',
        b"just some text, not an image\n",
        bytes(range(256)) * 4,
        b"",
    ],
)
def test_non_images_behind_an_image_mime_type(payload: bytes) -> None:
    error = rejected(parse_data_url(data_url(payload, "image/png"), CONFIG))
    assert error.code == "invalid_image"
    assert "not a supported image (PNG, JPEG, WEBP, GIF, BMP)" in error.message


def test_format_outside_config_formats() -> None:
    jpeg = encode(Image.new("RGB", (8, 8), RED), "JPEG")
    error = rejected(jpeg, MultimodalConfig(formats=["PNG"]))
    assert (error.code, "(PNG)" in error.message) == ("invalid_image", True)


def test_cmyk_jpeg_keeps_its_colour() -> None:
    cyan = Image.new("CMYK", (16, 16), (255, 0, 0, 0))
    image = decode_image(encode(cyan, "JPEG", quality=95), CONFIG)
    assert image.mode == "RGB"
    assert near(image.getpixel((8, 8)), (0, 255, 255))


@pytest.mark.parametrize(("orientation", "marker_corner"), [(6, "top_right"), (8, "bottom_left")])
def test_exif_orientation_is_applied(orientation: int, marker_corner: str) -> None:
    stored = Image.new("RGB", (40, 20), WHITE)
    stored.paste(RED, (0, 0, 8, 8))  # top-left as stored
    exif = Image.Exif()
    exif[0x0112] = orientation
    image = decode_image(encode(stored, "JPEG", quality=95, exif=exif), CONFIG)
    assert image.size == (20, 40)
    corners = {"top_right": (16, 3), "bottom_left": (3, 36), "top_left": (3, 3)}
    assert near(image.getpixel(corners[marker_corner]), RED, 40)
    assert near(image.getpixel(corners["top_left"]), WHITE, 40)


def test_alpha_modes_are_composited_on_white() -> None:
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (255, 0, 0, 255))
    la = Image.new("LA", (4, 4), (0, 0))
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([*RED, *BLUE])
    palette.putpixel((0, 0), 0)
    for source, options in ((rgba, {}), (la, {}), (palette, {"transparency": 1})):
        image = decode_image(encode(source, "PNG", **options), CONFIG)
        assert (image.mode, image.getpixel((2, 2))) == ("RGB", WHITE), source.mode
    assert decode_image(encode(rgba, "PNG"), CONFIG).getpixel((0, 0)) == RED


def test_other_modes_convert_to_rgb() -> None:
    grey16 = decode_image(encode(Image.new("I;16", (4, 4), 32768), "PNG"), CONFIG)
    assert grey16.getpixel((0, 0)) == (128, 128, 128)  # scaled, not clipped to white
    bilevel = decode_image(encode(Image.new("1", (4, 4), 1), "BMP"), CONFIG)
    assert bilevel.getpixel((0, 0)) == WHITE
    grey = decode_image(encode(Image.new("L", (4, 4), 77), "PNG"), CONFIG)
    assert grey.getpixel((0, 0)) == (77, 77, 77)


@pytest.mark.parametrize("image_format", ["GIF", "WEBP"])
def test_animated_image_gives_its_first_frame(image_format: str) -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in (RED, BLUE)]
    data = encode(frames[0], image_format, save_all=True, append_images=frames[1:], duration=50, loop=0)
    image = decode_image(data, CONFIG)
    assert near(image.getpixel((4, 4)), RED, 30)


def test_data_url_round_trip_tolerates_whitespace() -> None:
    png = encode(Image.new("RGB", (3, 3), BLUE), "PNG")
    url = data_url(png)
    wrapped = url[:40] + "\n" + url[40:80] + "\r\n " + url[80:]
    assert parse_data_url(wrapped, CONFIG) == png
    assert parse_data_url(data_url(png, "IMAGE/JPEG").replace(";base64", ";BASE64"), CONFIG) == png


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,iVBORw0KGgo!!!", "invalid_base64"),
        ("data:image/png;base64,iVBORw0KGgo", "invalid_base64"),  # bad padding
        ("data:image/png;base64,aVé=", "invalid_base64"),
        ("data:text/plain;base64,aGVsbG8=", "invalid_image_url"),
        ("data:image/png,%89PNG", "invalid_image_url"),
        ("data:image/png;base64", "invalid_image_url"),
        ("data:;base64,aGVsbG8=", "invalid_image_url"),
    ],
)
def test_bad_data_urls(url: str, code: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_data_url(url, CONFIG)
    assert info.value.code == code


def test_oversized_data_url_is_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("payload was decoded")

    monkeypatch.setattr("serve_app.media.images.base64.b64decode", no_decoding)
    config = MultimodalConfig(max_image_bytes=1024)
    with pytest.raises(BadRequestError) as info:
        parse_data_url("data:image/png;base64," + "A" * 1368, config)  # 1026 bytes
    assert info.value.code == "image_too_large"


def halves(width: int, height: int) -> Image.Image:
    image = Image.new("RGB", (width, height), RED)
    image.paste(BLUE, (width // 2, 0, width, height))
    return image


def test_fit_shortest_edge_then_center_crop() -> None:
    image = fit_image(halves(100, 50), ImageSize(shortest_edge=56, crop_height=56, crop_width=56))
    assert image.size == (56, 56)
    assert near(image.getpixel((5, 28)), RED) and near(image.getpixel((50, 28)), BLUE)
    assert fit_image(halves(50, 100), ImageSize(shortest_edge=20)).size == (20, 40)
    assert fit_image(halves(30, 100), ImageSize(shortest_edge=20)).size == (20, 66)  # truncated, as in HF


def test_fit_exact_size_and_crop_padding() -> None:
    assert fit_image(halves(100, 50), ImageSize(height=32, width=48)).size == (48, 32)
    padded = fit_image(Image.new("RGB", (10, 10), WHITE), ImageSize(crop_height=20, crop_width=20))
    assert (padded.size, padded.getpixel((0, 0)), padded.getpixel((10, 10))) == ((20, 20), (0, 0, 0), WHITE)


def test_fit_max_pixels_shrinks_but_never_enlarges() -> None:
    assert fit_image(halves(100, 100), ImageSize(max_pixels=2500)).size == (50, 50)
    small = halves(30, 30)
    assert fit_image(small, ImageSize(max_pixels=2500)) is small
    width, height = fit_image(halves(1000, 70), ImageSize(max_pixels=30001)).size
    assert width * height <= 30001 and abs(width / height - 1000 / 70) < 0.5


def test_image_size_from_hf_clip_processor() -> None:
    from transformers import CLIPImageProcessor

    clip = CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    assert ImageSize.from_hf_image_processor(clip) == ImageSize(
        shortest_edge=56, crop_height=56, crop_width=56, resample=Image.Resampling.BICUBIC
    )
    exact = CLIPImageProcessor(size={"height": 32, "width": 48}, do_center_crop=False)
    assert ImageSize.from_hf_image_processor(exact) == ImageSize(height=32, width=48)


def test_image_size_from_dynamic_and_bare_processors() -> None:
    from transformers import Qwen2VLImageProcessor

    qwen = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    assert ImageSize.from_hf_image_processor(qwen) == ImageSize(max_pixels=28 * 28 * 1280)
    legacy = SimpleNamespace(size={"max_pixels": 4096}, resample=0)
    assert ImageSize.from_hf_image_processor(legacy) == ImageSize(max_pixels=4096, resample=0)
    assert ImageSize.from_hf_image_processor(object()) == ImageSize()


def test_jpeg_is_decoded_at_a_reduced_scale_when_fitting() -> None:
    photo = Image.linear_gradient("L").resize((1024, 768)).convert("RGB")
    data = encode(photo, "JPEG")
    fit = ImageSize(shortest_edge=56, crop_height=56, crop_width=56)
    drafted = decode_image(data, CONFIG, fit)
    assert drafted.size == (128, 96)  # 1/8 scale: the smallest that keeps the short side >= 56
    full = np.asarray(fit_image(decode_image(data, CONFIG), fit), dtype=np.int16)
    assert np.abs(np.asarray(fit_image(drafted, fit), dtype=np.int16) - full).mean() < 2


def test_draft_keeps_the_short_side_for_rotated_jpegs() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    data = encode(Image.new("RGB", (1024, 768), (10, 20, 30)), "JPEG", exif=exif)
    image = decode_image(data, CONFIG, ImageSize(shortest_edge=200, crop_height=200, crop_width=200))
    assert min(image.size) >= 200 and image.height > image.width
