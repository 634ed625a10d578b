"""`/tokenize` and `/detokenize`: the tokenizer stage, without generation."""

from __future__ import annotations

from serve_app import messages
from serve_app.ingress.pipeline.prompts import chat_prompt
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.validation import check_model
from serve_app.ingress.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)


async def tokenize(services: Services, request: TokenizeRequest) -> TokenizeResponse:
    check_model(services, request.model)
    prompt: messages.ChatPrompt | messages.TextPrompt
    if request.messages is not None:
        # Images count as their placeholder token here: they are not fetched just to be counted.
        prompt, _ = chat_prompt(
            request.messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        add_special = bool(request.add_special_tokens)
    else:
        prompt = messages.TextPrompt(text=request.prompt)
        add_special = request.add_special_tokens is not False
    with services.metrics.stage_in_flight.labels("tokenizer").track_inprogress():
        result = await services.tokenizer.tokenize(
            messages.TokenizeRequest(
                prompt, add_special_tokens=add_special, check_context=False, token_strs=request.return_token_strs
            )
        )
    return TokenizeResponse(
        count=len(result.token_ids),
        max_model_len=services.args.model.max_model_len,
        tokens=result.token_ids,
        token_strs=result.token_strs,
    )


async def detokenize(services: Services, request: DetokenizeRequest) -> DetokenizeResponse:
    check_model(services, request.model)
    with services.metrics.stage_in_flight.labels("tokenizer").track_inprogress():
        return DetokenizeResponse(prompt=await services.tokenizer.detokenize(request.tokens))
