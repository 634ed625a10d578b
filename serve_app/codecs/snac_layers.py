"""SNAC decoder layers that run slowly on a CPU as written (oneDNN, TorchScript), computed another way.

One thread, a 6-frame chunk of the 24 kHz decoder took 129 ms on the AVX-512 kind, of which its Snake
activations took 28 ms, its dilated depthwise convolutions 21 ms and its first upsampling 23 ms; with
the replacements here, 71 ms (quick checks, not committed; on the AVX2-only kind 244-277 against
320-334 ms for 6 frames and 2 of context: docs/benchmarks-notes.md, stop 24). They give the same
results up to float rounding (tests/unit/test_codecs_snac_layers.py).
"""

from __future__ import annotations

import numpy as np
import torch
from snac.layers import Snake1d
from torch import nn

# oneDNN reorders a transposed convolution's weight on every call: 33 ms for the decoder's first,
# 1024 x 512 x 16 (32 MB), on 8 input steps, where a matmul and an overlap-add take 8 ms. Its smaller
# ones are faster in oneDNN and stay.
LARGE_WEIGHT = 4_000_000


def with_faster_layers(model: nn.Module) -> None:
    """Replace `model`'s Snake activations, dilated depthwise `Conv1d`s and large `ConvTranspose1d`s in place."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, Snake1d):
                setattr(parent, name, InPlaceSnake1d(child))
            elif isinstance(child, nn.Conv1d) and is_dilated_depthwise(child):
                setattr(parent, name, ShiftedDepthwiseConv1d(child))
            elif isinstance(child, nn.ConvTranspose1d) and child.weight.numel() >= LARGE_WEIGHT:
                setattr(parent, name, MatmulConvTranspose1d(child))


def is_dilated_depthwise(conv: nn.Conv1d) -> bool:
    depthwise = conv.groups == conv.in_channels == conv.out_channels
    return conv.dilation[0] > 1 and conv.stride[0] == 1 and depthwise and conv.padding_mode == "zeros"


class InPlaceSnake1d(nn.Module):
    """SNAC's Snake activation, x + sin(alpha x)^2 / alpha, computed in one buffer: 0.5 ms where SNAC's
    TorchScript function, which allocates a tensor per operation, took 6.8 (64 channels x 12,288 samples)."""

    def __init__(self, snake: Snake1d) -> None:
        super().__init__()
        self.alpha: torch.Tensor = snake.alpha.detach().clone()  # 1 x channels x 1
        self.inverse: torch.Tensor = (self.alpha + 1e-9).reciprocal()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mul(x, self.alpha)
        # NumPy's float32 sine takes a third of torch's here (0.33 against 0.84-1.24 ms for 786k values,
        # one AVX-512 thread); `y` is new and contiguous, so the array is its memory (and needs no grad:
        # the decoder runs under inference mode).
        values = y.numpy()
        np.sin(values, out=values)
        return y.square_().mul_(self.inverse).add_(x)


class ShiftedDepthwiseConv1d(nn.Module):
    """A dilated depthwise `Conv1d` as one multiply-add per kernel tap over the padded input: 0.6 ms
    where oneDNN took 3.4 (64 channels x 12,288 samples, dilation 3 or 9)."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        assert isinstance(conv.padding, tuple)  # "same"/"valid" strings are not used by SNAC
        bias = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels)
        # Plain tensors, not parameters: the decoder only ever runs on the CPU it was loaded on.
        self.taps: torch.Tensor = conv.weight.detach()[:, 0, :].unsqueeze(-1).clone()  # channels x k x 1
        self.bias: torch.Tensor = bias.detach().unsqueeze(-1).clone()  # channels x 1
        self.dilation, self.padding = conv.dilation[0], conv.padding[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = self.taps.shape[1]
        length = x.shape[-1] + 2 * self.padding - self.dilation * (count - 1)
        padded = nn.functional.pad(x, (self.padding, self.padding))
        out = torch.addcmul(self.bias, padded[..., :length], self.taps[:, 0])
        for tap in range(1, count):
            start = tap * self.dilation
            out.addcmul_(padded[..., start : start + length], self.taps[:, tap])
        return out


class MatmulConvTranspose1d(nn.Module):
    """A `ConvTranspose1d` as one matmul (each input step times the kernel) and an overlap-add (`fold`)."""

    def __init__(self, conv: nn.ConvTranspose1d) -> None:
        super().__init__()
        assert conv.groups == 1 and conv.dilation[0] == 1 and isinstance(conv.padding, tuple)
        assert conv.output_padding[0] <= conv.padding[0]  # else the output would need zeros appended
        channels_in, channels_out, size = conv.weight.shape
        bias = conv.bias if conv.bias is not None else torch.zeros(channels_out)
        # (channels_out * size) x channels_in, so that `columns @ x` gives each step's kernel-wide output.
        self.columns: torch.Tensor = conv.weight.detach().reshape(channels_in, -1).t().contiguous()
        self.bias: torch.Tensor = bias.detach().unsqueeze(-1).clone()
        self.size, self.stride = size, conv.stride[0]
        self.padding, self.output_padding = conv.padding[0], conv.output_padding[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[-1]
        full = (steps - 1) * self.stride + self.size
        added = nn.functional.fold(
            self.columns @ x, output_size=(1, full), kernel_size=(1, self.size), stride=(1, self.stride)
        )[:, :, 0, :]
        end = full - self.padding + self.output_padding
        return added[..., self.padding : end] + self.bias
