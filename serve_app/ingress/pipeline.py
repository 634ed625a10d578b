"""The request path shared by chat and text completions.

1. Check the model name and the request's limits (n, logprobs) against the config.
2. Multimodal stage (one unary hop, only for requests with images): fetch, decode, resize.
3. Admission by work, when configured (`work_admission.py`): the request was weighed on an estimate
   of its prompt as it arrived (`early_admission.py`, before parsing) and refused at once if the
   engine is too far behind; then the tokenizer stage (one
   unary hop): render, tokenize, truncate, check the context length; the weight becomes exact.
4. LLM stage (one streaming hop): token ids in, merged output deltas out. Tokens travel
   llm -> ingress directly, so a streamed token pays one hop, never one per stage.
5. The first chunk is awaited before any byte is sent, so an engine rejection or backpressure
   still becomes a proper HTTP status; later chunks stream as they come.
6. The endpoint module formats the chunks as an OpenAI response or SSE events.

Every wait on a stage is bounded by the request's deadline (`deadline.py`), which the messages also
carry to the stages, and counted in the per-stage in-flight gauge.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.errors import BadRequestError, DeadlineExceededError, EngineDeadError, NotFoundError
from serve_app.ingress.clients import LLMClient, MultimodalClient, TokenizerClient, VocoderClient
from serve_app.ingress.deadline import Deadline, deadline_at, within
from serve_app.ingress.early_admission import budget, take_early_ticket
from serve_app.ingress.health import HealthMonitor
from serve_app.ingress.inline_tokenizer import prompt_chars
from serve_app.ingress.metrics import IngressMetrics
from serve_app.ingress.protocol import SamplingRequest
from serve_app.ingress.slots import Slots
from serve_app.ingress.work_admission import WorkGate, WorkTicket
from serve_app.messages import (
    ChatPrompt,
    ChoiceDelta,
    GenerateRequest,
    GenerationChunk,
    ImagesRequest,
    ProcessedImage,
    SamplingSpec,
    TextPrompt,
    TokenizeRequest,
    TokenLogprob,
)


@dataclass
class Services:
    """What the ingress needs: the config, the stages and its own metrics and health."""

    args: AppArgs
    tokenizer: TokenizerClient
    llm: LLMClient
    metrics: IngressMetrics
    health: HealthMonitor
    # None: the model takes text only.
    multimodal: MultimodalClient | None = None
    # None: the model does not speak.
    vocoder: VocoderClient | None = None
    # The talker's token layout, asked of the tokenizer stage at the first speech request.
    speech_layout: OrpheusLayout | None = None
    # Stages this process owns (in-process stages only; deployments clean up after themselves).
    closers: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)
    # Speech streams of this replica: `tts.max_streams` speaking, `tts.max_waiting_streams` waiting.
    speech_slots: Slots = field(init=False)
    # Admission by work (`admission.prefill_tokens_per_s`/`decode_tokens_per_s`); None: by count only.
    work: WorkGate | None = field(init=False)

    def __post_init__(self) -> None:
        tts = self.args.tts
        self.speech_slots = Slots(tts.max_streams, tts.max_waiting_streams) if tts else Slots(0, 0)
        admission = self.args.admission
        self.work = None
        if admission.prefill_tokens_per_s is not None and admission.decode_tokens_per_s is not None:
            self.work = WorkGate(admission.prefill_tokens_per_s, admission.decode_tokens_per_s, admission.max_wait_s)

    @classmethod
    def create(
        cls,
        args: AppArgs,
        tokenizer: TokenizerClient,
        llm: LLMClient,
        multimodal: MultimodalClient | None = None,
        vocoder: VocoderClient | None = None,
    ) -> Services:
        checks = {"tokenizer": tokenizer.check_health, "llm": llm.check_health}
        for name, stage in (("multimodal", multimodal), ("vocoder", vocoder)):
            if stage is not None:
                checks[name] = stage.check_health
        monitor = HealthMonitor(checks, args.health.poll_interval_s, args.health.timeout_s)
        return cls(args, tokenizer, llm, IngressMetrics(), monitor, multimodal, vocoder)

    async def close(self) -> None:
        await self.health.stop()
        for close in reversed(self.closers):
            result = close()
            if result is not None:
                await result


@dataclass
class Stream:
    """A started generation: its first chunk (already received) and the rest."""

    request_id: str
    prompt_token_ids: list[int]
    num_prompt_tokens: int
    first: GenerationChunk
    rest: AsyncIterator[GenerationChunk]
    metrics: IngressMetrics
    timings: dict[str, float] = field(default_factory=dict)
    generated_tokens: int = 0
    deadline: Deadline | None = None

    async def chunks(self) -> AsyncIterator[GenerationChunk]:
        generated = self.metrics.tokens.labels("generated")
        chunk = self.first
        while True:
            count = sum(len(d.token_ids) for d in chunk.deltas)
            self.generated_tokens += count
            generated.inc(count)
            yield chunk
            try:
                async with within(self.deadline, "llm", self.metrics.rejections):
                    chunk = await anext(self.rest)
            except StopAsyncIteration:
                return

    async def close(self) -> None:
        """Stops the generation now (the engine aborts it) rather than when the generator is collected."""
        close = getattr(self.rest, "aclose", None)
        if close is not None:
            await close()


def check_model(services: Services, requested: str | None) -> str:
    name = services.args.model.name
    if requested is not None and requested != name:
        raise NotFoundError(f"The model `{requested}` does not exist.", param="model", code="model_not_found")
    return name


def check_limits(services: Services, request: SamplingRequest, logprobs: int | None) -> None:
    limits = services.args.limits
    if request.n > limits.max_n:
        raise BadRequestError(f"n must be at most {limits.max_n}, got {request.n}.", param="n")
    if logprobs is not None and logprobs > limits.max_logprobs:
        raise BadRequestError(f"logprobs must be at most {limits.max_logprobs}, got {logprobs}.", param="logprobs")
    if limits.max_tokens is not None and request.max_tokens is not None and request.max_tokens > limits.max_tokens:
        raise BadRequestError(
            f"max_tokens must be at most {limits.max_tokens}, got {request.max_tokens}.", param="max_tokens"
        )


async def process_images(
    services: Services, urls: list[str], deadline: Deadline | None = None
) -> tuple[list[ProcessedImage], dict[str, float]]:
    """Step 2: the images of one request, with the stage's time."""
    if not urls:
        return [], {}
    if services.multimodal is None:
        raise BadRequestError(
            f"The model `{services.args.model.name}` does not support image inputs.",
            param="messages",
            code="model_not_multimodal",
        )
    start = time.perf_counter()
    with services.metrics.stage_in_flight.labels("multimodal").track_inprogress():
        async with within(deadline, "multimodal", services.metrics.rejections):
            processed = await services.multimodal.process(ImagesRequest(urls, deadline_at(deadline)))
    hits = sum(image.cache_hit for image in processed.images)
    services.metrics.image_cache.labels("hit").inc(hits)
    services.metrics.image_cache.labels("miss").inc(len(processed.images) - hits)
    return processed.images, {"multimodal": processed.elapsed_s, "multimodal_call": time.perf_counter() - start}


