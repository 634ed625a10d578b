"""serve_app/stages/tokenizer.py for a vision model: image placeholders in the template, image tokens
in the context-length check. Uses the tiny LLaVA's real tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.errors import BadRequestError
from serve_app.messages import ChatPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage, load_hf_tokenizer

MAX_MODEL_LEN = 64
IMAGE = {"type": "image"}


@pytest.fixture(scope="module")
def vision_stage(tiny_vision_model_path: Path) -> Iterator[TokenizerStage]:
    stage = TokenizerStage(load_hf_tokenizer(str(tiny_vision_model_path), False), MAX_MODEL_LEN, 1, vision=True)
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def image_token_id(vision_stage: TokenizerStage) -> int:
    with vision_stage._pool.borrow() as tok:
        return int(tok.convert_tokens_to_ids("<image>"))


def request(content: Any, image_tokens: list[int], **kw: Any) -> TokenizeRequest:
    prompt = ChatPrompt([{"role": "user", "content": content}])
    return TokenizeRequest(prompt, add_special_tokens=False, image_tokens=image_tokens, **kw)


def test_each_image_part_becomes_one_placeholder(vision_stage: TokenizerStage, image_token_id: int) -> None:
    content = [{"type": "text", "text": "Compare"}, IMAGE, {"type": "text", "text": "and"}, IMAGE]
    result = vision_stage.tokenize_sync(request(content, [16, 16]))
    assert result.token_ids.count(image_token_id) == 2
    assert result.num_prompt_tokens == len(result.token_ids) + 2 * 15
    assert result.max_tokens == MAX_MODEL_LEN - result.num_prompt_tokens


def test_image_url_parts_are_placeholders_too(vision_stage: TokenizerStage, image_token_id: int) -> None:
    content = [{"type": "image_url", "image_url": {"url": "data:..."}}, {"type": "text", "text": "Hi"}]
    assert vision_stage.tokenize_sync(request(content, [16])).token_ids.count(image_token_id) == 1


def test_string_content_still_works(vision_stage: TokenizerStage, image_token_id: int) -> None:
    result = vision_stage.tokenize_sync(request("Hello", []))
    assert image_token_id not in result.token_ids
    assert result.num_prompt_tokens == len(result.token_ids)


def test_image_tokens_count_against_the_context(vision_stage: TokenizerStage) -> None:
    with pytest.raises(BadRequestError, match="maximum context length") as info:
        vision_stage.tokenize_sync(request([IMAGE, IMAGE, {"type": "text", "text": "x"}], [30, 30]))
    assert info.value.code == "context_length_exceeded"


def test_truncation_with_images_is_refused(vision_stage: TokenizerStage) -> None:
    with pytest.raises(BadRequestError, match="truncate_prompt_tokens") as info:
        vision_stage.tokenize_sync(request([IMAGE], [16], truncate_prompt_tokens=8))
    assert info.value.param == "truncate_prompt_tokens"


@pytest.mark.parametrize("kind", ["input_audio", "video_url"])
def test_other_media_are_refused(vision_stage: TokenizerStage, kind: str) -> None:
    with pytest.raises(BadRequestError, match=kind):
        vision_stage.tokenize_sync(request([{"type": kind}], []))


def test_a_text_model_refuses_image_placeholders(tokenizer_stage: TokenizerStage) -> None:
    with pytest.raises(BadRequestError, match="text only"):
        tokenizer_stage.tokenize_sync(request([IMAGE], [16]))
