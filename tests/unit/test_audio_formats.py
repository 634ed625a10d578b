"""PCM and WAV encodings: a standard reader (Python's `wave`) must accept what we write."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

from serve_app.audio_formats import RESPONSE_FORMATS, pcm16, wav_header


def test_wav_file_opens_with_standard_reader() -> None:
    audio = np.sin(np.linspace(0, 100, 3000, dtype=np.float32)) * 0.5
    data = wav_header(24000, len(audio)) + pcm16(audio)
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getframerate() == 24000
        assert reader.getnchannels() == 1
        assert reader.getsampwidth() == 2
        assert reader.getnframes() == 3000
        assert reader.readframes(3000) == pcm16(audio)


def test_header_is_44_bytes_with_exact_sizes() -> None:
    header = wav_header(24000, 10, channels=2)
    assert len(header) == 44
    riff_size, data_size = struct.unpack_from("<I", header, 4)[0], struct.unpack_from("<I", header, 40)[0]
    assert (riff_size, data_size) == (36 + 40, 40)
    assert struct.unpack_from("<IH", header, 28) == (24000 * 4, 4)  # byte rate, block align


def test_streaming_header_has_unknown_sizes() -> None:
    header = wav_header(24000, None)
    assert len(header) == 44
    assert header[4:8] == b"\xff\xff\xff\xff"
    assert header[40:44] == b"\xff\xff\xff\xff"
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt " and header[36:40] == b"data"
    # A reader still finds the format and reads the samples that follow.
    pcm = pcm16(np.zeros(100, dtype=np.float32))
    with wave.open(io.BytesIO(header + pcm)) as reader:
        assert (reader.getframerate(), reader.getnchannels(), reader.getsampwidth()) == (24000, 1, 2)
        assert reader.readframes(1000) == pcm


def test_pcm16_clips_and_scales() -> None:
    audio = np.array([0.0, 0.5, 1.0, 1.5, -1.0, -3.0, -0.5], dtype=np.float32)
    samples = np.frombuffer(pcm16(audio), dtype="<i2")
    assert samples.tolist() == [0, 16384, 32767, 32767, -32767, -32767, -16384]
    assert len(pcm16(audio)) == 2 * len(audio)


def test_response_formats() -> None:
    assert RESPONSE_FORMATS == {"pcm": "audio/pcm", "wav": "audio/wav"}