async def start_stream(
    services: Services,
    request: SamplingRequest,
    prompt: ChatPrompt | TextPrompt,
    *,
    add_special_tokens: bool,
    logprobs: int | None,
    request_id: str,
    image_urls: list[str] | None = None,
    deadline: Deadline | None = None,
) -> Stream:
    """Steps 2-5 for one prompt."""
    started = time.perf_counter()
    images, timings = await process_images(services, image_urls or [], deadline)
    tokenize = TokenizeRequest(
        prompt, add_special_tokens, request.truncate_prompt_tokens, request.max_tokens,
        image_tokens=[image.num_tokens for image in images],
    )  # fmt: skip
    cap = services.args.limits.max_tokens  # `limits.max_tokens` also bounds requests that set none
    stream = await start_generation(
        services, tokenize, lambda budget: request.sampling_spec(min(budget, cap or budget), logprobs), request_id,
        images,
        deadline=deadline, started=started,
    )  # fmt: skip
    stream.timings |= timings
    return stream


async def start_generation(
    services: Services,
    tokenize: TokenizeRequest,
    sampling: Callable[[int], SamplingSpec],
    request_id: str,
    images: list[ProcessedImage] | None = None,
    *,
    deadline: Deadline | None = None,
    started: float | None = None,
) -> Stream:
    """Steps 3-5: tokenizer stage, then the LLM stage up to its first chunk. `sampling` makes the
    spec from the generation budget the prompt leaves; `started` (perf_counter) is where the time to
    first token counts from."""
    start = time.perf_counter()
    metrics = services.metrics
    ticket = admit_work(services, tokenize, deadline)
    try:
        with metrics.stage_in_flight.labels("tokenizer").track_inprogress():
            async with within(deadline, "tokenizer", metrics.rejections):
                tokenized = await services.tokenizer.tokenize(replace(tokenize, deadline=deadline_at(deadline)))
    except BaseException:
        if ticket is not None:
            ticket.release()
        raise
    called_llm = time.perf_counter()
    spec = sampling(tokenized.max_tokens)
    request = GenerateRequest(request_id, tokenized.token_ids, spec, images or [], deadline_at(deadline))
    if ticket is not None and services.work is not None:
        prompt_tokens = tokenized.num_prompt_tokens or len(tokenized.token_ids)
        services.work.learn(prompt_chars(tokenize.prompt), prompt_tokens)
        ticket.resize(prompt_tokens, spec.max_tokens * spec.n)
    generator = _in_flight(metrics, "llm", services.llm.generate(request), ticket)
    try:
        async with within(deadline, "llm", metrics.rejections):
            first = await anext(generator)
    except EngineDeadError as exc:
        services.health.mark_failed("llm", exc.message)
        raise
    now = time.perf_counter()
    timings = {
        "tokenizer": tokenized.elapsed_s,
        "tokenizer_call": called_llm - start,
        "llm_first_chunk": now - called_llm,
    }
    ttft = {"total": now - (start if started is None else started)}
    if first.engine_ttft_s is not None:
        timings["llm_engine"] = ttft["engine"] = first.engine_ttft_s
        ttft["framework"] = ttft["total"] - first.engine_ttft_s
    for stage, seconds in timings.items():
        metrics.stage_seconds.labels(stage).observe(seconds)
    for part, seconds in ttft.items():
        metrics.ttft.labels(part).observe(seconds)
    timings["first_token"] = ttft["total"]
    num_prompt_tokens = tokenized.num_prompt_tokens or len(tokenized.token_ids)
    metrics.tokens.labels("prompt").inc(num_prompt_tokens)
    return Stream(
        request_id, tokenized.token_ids, num_prompt_tokens, first, generator, metrics, timings, deadline=deadline
    )


