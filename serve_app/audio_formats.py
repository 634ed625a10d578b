"""Audio response encodings of `/v1/audio/speech`: raw 16-bit PCM and WAV.

Both are produced chunk by chunk as the vocoder delivers audio, so the WAV header has to be written
before the length is known: `wav_header(rate, None)` writes the streaming form with every size set to
0xFFFFFFFF, as ffmpeg and vLLM-Omni do, which players read as "until the end of the stream".
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

RESPONSE_FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav"}
UNKNOWN_SIZE = 0xFFFFFFFF
_BYTES_PER_SAMPLE = 2


def pcm16(audio: npt.NDArray[np.floating]) -> bytes:
    """Float audio in [-1, 1] as 16-bit little-endian PCM; samples outside the range are clipped."""
    scaled = np.rint(np.clip(audio, -1.0, 1.0) * 32767.0)
    return scaled.astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None, channels: int = 1) -> bytes:
    """The 44-byte RIFF/WAVE header of 16-bit PCM; `num_samples` per channel, None when unknown."""
    block_align = channels * _BYTES_PER_SAMPLE
    if num_samples is None:
        data_size = riff_size = UNKNOWN_SIZE
    else:
        data_size = num_samples * block_align
        riff_size = 36 + data_size
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,  # fmt chunk size
        1,  # PCM
        channels,
        sample_rate,
        sample_rate * block_align,  # bytes per second
        block_align,
        8 * _BYTES_PER_SAMPLE,
        b"data",
        data_size,
    )
