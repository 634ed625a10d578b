"""Response encodings: a standard reader (Python's `wave`) must accept the WAV we write, and FFmpeg (through
PyAV) must decode every format back to the audio that went in, at its rate and length, streamed or not."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import numpy.typing as npt
import pytest

from serve_app.audio_formats import RESPONSE_FORMATS, ResponseFormat, open_encoder, pcm16, supports_rate, wav_header
from tests.unit.tts_support import LOSSY_SLACK_S, RATE, decode_audio


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
    assert RESPONSE_FORMATS == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
    }


def tone(seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(round(seconds * RATE)) / RATE
    return pcm16(0.4 * np.sin(2 * np.pi * hz * t))


def vocoder_chunks(pcm: bytes) -> list[bytes]:
    """`pcm` cut as the vocoder delivers it: a 2-frame first chunk, then 8 frames of 2048 samples each."""
    first, size = 2 * 2048 * 2, 8 * 2048 * 2
    return [pcm[:first]] + [pcm[i : i + size] for i in range(first, len(pcm), size)]


def peak_hz(samples: npt.NDArray[np.float32], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav"])
@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "whole"])
def test_every_format_decodes_back_to_the_audio(response_format: ResponseFormat, whole: bool) -> None:
    seconds = 1.5
    with open_encoder(response_format, RATE, whole=whole) as encoder:
        pieces = [encoder.encode(chunk) for chunk in vocoder_chunks(tone(seconds))]
        pieces.append(encoder.finish())
    if whole:
        assert not any(pieces[:-1])  # the file comes out at the end, with its complete header
    else:
        assert all(pieces[1:-1])  # streamed: every chunk after the first already yields bytes
    source_rate, decoded_rate, samples = decode_audio(b"".join(pieces))
    assert source_rate == RATE
    assert decoded_rate == (48_000 if response_format == "opus" else RATE)
    duration = len(samples) / decoded_rate
    if response_format in ("flac", "wav", "opus") or (whole and response_format == "mp3"):
        assert duration == pytest.approx(seconds, abs=1e-9)  # Ogg and a whole MP3 record delay and padding
    else:
        assert seconds <= duration <= seconds + LOSSY_SLACK_S
    assert peak_hz(samples, decoded_rate) == pytest.approx(440, abs=2)
    assert np.sqrt(np.mean(samples**2)) == pytest.approx(0.4 / np.sqrt(2), rel=0.1)


def test_flac_and_wav_are_lossless() -> None:
    pcm = tone(0.5)
    for response_format in ("flac", "wav"):
        encoder = open_encoder(response_format, RATE, whole=False)
        data = b"".join([*(encoder.encode(chunk) for chunk in vocoder_chunks(pcm)), encoder.finish()])
        assert pcm16(decode_audio(data)[2]) == pcm


@pytest.mark.parametrize("whole", [False, True])
def test_pcm_is_the_samples_as_they_are(whole: bool) -> None:
    pcm = tone(0.3)
    encoder = open_encoder("pcm", RATE, whole=whole)
    assert b"".join([*(encoder.encode(chunk) for chunk in vocoder_chunks(pcm)), encoder.finish()]) == pcm


def test_streamed_wav_has_one_open_ended_header() -> None:
    encoder = open_encoder("wav", RATE, whole=False)
    first, second = encoder.encode(b"\x01\x00"), encoder.encode(b"\x02\x00")
    assert (first, second, encoder.finish()) == (wav_header(RATE, None) + b"\x01\x00", b"\x02\x00", b"")
    empty = open_encoder("wav", RATE, whole=False)
    assert empty.finish() == wav_header(RATE, None)  # no audio at all is still a WAV file


def test_an_abandoned_stream_closes_without_finishing() -> None:
    with open_encoder("mp3", RATE, whole=False) as encoder:
        assert encoder.encode(tone(0.2))
    encoder.close()  # again: harmless
    with pytest.raises(ValueError):  # a closed encoder takes no more audio
        encoder.encode(tone(0.2))


def test_sample_rates_each_encoder_takes() -> None:
    assert all(supports_rate(f, 24_000) for f in RESPONSE_FORMATS)
    assert not supports_rate("opus", 44_100) and not supports_rate("mp3", 96_000)
    assert supports_rate("flac", 44_100) and supports_rate("wav", 44_100) and supports_rate("pcm", 7)
