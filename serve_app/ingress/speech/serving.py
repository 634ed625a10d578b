"""`/v1/audio/speech`: the speech request path.

1. Check the model, voice (the first of `tts.voices` when none is asked for), format and input length;
   admit the stream. While `tts.max_streams` are already speaking, up to `tts.max_waiting_streams`
   more wait for one to end (within their deadline); beyond that the answer is 503 with Retry-After
   (refused rather than every admitted stream falling behind real time).
2. Tokenizer stage: the talker's prompt (Orpheus layout: start marker, `voice: text`, end markers).
3. LLM stage: audio-code tokens stream back, exactly as text tokens do.
4. Codes become frames; frames go to the vocoder in chunks: the first small (time to first audio),
   later ones larger, each with a few already-decoded frames of context so chunks join cleanly.
   Credits per stream: at most `tts.max_chunks_in_flight` vocoder calls are outstanding for a stream;
   with none left, that stream stops reading its talker output until its oldest chunk is back and
   sent. A slow vocoder or a slow client slows its own stream only, and what one stream buffers is
   bounded. A client that goes away closes the generator: pending calls are cancelled and the
   talker's request is aborted.
5. Each chunk is encoded as it arrives (`serve_app/audio_formats.py`): streamed, the encoder's output
   is sent at once; otherwise the file is complete after the last chunk. SSE deltas carry the same
   bytes as the raw stream, base64. The first audio chunk is awaited before the response starts, so
   failures are still statuses.
   Past the request's deadline, an SSE stream ends with an error event; a raw audio stream (no way
   to say it in band) is cut without its final chunk, which HTTP clients report as incomplete.
"""

from __future__ import annotations

import asyncio
import base64
import math
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from starlette.responses import Response

from serve_app.audio_formats import RESPONSE_FORMATS, ResponseFormat, open_encoder, supports_rate
from serve_app.codecs.orpheus import FRAME_SIZE, FrameAssembler, OrpheusLayout
from serve_app.config import TtsConfig
from serve_app.errors import BadRequestError, OverloadedError
from serve_app.ingress import sse
from serve_app.ingress.closing_response import ClosingStreamingResponse
from serve_app.ingress.pipeline.clients import VocoderClient
from serve_app.ingress.pipeline.deadline import within
from serve_app.ingress.pipeline.generation import Stream, start_generation
from serve_app.ingress.pipeline.responses import new_request_id, timing_headers
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.slots import Slots
from serve_app.ingress.pipeline.validation import check_model
from serve_app.ingress.speech.protocol import SpeechRequest, VoiceList
from serve_app.messages import AudioChunk, Deadline, SamplingSpec, SpeechPrompt, TokenizeRequest, VocodeRequest

# Frames of a token chunk that has not completed a frame are kept by FrameAssembler; a talker may
# emit a few non-audio tokens, which this margin leaves room for.
_TOKEN_MARGIN = 16


def _speech_model(services: Services, param: str | None) -> tuple[TtsConfig, VocoderClient]:
    tts, vocoder = services.args.tts, services.vocoder
    if tts is None or vocoder is None:
        raise BadRequestError.no_speech(services.args.model.name, param)
    return tts, vocoder


def _speech_config(services: Services, request: SpeechRequest) -> tuple[TtsConfig, VocoderClient, str]:
    """The speech settings, the vocoder and the voice of a valid request."""
    check_model(services, request.model)
    tts, vocoder = _speech_model(services, "model")
    # OpenAI clients always send a voice; one that leaves it out gets the model's first.
    voice = tts.voices[0] if request.voice is None else request.voice
    if voice not in tts.voices:
        raise BadRequestError(f"Unknown voice '{voice}'; this model has {', '.join(tts.voices)}.", param="voice")
    if not supports_rate(request.response_format, tts.sample_rate):
        raise BadRequestError(
            f"response_format {request.response_format} cannot carry this model's {tts.sample_rate} Hz audio; "
            "ask for wav, pcm or flac.",
            param="response_format",
        )
    if len(request.input) > tts.max_input_chars:
        raise BadRequestError(
            f"input is {len(request.input)} characters; the limit is {tts.max_input_chars}.", param="input"
        )
    return tts, vocoder, voice


