"""The request path shared by chat and text completions.

1. Check the model name and the request's limits (n, logprobs) against the config.
2. Multimodal stage (one unary hop, only for requests with images): fetch, decode, resize.
3. Admission by work, when configured (`work_admission.py`): the request was weighed on an estimate
   of its prompt as it arrived (`early_admission.py`, before parsing) and refused at once if the
   engine is too far behind; then the tokenizer stage (one
   unary hop): render, tokenize, truncate, check the context length; the weight becomes exact.
4. LLM stage (one call; its chunks come back over the token channel, many streams a message,
   `serve_app/token_channel.py`): token ids in, merged output deltas out. Tokens travel
   llm -> ingress directly, never through the other stages.
5. The first chunk is awaited before any byte is sent, so an engine rejection or backpressure
   still becomes a proper HTTP status; later chunks stream as they come.
6. The endpoint module formats the chunks as an OpenAI response or SSE events.

Every wait on a stage is bounded by the request's deadline (`deadline.py`), which the messages also
carry to the stages, and counted in the per-stage in-flight gauge.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from serve_app.errors import BadRequestError, DeadlineExceededError, EngineDeadError
from serve_app.ingress.middleware.early_admission import take_early_ticket
from serve_app.ingress.observability.metrics import IngressMetrics
from serve_app.ingress.pipeline.deadline import within
from serve_app.ingress.pipeline.inline_tokenizer import prompt_chars
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.work_admission import WorkTicket, admit_prompt
from serve_app.ingress.protocol import SamplingRequest
from serve_app.messages import (
    ChatPrompt,
    Deadline,
    GenerateRequest,
    GenerationChunk,
    ImagesRequest,
    ProcessedImage,
    SamplingSpec,
    TextPrompt,
    TokenizeRequest,
)


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
    finish_reason: str | None = None  # why the last choice to end ended, once the stream was read

    @property
    def engine_prompt_ids(self) -> list[int]:
        """The prompt's ids as the engine has them when the first chunk carries them (`return_token_ids`:
        images expanded to their tokens), else as tokenized."""
        return self.first.prompt_token_ids or self.prompt_token_ids

    async def chunks(self) -> AsyncIterator[GenerationChunk]:
        generated = self.metrics.tokens.labels("generated")
        chunk: GenerationChunk | None = self.first
        while chunk is not None:
            count = sum(len(d.token_ids) for d in chunk.deltas)
            self.generated_tokens += count
            generated.inc(count)
            if chunk.finished:
                self.finish_reason = next((d.finish_reason for d in chunk.deltas if d.finish_reason), None)
                # The call's end is read before its last chunk is passed on: a consumer that stops at the
                # last chunk (an SSE stream sends it with [DONE] as the end of the body) then closes a call
                # that has ended, instead of one Serve would cancel and the engine abort.
                following = await self._next()
                yield chunk
                chunk = following
            else:
                yield chunk
                chunk = await self._next()

    async def _next(self) -> GenerationChunk | None:
        """The next chunk from the llm stage, None at the end."""
        try:
            async with within(self.deadline, "llm", self.metrics.rejections):
                return await anext(self.rest)
        except StopAsyncIteration:
            return None

    async def close(self) -> None:
        """Stops the generation now (the engine aborts it) rather than when the generator is collected."""
        close = getattr(self.rest, "aclose", None)
        if close is not None:
            await close()


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
            processed = await services.multimodal.process(ImagesRequest(urls, deadline))
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
    if request.priority and services.args.engine.scheduling_policy != "priority":
        # vLLM's engine (0.32) takes it and schedules in arrival order all the same: refused here, so that
        # a priority never does nothing silently.
        raise BadRequestError(
            f"priority is {request.priority}, but model {services.args.model.name} schedules requests in arrival "
            "order (engine.scheduling_policy: fcfs); leave it 0.",
            param="priority",
        )
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
                tokenized = await services.tokenizer.tokenize(replace(tokenize, deadline=deadline))
    except BaseException:
        if ticket is not None:
            ticket.release()
        raise
    called_llm = time.perf_counter()
    spec = sampling(tokenized.max_tokens)
    request = GenerateRequest(request_id, tokenized.token_ids, spec, images or [], deadline)
    num_prompt_tokens = tokenized.num_prompt_tokens or len(tokenized.token_ids)
    if ticket is not None and services.work is not None:
        # Tokens per character of text: the images (a placeholder token each here) are weighed apart
        # (`admit_work`'s extra_tokens).
        services.work.learn(prompt_chars(tokenize.prompt), len(tokenized.token_ids) - len(tokenize.image_tokens))
        ticket.resize(num_prompt_tokens, spec.max_tokens * spec.n)
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
    metrics.tokens.labels("prompt").inc(num_prompt_tokens)
    return Stream(
        request_id, tokenized.token_ids, num_prompt_tokens, first, generator, metrics, timings, deadline=deadline
    )


def admit_work(services: Services, tokenize: TokenizeRequest, deadline: Deadline | None) -> WorkTicket | None:
    """Step 3's admission by work, if configured: the request's ticket, weighed before it is tokenized
    (`work_admission.py`), or OverloadedError."""
    if services.work is None:
        return None
    try:
        DeadlineExceededError.check(deadline, "ingress")  # a 504, not an overload, once it passed
    except DeadlineExceededError:
        services.metrics.rejections.labels("ingress", "deadline").inc()  # as `within` counts the others
        raise
    early = take_early_ticket()  # weighed on arrival, before parsing (`early_admission.py`)
    if early is not None:
        return early
    prompt = tokenize.prompt
    exact = prompt.token_ids if isinstance(prompt, TextPrompt) else None
    return admit_prompt(
        services.work, services.args, prompt_chars(prompt), None if exact is None else len(exact),
        extra_tokens=sum(tokenize.image_tokens), max_tokens=tokenize.max_tokens,
        deadline_s=None if deadline is None else deadline.remaining(),
        truncating=tokenize.truncate_prompt_tokens is not None,
        param=tokenize.prompt_param,
    )  # fmt: skip


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
