"""Audio response encodings of `/v1/audio/speech`: MP3, Opus (in Ogg), AAC (ADTS), FLAC, WAV and raw PCM.

WAV and PCM are written here; the compressed formats go through PyAV, whose wheels bundle FFmpeg with
libmp3lame, libopus and its own AAC and FLAC encoders. Every format is encoded chunk by chunk as the
vocoder delivers audio, so a streamed response leaves as it is made and a whole one pays no long encode
after its last chunk. A streamed response goes to an output that cannot seek back, so its header says
the length is unknown:

- WAV: `wav_header(rate, None)` sets every size to 0xFFFFFFFF, as ffmpeg and vLLM-Omni do, which players
  read as "until the end of the stream".
- MP3 has no Xing/LAME header, so players cannot trim the encoder's delay and padding (some 65 ms).
- FLAC's STREAMINFO has 0 ("unknown") total samples and no MD5.
- Ogg pages hold one 20 ms Opus packet, not the muxer's default 1 s, so no audio is held back (at the
  cost of some 11 kbit/s of page headers).

A whole response is written to a seekable buffer instead, so MP3 and FLAC get their complete headers.
ADTS has no field for the AAC encoder's delay: an AAC response is some 50 ms longer, streamed or not.
"""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import av
import numpy as np
import numpy.typing as npt

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
RESPONSE_FORMATS: dict[ResponseFormat, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # an Ogg Opus file (RFC 7845), which players and browsers take as audio/ogg
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
UNKNOWN_SIZE = 0xFFFFFFFF
_BYTES_PER_SAMPLE = 2


@dataclass(frozen=True)
class _Codec:
    container: str
    encoder: Literal["libmp3lame", "libopus", "aac", "flac"]
    bit_rate: int | None  # bits/s, for mono speech (FFmpeg's defaults vary by encoder); None: lossless


_CODECS: dict[ResponseFormat, _Codec] = {
    "mp3": _Codec("mp3", "libmp3lame", 64_000),
    "opus": _Codec("ogg", "libopus", 32_000),
    "aac": _Codec("adts", "aac", 64_000),
    "flac": _Codec("flac", "flac", None),
}
_OGG_PAGE_US = "20000"  # streaming: one Opus packet per Ogg page


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


def supports_rate(response_format: ResponseFormat, sample_rate: int) -> bool:
    """Whether the format's encoder takes `sample_rate` (Opus: 8 to 48 kHz in 5 steps; MP3: up to 48 kHz)."""
    codec = _CODECS.get(response_format)
    rates = av.Codec(codec.encoder, "w").audio_rates if codec else None
    return rates is None or sample_rate in rates


class AudioEncoder(ABC):
    """One response's audio: 16-bit little-endian mono PCM in, the format's bytes out.

    Streaming, `encode` returns what is ready and `finish` the rest; for a whole file, `encode` returns
    nothing and `finish` the file. Leaving the `with` block frees the encoder, whether the response was
    finished or ended early.
    """

    @abstractmethod
    def encode(self, pcm: bytes) -> bytes: ...

    @abstractmethod
    def finish(self) -> bytes: ...

    def close(self) -> None:
        return None

    def __enter__(self) -> AudioEncoder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def open_encoder(response_format: ResponseFormat, sample_rate: int, *, whole: bool) -> AudioEncoder:
    codec = _CODECS.get(response_format)
    if codec is None:
        return _RawEncoder(sample_rate, wav=response_format == "wav", whole=whole)
    return _FFmpegEncoder(codec, sample_rate, whole=whole)


class _RawEncoder(AudioEncoder):
    """PCM as it is; for WAV behind a header, whose sizes are known only for a whole file."""

    def __init__(self, sample_rate: int, *, wav: bool, whole: bool) -> None:
        self.sample_rate, self.wav, self.whole = sample_rate, wav, whole
        self._header_due = wav and not whole  # streaming: the open-ended header goes first
        self._held: list[bytes] = []

    def encode(self, pcm: bytes) -> bytes:
        if self.whole:
            self._held.append(pcm)
            return b""
        return self._header() + pcm

    def finish(self) -> bytes:
        if not self.whole:
            return self._header()  # a stream with no audio at all is still a WAV file
        pcm = b"".join(self._held)
        return (wav_header(self.sample_rate, len(pcm) // _BYTES_PER_SAMPLE) if self.wav else b"") + pcm

    def _header(self) -> bytes:
        header = wav_header(self.sample_rate, None) if self._header_due else b""
        self._header_due = False
        return header


class _Pipe:
    """The muxer's output when streaming: a file it cannot seek in, emptied after each chunk."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class _FFmpegEncoder(AudioEncoder):
    def __init__(self, codec: _Codec, sample_rate: int, *, whole: bool) -> None:
        self.sample_rate, self.whole = sample_rate, whole
        self._pipe, self._file = _Pipe(), io.BytesIO()
        options = {"page_duration": _OGG_PAGE_US} if codec.container == "ogg" and not whole else {}
        output = self._file if whole else self._pipe
        self._container = av.open(output, mode="w", format=codec.container, options=options)
        self._stream = self._container.add_stream(codec.encoder, rate=sample_rate, layout="mono")
        if codec.bit_rate is not None:
            self._stream.bit_rate = codec.bit_rate
        self._samples = 0  # the next frame's timestamp
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:  # PyAV crashes the process when a closed container is written to
            raise ValueError("the audio encoder is closed")

    def encode(self, pcm: bytes) -> bytes:
        self._check_open()
        count = len(pcm) // _BYTES_PER_SAMPLE
        if count:
            samples = np.frombuffer(pcm, dtype="<i2", count=count).reshape(1, count)
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.sample_rate, self._samples
            self._samples += count
            self._container.mux(self._stream.encode(frame))
        return self._pipe.take()

    def finish(self) -> bytes:
        self._check_open()
        self._container.mux(self._stream.encode(None))  # the samples the encoder still holds
        self.close()
        return self._file.getvalue() if self.whole else self._pipe.take()

    def close(self) -> None:
        self._closed = True
        self._container.close()  # idempotent; unfinished, it drops what the encoder holds