def list_voices(services: Services) -> VoiceList:
    """`GET /v1/audio/voices`: the voices `/v1/audio/speech` takes; a model without `tts:` has none (400)."""
    tts, _ = _speech_model(services, None)
    return VoiceList(voices=list(tts.voices))


def max_audio_tokens(tts: TtsConfig, text: str, frame_size: int = FRAME_SIZE) -> int:
    seconds = min(tts.max_audio_s, 1.0 + len(text) * tts.audio_s_per_char)
    return math.ceil(seconds * tts.sample_rate / tts.samples_per_frame) * frame_size + _TOKEN_MARGIN


async def create_speech(services: Services, request: SpeechRequest, deadline: Deadline | None = None) -> Response:
    tts, vocoder, voice = _speech_config(services, request)
    layout = await speech_layout(services)
    slots = services.speech_slots
    async with within(deadline, "ingress", services.metrics.rejections):
        admitted = await slots.acquire()
    if not admitted:
        raise OverloadedError(
            f"{slots.held} speech streams are in progress, the most this server keeps real-time, and "
            f"{slots.waiting} are waiting; retry later.",
            code="overloaded",
            reason="max_streams",
        )
    try:
        cap = max_audio_tokens(tts, request.input)
        spec = speech_sampling(tts, cap)
        # Admission weighs the audio cap, not the whole context; the tokenizer cuts it to the room left.
        budget = min(cap, services.args.model.max_model_len)
        tokenize = TokenizeRequest(SpeechPrompt(request.input, voice), add_special_tokens=True, max_tokens=budget)
        stream = await start_generation(
            services, tokenize, lambda room: _capped(spec, room), new_request_id("speech"), deadline=deadline
        )
    except BaseException:
        slots.release()
        raise
    finish = _Finish(audio_chunks(services, vocoder, tts, layout, stream), slots)
    audio = finish.audio
    try:
        first = await anext(audio, None)
    except BaseException:
        await finish()
        raise
    headers = timing_headers(stream.timings) | {"X-Audio-Sample-Rate": str(tts.sample_rate)}
    media_type = RESPONSE_FORMATS[request.response_format]
    if not request.streams():
        try:
            async with aclosing(_encoded(first, audio, request.response_format, tts.sample_rate, whole=True)) as file:
                body = b"".join([piece async for piece in file])
        finally:
            await finish()
        if stream.finish_reason is not None:
            headers["X-Finish-Reason"] = stream.finish_reason  # `length`: cut at the audio cap
        return Response(body, media_type=media_type, headers=headers)
    if request.stream_format == "sse":
        events = sse.encode(_sse_events(first, audio, stream, finish, request.response_format, tts.sample_rate))
        return ClosingStreamingResponse(events, finish, media_type="text/event-stream", headers=headers)
    body_stream = _bytes(first, audio, finish, request.response_format, tts.sample_rate)
    return ClosingStreamingResponse(body_stream, finish, media_type=media_type, headers=headers)


class _Finish:
    """Ends a speech stream once, however it ends: its audio closed (pending vocoder calls cancelled,
    the talker aborted) and its slot given back."""

    def __init__(self, audio: AsyncGenerator[AudioChunk, None], slots: Slots) -> None:
        self.audio, self.slots, self.done = audio, slots, False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await self.audio.aclose()
        finally:
            self.slots.release()


def speech_sampling(tts: TtsConfig, max_tokens: int) -> SamplingSpec:
    """How the talker samples its audio codes (`load.ceiling --sampling speech` measures the same)."""
    return SamplingSpec(max_tokens=max_tokens, temperature=tts.temperature, top_p=tts.top_p,
                        repetition_penalty=tts.repetition_penalty, audio_codes=True)  # fmt: skip


