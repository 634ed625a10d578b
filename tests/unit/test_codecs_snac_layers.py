from __future__ import annotations

from typing import cast

import pytest
import torch
from snac.layers import Snake1d
from torch import nn

from serve_app.codecs.snac_layers import (
    LARGE_WEIGHT,
    InPlaceSnake1d,
    MatmulConvTranspose1d,
    ShiftedDepthwiseConv1d,
    with_faster_layers,
)


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)


def test_in_place_snake_matches_snac() -> None:
    snake = Snake1d(16)
    snake.alpha.data = torch.rand_like(snake.alpha) + 0.5  # SNAC starts at 1; trained ones differ per channel
    x = torch.randn(2, 16, 300)
    with torch.inference_mode():
        expected, got = snake(x), InPlaceSnake1d(snake)(x)
    torch.testing.assert_close(got, expected)
    assert not torch.equal(got, x)


@pytest.mark.parametrize("dilation", [3, 9])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("length", [1, 5, 300])
def test_shifted_depthwise_matches_conv1d(dilation: int, bias: bool, length: int) -> None:
    conv = nn.Conv1d(16, 16, kernel_size=7, dilation=dilation, padding=3 * dilation, groups=16, bias=bias)
    x = torch.randn(2, 16, length)
    with torch.inference_mode():
        expected, got = conv(x), ShiftedDepthwiseConv1d(conv)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(("stride", "size"), [(8, 16), (4, 8), (3, 6)])
@pytest.mark.parametrize("length", [1, 4, 24])
def test_matmul_conv_transpose_matches_conv_transpose1d(stride: int, size: int, length: int) -> None:
    # SNAC's decoder blocks: padding ceil(stride / 2), output padding stride % 2.
    conv = nn.ConvTranspose1d(32, 12, size, stride=stride, padding=(stride + 1) // 2, output_padding=stride % 2)
    x = torch.randn(2, 32, length)
    with torch.inference_mode():
        expected, got = conv(x), MatmulConvTranspose1d(conv)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


def test_only_slow_convolutions_are_replaced() -> None:
    large = nn.ConvTranspose1d(1024, 512, 16, stride=8, padding=4)
    assert large.weight.numel() >= LARGE_WEIGHT
    model = nn.Sequential(
        nn.Conv1d(8, 8, 7, dilation=3, padding=9, groups=8),  # dilated depthwise: replaced
        Snake1d(8),  # replaced
        nn.Conv1d(8, 8, 7, padding=3, groups=8),  # depthwise, no dilation: oneDNN is fast
        nn.Conv1d(8, 8, 7, dilation=3, padding=9),  # dense
        nn.Sequential(nn.ConvTranspose1d(8, 8, 4, stride=2), large),  # small stays, large replaced
    )
    with_faster_layers(model)
    inner = cast(nn.Sequential, model[4])
    kinds = [type(m).__name__ for m in (model[0], model[1], model[2], model[3], inner[0], inner[1])]
    assert kinds == ["ShiftedDepthwiseConv1d", "InPlaceSnake1d", "Conv1d", "Conv1d", "ConvTranspose1d",
                     "MatmulConvTranspose1d"]  # fmt: skip
