"""serve_app/stages/vocoder.py on the tiny model's random SNAC codec: PCM, request checks, deadlines.

Windows are 1-3 frames: one frame costs tens of milliseconds on a thread.
"""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.codecs.snac import SnacDecoder
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.messages import Deadline, VocodeRequest
from serve_app.stages.vocoder import VocoderStage
from tests.unit.tts_support import decoder_fixture, random_frames, tiny_orpheus_path  # noqa: F401  (the fixture)

SAMPLES_PER_FRAME = 2048


@pytest.fixture(scope="module")
def stage(decoder: SnacDecoder) -> VocoderStage:
    return VocoderStage(decoder)


def test_stage_returns_pcm16(stage: VocoderStage, decoder: SnacDecoder) -> None:
    request = VocodeRequest(random_frames(2, seed=6), context=1)
    chunk = stage.decode_sync(request)
    assert chunk.elapsed_s > 0
    assert len(chunk.pcm) == 2 * SAMPLES_PER_FRAME
    samples = np.frombuffer(chunk.pcm, dtype="<i2")
    [audio] = decoder.decode([request])
    expected = np.rint(np.clip(audio, -1, 1) * 32767)
    np.testing.assert_allclose(samples, expected, atol=1)


@pytest.mark.parametrize(
    ("frames", "context", "message"),
    [
        ([], 0, "needs new frames"),
        (random_frames(2, seed=9), 2, "needs new frames"),
        (random_frames(1, seed=9), -1, "needs new frames"),
        ([[1, 2, 3, 4, 5, 6]], 0, r"frames\[0\] has 6 codes"),
        ([[0] * 7, [0] * 8], 0, r"frames\[1\] has 8 codes"),
        ([[0, 0, 0, 4096, 0, 0, 0]], 0, r"frames\[0\] has a code outside"),
        ([[0, 0, 0, -1, 0, 0, 0]], 0, r"frames\[0\] has a code outside"),
    ],
)
def test_bad_requests_are_400(stage: VocoderStage, frames: list[list[int]], context: int, message: str) -> None:
    with pytest.raises(BadRequestError, match=message) as info:
        stage.decode_sync(VocodeRequest(frames, context))
    assert info.value.status_code == 400
    assert info.value.param == "frames"


async def test_decode_matches_decode_sync(stage: VocoderStage) -> None:
    request = VocodeRequest(random_frames(2, seed=5), context=1)
    assert (await stage.decode(request)).pcm == stage.decode_sync(request).pcm


def test_from_args_checks_the_codec_against_the_config() -> None:
    from serve_app.config import parse_app_args

    model = {"path": str(tiny_orpheus_path()), "max_model_len": 256}
    tts = {"codec": str(tiny_orpheus_path() / "snac"), "voices": ["tara"]}
    VocoderStage.from_args(parse_app_args({"model": model, "tts": tts})).close()
    with pytest.raises(ValueError, match=r"tts\.sample_rate"):
        VocoderStage.from_args(parse_app_args({"model": model, "tts": tts | {"sample_rate": 16_000}}))
    with pytest.raises(ValueError, match="tts"):
        VocoderStage.from_args(parse_app_args({"model": model}))


def test_a_request_past_its_deadline_is_refused(stage: VocoderStage) -> None:
    with pytest.raises(DeadlineExceededError, match="vocoder"):
        stage.decode_sync(VocodeRequest(random_frames(2, seed=5), 0, deadline=Deadline.after(-1)))
