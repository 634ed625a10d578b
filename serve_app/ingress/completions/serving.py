"""`/v1/completions`: the text completion path (see `generation.py` for the numbered steps).

A list of prompts becomes one tokenizer call and one engine request per prompt, started together;
choice `i` of prompt `p` is reported as index `p * n + i`, as OpenAI and vLLM do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

from serve_app.errors import BadRequestError
from serve_app.ingress import sse
from serve_app.ingress.closing_response import ClosingStreamingResponse
from serve_app.ingress.completions.protocol import CompletionRequest
from serve_app.ingress.pipeline.deadline import within
from serve_app.ingress.pipeline.generation import Stream, start_stream
from serve_app.ingress.pipeline.responses import new_request_id, timing_headers
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.streams import ChoiceState, merge
from serve_app.ingress.pipeline.validation import check_limits, check_model
from serve_app.ingress.protocol import usage
from serve_app.messages import Deadline, TextPrompt, TokenLogprob


class _Offsets:
    """`text_offset` of completion logprobs continues across streamed chunks."""

    def __init__(self) -> None:
        self.next = 0

    def format(self, items: list[TokenLogprob], lead: str | None = None) -> dict[str, Any]:
        """`items` as the legacy API's logprobs; `lead`, an echoed prompt's first token, goes before them
        with none (nothing comes before it to predict it), as in vLLM."""
        tokens = [t.token for t in items]
        token_logprobs: list[float | None] = [t.logprob for t in items]
        # The legacy API's k + 1: the sampled token first, then the k most likely (vLLM's order).
        top: list[dict[str, float] | None] = [{t.token: t.logprob, **{a: b for a, b, _ in t.top}} for t in items]
        if lead is not None:
            tokens.insert(0, lead)
            token_logprobs.insert(0, None)
            top.insert(0, None)
        offsets = []
        for token in tokens:
            offsets.append(self.next)
            self.next += len(token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


@dataclass(frozen=True)
class _Echo:
    """What `echo` puts before a prompt's choices: its text and, with `logprobs`, its tokens' logprobs;
    with `only` (`max_tokens: 0`), instead of what was generated. Without `echo`, nothing."""

    text: str = ""
    lead: str | None = None  # the prompt's first token, which has no logprob
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tokens after it
    only: bool = False

    def text_with(self, generated: str) -> str:
        return self.text + ("" if self.only else generated)

    def logprobs_with(self, generated: list[TokenLogprob], offsets: _Offsets) -> dict[str, Any]:
        return offsets.format(self.logprobs + ([] if self.only else generated), self.lead)


async def create_completion(services: Services, request: CompletionRequest, deadline: Deadline | None = None) -> Any:
    model = check_model(services, request.model)
    check_limits(services, request, request.logprobs)
    prompts = request.prompts()
    limit = services.args.limits.max_prompts_per_request
    if len(prompts) > limit:
        raise BadRequestError(f"At most {limit} prompts per request, got {len(prompts)}.", param="prompt")
    request_id = new_request_id("cmpl")
    start = time.perf_counter()
    streams = await _start_all(services, request, prompts, request_id, deadline)
    try:
        echoes = await _echoes(services, request, prompts, streams)
    except BaseException:
        await _close_all(streams)  # past the deadline, or the tokenizer stage lost: the engine stops too
        raise
    headers = timing_headers(streams[0].timings)
    if request.stream:
        events = _events(request, streams, echoes, model, request_id)

        async def close() -> None:
            await events.aclose()  # first: its merge stops reading the streams
            await _close_all(streams)  # gives the work back also when the events never started

        return ClosingStreamingResponse(sse.encode(events), close, media_type="text/event-stream", headers=headers)
    n = request.n
    choices = [ChoiceState() for _ in range(n * len(streams))]
    try:
        async for p, chunk in merge([s.chunks() for s in streams]):
            for delta in chunk.deltas:
                choices[p * n + delta.index].add(delta)
    finally:
        await _close_all(streams)  # one prompt's failure (or a disconnect) stops the others' generation
    headers = timing_headers({**streams[0].timings, "total": time.perf_counter() - start})
    completion_tokens = sum(c.num_tokens for c in choices)
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "text": echoes[i // n].text_with("".join(c.text)),
                "logprobs": echoes[i // n].logprobs_with(c.logprobs, _Offsets())
                if request.logprobs is not None
                else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                # vLLM's place for them: each choice with its prompt's ids and its own.
                **(
                    {"prompt_token_ids": streams[i // n].engine_prompt_ids, "token_ids": c.token_ids}
                    if request.return_token_ids
                    else {}
                ),
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage(sum(s.num_prompt_tokens for s in streams), completion_tokens),
    }
    return JSONResponse(body, headers=headers)


async def _start_all(
    services: Services,
    request: CompletionRequest,
    prompts: list[str | list[int]],
    request_id: str,
    deadline: Deadline | None,
) -> list[Stream]:
    def text_prompt(p: str | list[int]) -> TextPrompt:
        return TextPrompt(text=p) if isinstance(p, str) else TextPrompt(token_ids=p)

    starts = [
        start_stream(
            services, request, text_prompt(p), add_special_tokens=request.add_special_tokens,
            logprobs=request.logprobs, request_id=f"{request_id}-{i}", deadline=deadline,
        )
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    results = await asyncio.gather(*starts, return_exceptions=True)
    streams = [r for r in results if isinstance(r, Stream)]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        # One bad prompt fails the request; the engine work of the good ones is cancelled.
        await _close_all(streams)
        raise failure
    return streams


async def _close_all(streams: list[Stream]) -> None:
    await asyncio.gather(*(s.close() for s in streams))


async def _echoes(
    services: Services, request: CompletionRequest, prompts: list[str | list[int]], streams: list[Stream]
) -> list[_Echo]:
    """What `echo` returns before each prompt's choices, as vLLM: a text prompt as sent (not its tokens
    decoded, which would add the special tokens the tokenizer put around it), token ids decoded, both
    before truncation; with `logprobs`, the logprobs of the tokens the engine saw, the first decoded here.
    With `return_token_ids` the text is empty, as in vLLM: the prompt comes back as its ids."""
    if not request.echo:
        return [_Echo()] * len(prompts)

    async def echo(prompt: str | list[int], stream: Stream) -> _Echo:
        if request.logprobs is None:
            return _Echo(await text(prompt), only=request.echo_only)
        logprobs = stream.first.prompt_logprobs
        if logprobs is None:  # all of them come with the first output (vLLM's DELTA kind): a fault, not a 400
            raise RuntimeError(f"{stream.request_id}: the engine's first output has no prompt logprobs")
        echoed, lead = await asyncio.gather(text(prompt), services.tokenizer.detokenize(stream.prompt_token_ids[:1]))
        return _Echo(echoed, lead, logprobs, request.echo_only)

    async def text(prompt: str | list[int]) -> str:
        if request.return_token_ids:
            return ""
        return prompt if isinstance(prompt, str) else await services.tokenizer.detokenize(prompt)  # untruncated

    async with within(streams[0].deadline, "tokenizer", services.metrics.rejections):
        return list(await asyncio.gather(*(echo(p, s) for p, s in zip(prompts, streams, strict=True))))


async def _events(
    request: CompletionRequest, streams: list[Stream], echoes: list[_Echo], model: str, request_id: str
) -> AsyncGenerator[dict[str, Any], None]:
    created = int(time.time())
    n = request.n
    include_usage, continuous = request.usage_in_stream()
    generated_by = [0] * (n * len(streams))  # tokens of each choice so far
    offsets = [_Offsets() for _ in range(n * len(streams))]
    fresh = [True] * (n * len(streams))  # choices that have sent nothing yet
    echo, ids = request.echo, request.return_token_ids  # read once: the loop below runs for every chunk
    running = n * len(streams)  # choices not finished: the payload that finishes the last one is the last
    # Closed with this generator: its tasks stop reading the streams before the streams are closed.
    async with aclosing(merge([s.chunks() for s in streams])) as merged:
        async for p, chunk in merged:
            for delta in chunk.deltas:
                index = p * n + delta.index
                generated_by[index] += len(delta.token_ids)
                first, fresh[index] = fresh[index], False
                text, logprobs = delta.text, delta.logprobs
                if first and echo:  # its echo first: the prompt's text, and its logprobs with `logprobs`
                    text = echoes[p].text_with(text)
                    formatted = None
                    if request.logprobs is not None:
                        formatted = echoes[p].logprobs_with(logprobs or [], offsets[index])
                else:
                    formatted = None if logprobs is None else offsets[index].format(logprobs)
                choice = {
                    "index": index,
                    "text": text,
                    "logprobs": formatted,
                    "finish_reason": delta.finish_reason,
                    "stop_reason": delta.stop_reason,
                }
                if ids:  # vLLM's places: the prompt's ids in a choice's first chunk, the new ids in each
                    if first:
                        choice["prompt_token_ids"] = streams[p].engine_prompt_ids
                    choice["token_ids"] = delta.token_ids
                if delta.finish_reason is not None:
                    running -= 1
                payload = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                           "choices": [choice]}  # fmt: skip
                if continuous:  # as vLLM: the usage so far of this choice and its prompt
                    payload["usage"] = usage(streams[p].num_prompt_tokens, generated_by[index])
                yield sse.Last(payload) if running == 0 and not include_usage else payload
    if include_usage:
        prompt_tokens = sum(s.num_prompt_tokens for s in streams)
        yield sse.Last({"id": request_id, "object": "text_completion", "created": created, "model": model,
                        "choices": [], "usage": usage(prompt_tokens, sum(generated_by))})  # fmt: skip
