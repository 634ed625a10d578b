"""serve_app/ingress/pipeline/inline_tokenizer.py: short prompts tokenized in the ingress, the rest in the stage."""

from __future__ import annotations

from typing import Any

from serve_app.config import AdmissionConfig, AppArgs, TokenizerStageConfig
from serve_app.ingress.pipeline.inline_tokenizer import InlineTokenizer
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import ChatPrompt, TextPrompt, TokenizedPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import FakeLLM


class RecordingStage:
    """The tokenizer stage as the ingress reaches it, recording what it was sent."""

    def __init__(self, stage: TokenizerStage) -> None:
        self._stage = stage
        self.sent: list[TokenizeRequest] = []

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stage, method)

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        self.sent.append(request)
        return await self._stage.tokenize(request)


def inline(app_args: AppArgs, stage: RecordingStage, max_chars: int) -> InlineTokenizer:
    args = app_args.model_copy(update={"tokenizer": TokenizerStageConfig(inline_max_chars=max_chars)})
    client = InlineTokenizer.around(args, stage)
    assert isinstance(client, InlineTokenizer)
    return client


CHAT = ChatPrompt(messages=[{"role": "user", "content": "Say something about tokenizers."}])


async def test_a_short_prompt_never_reaches_the_stage_and_gets_the_stages_ids(
    app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    stage = RecordingStage(tokenizer_stage)
    client = inline(app_args, stage, max_chars=100)
    for prompt in (CHAT, TextPrompt(text="hello world")):
        request = TokenizeRequest(prompt, add_special_tokens=True, max_tokens=5)
        local = await client.tokenize(request)
        assert local.token_ids == (await tokenizer_stage.tokenize(request)).token_ids
    assert stage.sent == []


async def test_a_long_prompt_goes_to_the_stage(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    stage = RecordingStage(tokenizer_stage)
    request = TokenizeRequest(TextPrompt(text="x" * 101), add_special_tokens=True)
    await inline(app_args, stage, max_chars=100).tokenize(request)
    assert stage.sent == [request]


def test_a_prompt_with_images_is_the_stages(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    client = inline(app_args, RecordingStage(tokenizer_stage), max_chars=100)
    assert not client.inlines(TokenizeRequest(CHAT, add_special_tokens=True, image_tokens=[16]))
    assert client.inlines(TokenizeRequest(CHAT, add_special_tokens=True))


def test_zero_inlines_nothing(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    stage = tokenizer_stage
    args = app_args.model_copy(update={"tokenizer": TokenizerStageConfig(inline_max_chars=0)})
    assert InlineTokenizer.around(args, stage) is stage


def test_the_work_gate_takes_the_inline_tokenizers_bound(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    admission = AdmissionConfig(prefill_tokens_per_s=1000, decode_tokens_per_s=100)
    args = app_args.model_copy(update={"admission": admission})
    services = Services.create(args, inline(args, RecordingStage(tokenizer_stage), max_chars=100), FakeLLM())
    assert services.work is not None and services.work.max_chars_per_token == tokenizer_stage.max_chars_per_token == 80
    staged = Services.create(args, RecordingStage(tokenizer_stage), FakeLLM())  # no copy in the ingress: no bound
    assert staged.work is not None and staged.work.max_chars_per_token is None
