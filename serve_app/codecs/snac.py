"""SNAC decoding: Orpheus frames of 7 codes to 24 kHz audio, for the vocoder stage.

A frame [a0..a6] holds SNAC's three codebook levels at their three time rates: level 0 gets [a0],
level 1 [a1, a4], level 2 [a2, a3, a5, a6]; one frame is 2048 samples. The decoder is convolutional
with a receptive field wider than a frame, so each request carries some already-decoded context
frames that are decoded again and cut off, which joins consecutive chunks without clicks.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from serve_app.codecs.orpheus import FRAME_SIZE
from serve_app.messages import VocodeRequest

# The 24 kHz SNAC that Orpheus decodes with (hubertsiuzdak/snac_24khz).
SNAC_24KHZ_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
# Frame positions of each level's codes, in time order.
LEVEL_POSITIONS = ([0], [1, 4], [2, 3, 5, 6])

Audio = npt.NDArray[np.float32]


class CodecDecoder(Protocol):
    """Turns codec frames into mono float audio in [-1, 1] (louder samples are clipped later)."""

    sample_rate: int
    samples_per_frame: int
    frame_size: int
    codebook_size: int

    def decode(self, batch: list[VocodeRequest]) -> list[Audio]:
        """The audio of each request's new frames only: its `context` frames' samples are dropped."""
        ...


class SnacDecoder:
    """`CodecDecoder` for SNAC 24 kHz, loaded from a local directory (`config.json` + `pytorch_model.bin`)."""

    frame_size = FRAME_SIZE

    def __init__(self, path: str, threads: int = 1) -> None:
        import torch
        from snac import SNAC
        from torch.nn.utils import parametrize

        from serve_app.codecs.snac_layers import with_faster_layers

        # The thread count is per process and torch defaults to every core of the machine: replicas
        # sharing a node would oversubscribe it. Small convolutions scale poorly across threads, so
        # throughput comes from more replicas, each with the few CPUs Ray reserved for it.
        torch.set_num_threads(threads)
        model = SNAC.from_pretrained(path).eval()
        # Weight norm recomputes every weight on each forward: about 25 ms a call on one thread, as
        # much as decoding a whole frame. Folding it once gives the same weights.
        for module in model.modules():
            if parametrize.is_parametrized(module):
                for name in list(module.parametrizations.keys()):
                    parametrize.remove_parametrizations(module, name)
        with_faster_layers(model)
        self._model = model
        self.sample_rate = int(model.sampling_rate)
        self.codebook_size = int(model.codebook_size)
        # Samples per level-0 code: the hop length times level 0's stride.
        self.samples_per_frame = int(model.hop_length) * int(model.vq_strides[0])

    def decode(self, batch: list[VocodeRequest]) -> list[Audio]:
        # Requests of one length share a tensor; padding others to it would change their audio.
        by_length: dict[int, list[int]] = defaultdict(list)
        for index, request in enumerate(batch):
            by_length[len(request.frames)].append(index)
        out: dict[int, Audio] = {}
        for indices in by_length.values():
            audio = self._decode_frames([batch[i].frames for i in indices])
            for row, i in zip(audio, indices, strict=True):
                out[i] = row[batch[i].context * self.samples_per_frame :]
        return [out[i] for i in range(len(batch))]

    def _decode_frames(self, streams: list[list[list[int]]]) -> Audio:
        """Audio of equally long frame lists, one row each."""
        import torch

        frames = torch.tensor(streams, dtype=torch.long)  # batch x frames x 7
        levels = [frames[:, :, positions].reshape(len(streams), -1) for positions in LEVEL_POSITIONS]
        # Decoding runs in the deployment's worker thread, and inference mode is per thread.
        with torch.inference_mode():
            audio = self._model.decode(levels)  # batch x 1 x samples
        result: Audio = audio[:, 0, :].numpy().astype(np.float32, copy=False)
        return result


def save_random_snac(out_dir: Path, seed: int) -> None:
    """A seeded random-init 24 kHz SNAC in the layout `SNAC.from_pretrained(out_dir)` reads.

    The noise blocks' gains are zeroed: random ones add noise as loud as the signal, different on
    every call, so no two decodes (or a batch and its requests decoded one by one) would agree.
    """
    import torch
    from snac import SNAC
    from snac.layers import NoiseBlock

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = SNAC(**SNAC_24KHZ_CONFIG)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, NoiseBlock):
                module.linear.parametrizations.weight.original0.zero_()
    (out_dir / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG, indent=2) + "\n")
    torch.save(model.state_dict(), out_dir / "pytorch_model.bin")
