"""serve_app/codecs/snac.py: SNAC decoding on the tiny model's random codec.

Windows are 1-3 frames: one frame costs tens of milliseconds on a thread.
"""

from __future__ import annotations

import numpy as np

from serve_app.codecs.snac import SnacDecoder
from serve_app.messages import VocodeRequest
from tests.unit.tts_support import decoder_fixture, random_frames  # noqa: F401  (the fixture, by its name)

SAMPLES_PER_FRAME = 2048


def test_decoder_shape(decoder: SnacDecoder) -> None:
    assert (decoder.sample_rate, decoder.samples_per_frame, decoder.frame_size) == (24000, SAMPLES_PER_FRAME, 7)
    [audio] = decoder.decode([VocodeRequest(random_frames(2, seed=0), context=0)])
    assert audio.dtype == np.float32
    assert audio.shape == (2 * SAMPLES_PER_FRAME,)
    assert np.abs(audio).max() > 0


def test_context_frames_are_dropped(decoder: SnacDecoder) -> None:
    frames = random_frames(2, seed=1)
    [whole] = decoder.decode([VocodeRequest(frames, context=0)])
    [tail] = decoder.decode([VocodeRequest(frames, context=1)])
    assert tail.shape == (SAMPLES_PER_FRAME,)
    np.testing.assert_allclose(tail, whole[SAMPLES_PER_FRAME:], atol=1e-5)


def test_batch_matches_one_by_one(decoder: SnacDecoder) -> None:
    requests = [
        VocodeRequest(random_frames(2, seed=2), context=1),
        VocodeRequest(random_frames(1, seed=3), context=0),
        VocodeRequest(random_frames(2, seed=4), context=0),
        VocodeRequest(random_frames(3, seed=5), context=2),
    ]
    batched = decoder.decode(requests)
    for request, audio in zip(requests, batched, strict=True):
        [alone] = decoder.decode([request])
        assert audio.shape == ((len(request.frames) - request.context) * SAMPLES_PER_FRAME,)
        np.testing.assert_allclose(audio, alone, atol=1e-5)