def admit_work(services: Services, tokenize: TokenizeRequest, deadline: Deadline | None) -> WorkTicket | None:
    """Step 3's admission by work, if configured: the request's ticket, weighed before it is tokenized
    (`work_admission.py`), or OverloadedError."""
    if services.work is None:
        return None
    DeadlineExceededError.check(deadline_at(deadline), "ingress")  # a 504, not an overload, once it passed
    early = take_early_ticket()  # weighed on arrival, before parsing (`early_admission.py`)
    if early is not None:
        return early
    prompt = tokenize.prompt
    exact = prompt.token_ids if isinstance(prompt, TextPrompt) else None
    prompt_tokens = len(exact) if exact is not None else services.work.estimate_tokens(prompt_chars(prompt))
    prompt_tokens += sum(tokenize.image_tokens)
    max_tokens = budget(services.args, prompt_tokens, tokenize.max_tokens)
    return services.work.admit(prompt_tokens, max_tokens, None if deadline is None else deadline.remaining())


async def _in_flight(
    metrics: IngressMetrics, stage: str, chunks: AsyncIterator[GenerationChunk], ticket: WorkTicket | None = None
) -> AsyncGenerator[GenerationChunk, None]:
    """`chunks`, counted as a call in flight to `stage` (and in the work backlog, with a ticket) until
    they end or are closed; closing this closes them (the Serve call is cancelled)."""
    with metrics.stage_in_flight.labels(stage).track_inprogress():
        try:
            async for chunk in chunks:
                if ticket is not None:
                    ticket.generated(sum(len(d.token_ids) for d in chunk.deltas))
                yield chunk
        finally:
            if ticket is not None:
                ticket.release()
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def timing_headers(timings: dict[str, float]) -> dict[str, str]:
    """Per-stage time in milliseconds, as `X-<Stage>-Time` headers."""
    names = {"multimodal": "X-Multimodal-Time", "tokenizer": "X-Tokenizer-Time",
             "llm_first_chunk": "X-LLM-First-Chunk-Time", "llm_engine": "X-LLM-Engine-Time",
             "first_token": "X-First-Token-Time", "vocoder_first_chunk": "X-Vocoder-First-Chunk-Time",
             "total": "X-Total-Time"}  # fmt: skip
    return {names[k]: f"{v * 1000:.3f}" for k, v in timings.items() if k in names}


async def merge(
    streams: list[AsyncIterator[GenerationChunk]],
) -> AsyncGenerator[tuple[int, GenerationChunk], None]:
    """Chunks of several streams as they arrive, tagged with the stream's position."""
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, GenerationChunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[GenerationChunk]) -> None:
        try:
            async for chunk in stream:
                await queue.put((i, chunk))
        except Exception as exc:  # handed to the consumer below, which re-raises it
            await queue.put((i, exc))
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class ChoiceState:
    """One choice accumulated over a whole generation (non-streaming responses, usage)."""

    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.text.append(delta.text)
        self.num_tokens += len(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