def next_chunk_frames(tts: TtsConfig, sent: int) -> int:
    """Frames in the next audio chunk once `sent` frames went to the vocoder: half of those, at least
    `first_chunk_frames` and at most `chunk_frames` (2, 2, 2, 3, 4, 6, 8, 8, ... for 2 and 8). While a
    player that started at the first chunk plays the audio sent, a talker faster than real time makes
    the next chunk. With 2 frames and then 8 (stop 22), every stream underran by ~0.4 s at a real-time
    factor of 0.63."""
    return min(tts.chunk_frames, max(tts.first_chunk_frames, sent // 2))


def _capped(spec: SamplingSpec, room: int) -> SamplingSpec:
    return replace(spec, max_tokens=min(spec.max_tokens, room))


async def speech_layout(services: Services) -> OrpheusLayout:
    if services.speech_layout is None:
        services.speech_layout = await services.tokenizer.speech_layout()
    if services.speech_layout is None:
        raise BadRequestError.no_speech(services.args.model.name)
    return services.speech_layout


async def audio_chunks(
    services: Services, vocoder: VocoderClient, tts: TtsConfig, layout: OrpheusLayout, stream: Stream
) -> AsyncGenerator[AudioChunk, None]:
    """Step 4: the stream's audio in order, with at most `max_chunks_in_flight` vocoder calls pending."""
    assembler = FrameAssembler(layout)
    ready: list[list[int]] = []  # frames not yet sent to the vocoder
    context: list[list[int]] = []  # the last frames sent, decoded again before the next chunk
    pending: deque[asyncio.Task[AudioChunk]] = deque()
    seconds = services.metrics.stage_seconds.labels("vocoder")
    in_flight = services.metrics.stage_in_flight.labels("vocoder")
    size = tts.first_chunk_frames  # of the next chunk
    sent = 0  # frames sent to the vocoder so far

    async def decode(request: VocodeRequest) -> AudioChunk:
        with in_flight.track_inprogress():
            return await vocoder.decode(request)

    def send(frames: list[list[int]]) -> None:
        nonlocal context, size, sent
        sent += len(frames)
        size = next_chunk_frames(tts, sent)
        request = VocodeRequest([*context, *frames], len(context), stream.deadline)
        pending.append(asyncio.ensure_future(decode(request)))
        context = [*context, *frames][-tts.context_frames :] if tts.context_frames else []

    async def oldest() -> AudioChunk:
        async with within(stream.deadline, "vocoder", services.metrics.rejections):
            chunk = await pending.popleft()
        seconds.observe(chunk.elapsed_s)
        stream.timings.setdefault("vocoder_first_chunk", chunk.elapsed_s)
        return chunk

    try:
        async for generated in stream.chunks():
            for delta in generated.deltas:
                ready += assembler.add(delta.token_ids)
            while len(ready) >= size:
                ready, chunk = ready[size:], ready[:size]
                send(chunk)
                while len(pending) >= tts.max_chunks_in_flight:
                    yield await oldest()
            while pending and pending[0].done():
                yield await oldest()
        if ready:
            send(ready)
        while pending:
            yield await oldest()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await stream.close()


async def _encoded(
    first: AudioChunk | None,
    rest: AsyncGenerator[AudioChunk, None],
    response_format: ResponseFormat,
    sample_rate: int,
    *,
    whole: bool,
) -> AsyncGenerator[bytes, None]:
    """The response's bytes as the encoder gives them, each chunk's as it arrives; some may be empty.
    The encoder is opened on the first read (a streamed body may never be read) and freed on close."""
    with open_encoder(response_format, sample_rate, whole=whole) as encoder:
        if first is not None:
            yield encoder.encode(first.pcm)
        async for chunk in rest:
            yield encoder.encode(chunk.pcm)
        yield encoder.finish()


async def _bytes(
    first: AudioChunk | None,
    rest: AsyncGenerator[AudioChunk, None],
    finish: _Finish,
    response_format: ResponseFormat,
    sample_rate: int,
) -> AsyncIterator[bytes]:
    try:
        async with aclosing(_encoded(first, rest, response_format, sample_rate, whole=False)) as pieces:
            async for piece in pieces:
                if piece:
                    yield piece
    finally:
        await finish()


async def _sse_events(
    first: AudioChunk | None,
    rest: AsyncGenerator[AudioChunk, None],
    stream: Stream,
    finish: _Finish,
    response_format: ResponseFormat,
    sample_rate: int,
) -> AsyncIterator[dict[str, Any]]:
    try:
        async with aclosing(_encoded(first, rest, response_format, sample_rate, whole=False)) as pieces:
            async for piece in pieces:
                if piece:
                    yield {"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}
    finally:
        await finish()
    tokens = {"input_tokens": stream.num_prompt_tokens, "output_tokens": stream.generated_tokens}
    usage = tokens | {"total_tokens": sum(tokens.values())}
    yield sse.Last({"type": "speech.audio.done", "usage": usage, "finish_reason": stream.finish_reason})
