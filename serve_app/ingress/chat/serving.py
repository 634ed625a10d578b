"""`/v1/chat/completions`: the chat request path (see `generation.py` for the numbered steps)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import JSONResponse

from serve_app.ingress import sse
from serve_app.ingress.chat.protocol import ChatCompletionRequest
from serve_app.ingress.closing_response import ClosingStreamingResponse
from serve_app.ingress.pipeline.generation import Stream, start_stream
from serve_app.ingress.pipeline.prompts import chat_prompt
from serve_app.ingress.pipeline.responses import new_request_id, timing_headers
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.streams import ChoiceState
from serve_app.ingress.pipeline.validation import check_limits, check_model
from serve_app.ingress.protocol import usage
from serve_app.messages import Deadline, TokenLogprob


def chat_logprobs(items: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": [{"token": a, "logprob": b, "bytes": c} for a, b, c in t.top],
            }
            for t in items
        ]
    }


async def create_chat_completion(
    services: Services, request: ChatCompletionRequest, deadline: Deadline | None = None
) -> Any:
    model = check_model(services, request.model)
    logprobs = request.logprobs_k()
    check_limits(services, request, logprobs)
    prompt, image_urls = chat_prompt(
        request.messages,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        chat_template_kwargs=request.chat_template_kwargs,
    )
    start = time.perf_counter()
    stream = await start_stream(
        services, request, prompt, add_special_tokens=False, logprobs=logprobs,
        request_id=new_request_id("chatcmpl"), image_urls=image_urls, deadline=deadline,
    )  # fmt: skip
    if request.stream:
        events = _events(request, stream, model)

        async def close() -> None:
            await events.aclose()
            await stream.close()  # gives the work back also when the events never started

        return ClosingStreamingResponse(
            sse.encode(events), close, media_type="text/event-stream", headers=timing_headers(stream.timings)
        )
    choices = [ChoiceState() for _ in range(request.n)]
    async for chunk in stream.chunks():
        for delta in chunk.deltas:
            choices[delta.index].add(delta)
    stream.timings["total"] = time.perf_counter() - start
    completion_tokens = sum(c.num_tokens for c in choices)
    body = {
        "id": stream.request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(c.text)},
                "logprobs": chat_logprobs(c.logprobs) if logprobs is not None else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                **({"token_ids": c.token_ids} if request.return_token_ids else {}),
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage(stream.num_prompt_tokens, completion_tokens),
    }
    if request.return_token_ids:  # vLLM's place for them: beside the choices (each choice's own in it)
        body["prompt_token_ids"] = stream.engine_prompt_ids
    return JSONResponse(body, headers=timing_headers(stream.timings))


async def _events(request: ChatCompletionRequest, stream: Stream, model: str) -> AsyncGenerator[dict[str, Any], None]:
    created = int(time.time())
    include_usage, continuous = request.usage_in_stream()
    prompt_tokens = stream.num_prompt_tokens
    generated_by = [0] * request.n  # tokens of each choice so far
    running = request.n  # choices not finished: the payload that finishes the last one is the last

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": stream.request_id, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": choices, **extra}  # fmt: skip

    ids = request.return_token_ids
    # vLLM sends the prompt's ids with each choice's opening chunk, the new ids with every later one.
    opening = {"prompt_token_ids": stream.engine_prompt_ids} if ids else {}
    for i in range(request.n):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}  # fmt: skip
        yield chunk([first], **opening, **({"usage": usage(prompt_tokens, 0)} if continuous else {}))
    async for generated in stream.chunks():
        for delta in generated.deltas:
            generated_by[delta.index] += len(delta.token_ids)
            choice = {
                "index": delta.index,
                "delta": {"content": delta.text} if delta.text else {},
                "logprobs": chat_logprobs(delta.logprobs) if delta.logprobs is not None else None,
                "finish_reason": delta.finish_reason,
            }
            if delta.finish_reason is not None:
                choice["stop_reason"] = delta.stop_reason
                running -= 1
            if ids:
                choice["token_ids"] = delta.token_ids
            # As vLLM: the usage so far of the choice this chunk is of.
            extra = {"usage": usage(prompt_tokens, generated_by[delta.index])} if continuous else {}
            payload = chunk([choice], **extra)
            yield sse.Last(payload) if running == 0 and not include_usage else payload
    if include_usage:
        yield sse.Last(chunk([], usage=usage(prompt_tokens, sum(generated_by))))
