"""serve_app/stages/tokenizer.py with the tiny model's real Hugging Face tokenizer."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from serve_app.config import AppArgs
from serve_app.errors import BadRequestError
from serve_app.messages import ChatPrompt, TextPrompt, TokenizeRequest
from serve_app.stages.tokenizer import (
    TokenizerPool,
    TokenizerStage,
    _developer_as_system,
    load_hf_tokenizer,
    max_chars_per_token,
)

SYSTEM = {"role": "system", "content": "Be brief."}
CONTEXT = "context_length_exceeded"


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def chat(messages: list[dict[str, Any]], **kw: Any) -> TokenizeRequest:
    names = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    prompt = ChatPrompt(messages, **{k: kw.pop(k) for k in names if k in kw})
    return TokenizeRequest(prompt, add_special_tokens=False, **kw)


def ids(token_ids: list[int], **kw: Any) -> TokenizeRequest:
    return TokenizeRequest(TextPrompt(token_ids=token_ids), add_special_tokens=True, **kw)


def text(value: str, **kw: Any) -> TokenizeRequest:
    return TokenizeRequest(TextPrompt(text=value), add_special_tokens=True, **kw)


def with_part(part: dict[str, Any]) -> TokenizeRequest:
    return chat([SYSTEM, user([{"type": "text", "text": "see"}, part])])


def test_from_args(tokenizer_stage: TokenizerStage, app_args: AppArgs, hf_tokenizer: Any) -> None:
    assert TokenizerStage.parts(app_args)[2] == app_args.tokenizer.threads == 2
    assert tokenizer_stage.max_model_len == 128
    assert tokenizer_stage.vocab_size == len(hf_tokenizer) == 8000


def test_chat_template_gives_hf_ids(tokenizer_stage: TokenizerStage, hf_tokenizer: Any) -> None:
    messages = [SYSTEM, user("Hello there, how are you?")]
    result = tokenizer_stage.tokenize_sync(chat(messages))
    rendered = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHello there, how are you?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert result.token_ids == hf_tokenizer.encode(rendered, add_special_tokens=False)
    assert result.token_ids[0] == hf_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert hf_tokenizer.decode(result.token_ids) == rendered
    assert result.max_tokens == 128 - len(result.token_ids)
    assert result.elapsed_s >= 0


@pytest.mark.parametrize(
    ("messages", "flags", "rendered"),
    [
        ([user("Hi")], {"add_generation_prompt": False}, "<|im_start|>user\nHi<|im_end|>\n"),
        (
            [user("Hi"), {"role": "assistant", "content": "Once upon"}],
            {"add_generation_prompt": False, "continue_final_message": True},
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nOnce upon",
        ),
    ],
)
def test_template_flags(
    tokenizer_stage: TokenizerStage, hf_tokenizer: Any, messages: Any, flags: Any, rendered: str
) -> None:
    assert hf_tokenizer.decode(tokenizer_stage.tokenize_sync(chat(messages, **flags)).token_ids) == rendered


def test_developer_messages_become_one_system_message_as_in_vllm(
    tokenizer_stage: TokenizerStage, hf_tokenizer: Any
) -> None:
    # The tiny template never names `developer`: vLLM renders such messages as system ones, merged first.
    developer = {"role": "developer", "content": "Be brief."}
    rendered = hf_tokenizer.decode(tokenizer_stage.tokenize_sync(chat([developer, user("Hi")])).token_ids)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
    parts = {"role": "developer", "content": [{"type": "text", "text": "No lists."}]}
    rendered = hf_tokenizer.decode(tokenizer_stage.tokenize_sync(chat([SYSTEM, user("Hi"), parts])).token_ids)
    assert rendered.startswith(
        "<|im_start|>system\nBe brief.\n\nNo lists.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<"
    )
    assert "developer" not in rendered
    # Merged, an image part would lose its placeholder (vLLM drops it): a 400 instead.
    image = {"role": "developer", "content": [{"type": "text", "text": "See:"}, {"type": "image"}]}
    with pytest.raises(BadRequestError, match="move the image to a user message"):
        _developer_as_system([SYSTEM, image, user("Hi")], "")
    # A template that names the role gets it as it is.
    messages = [user("Hi"), developer]
    assert _developer_as_system(messages, "{% if m['role'] == 'developer' %}") is messages
    # Without a developer message nothing moves, even a system message that is not first.
    late = hf_tokenizer.decode(tokenizer_stage.tokenize_sync(chat([user("Hi"), SYSTEM])).token_ids)
    assert late.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>system")


def test_text_parts_are_joined(tokenizer_stage: TokenizerStage) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    joined = tokenizer_stage.tokenize_sync(chat([user("Hello\nworld")])).token_ids
    assert tokenizer_stage.tokenize_sync(chat([user(parts)])).token_ids == joined


BAD_PROMPTS = [
    # (request, param, code, words in the message)
    (chat([]), "messages", None, "messages must not be empty."),
    (chat([user("Hi")], continue_final_message=True), "continue_final_message", None, "cannot both be true"),
    (chat([user("Hi")], chat_template_kwargs={"tokenize": True}), "messages", None, "Chat template failed"),
    (
        with_part({"type": "image_url", "image_url": {"url": "http://x/y.png"}}),
        "messages",
        None,
        "messages[1]: content of type 'image_url' is not supported",
    ),
    (with_part({"type": "input_audio"}), "messages", None, "messages[1]: content of type 'input_audio'"),
    (with_part({"type": "hologram"}), "messages", None, "messages[1]: unknown content part type 'hologram'"),
    (ids([5, 6], truncate_prompt_tokens=129), "truncate_prompt_tokens", None, "(129) cannot exceed"),
    (ids(list(range(128))), "prompt", CONTEXT, "maximum context length is 128 tokens. However, your request"),
    (ids(list(range(500))), "prompt", CONTEXT, "your request has 500 input tokens"),
    (ids(list(range(200)), truncate_prompt_tokens=128), "prompt", CONTEXT, "your request has 128 input tokens"),
    (chat([user("word " * 200)]), "messages", CONTEXT, "maximum context length is 128 tokens"),
    (ids(list(range(10)), max_tokens=129), "max_tokens", None, "max_tokens=129 cannot be greater than max_model_len"),
    (text(""), "prompt", None, "The prompt is empty."),
    (ids([5, 8000, 6]), "prompt", None, "Token id 8000 is out of vocabulary (size 8000)"),
    (ids([10**9]), "prompt", None, f"Token id {10**9} is out of vocabulary"),
    (ids([3, -1]), "prompt", None, "Token id -1 is out of vocabulary"),
]


@pytest.mark.parametrize(("request_", "param", "code", "words"), BAD_PROMPTS)
def test_bad_prompts_are_400(
    tokenizer_stage: TokenizerStage, request_: TokenizeRequest, param: str, code: str | None, words: str
) -> None:
    with pytest.raises(BadRequestError) as info:
        tokenizer_stage.tokenize_sync(request_)
    assert (info.value.status_code, info.value.param, info.value.code) == (400, param, code)
    assert words in info.value.message


def test_model_without_chat_template_is_400(tiny_model_path: Path) -> None:
    hf = load_hf_tokenizer(str(tiny_model_path), False)

    def factory() -> Any:
        tok = hf()
        tok.chat_template = None
        return tok

    stage = TokenizerStage(factory, 128, 1)
    try:
        with pytest.raises(BadRequestError, match="no chat template"):
            stage.tokenize_sync(chat([user("Hi")]))
    finally:
        stage.close()


@pytest.mark.parametrize(("keep", "kept"), [(None, 50), (1, 1), (5, 5), (50, 50), (100, 50), (128, 50)])
def test_truncation_keeps_the_last_k(tokenizer_stage: TokenizerStage, keep: int | None, kept: int) -> None:
    prompt = list(range(10, 60))
    result = tokenizer_stage.tokenize_sync(ids(prompt, truncate_prompt_tokens=keep))
    assert result.token_ids == prompt[-kept:]
    assert result.max_tokens == 128 - kept


def test_truncation_of_text(tokenizer_stage: TokenizerStage, hf_tokenizer: Any) -> None:
    sentence = "The quick brown fox jumps over the lazy dog. " * 4
    full = hf_tokenizer.encode(sentence)
    assert len(full) > 7
    assert tokenizer_stage.tokenize_sync(text(sentence, truncate_prompt_tokens=7)).token_ids == full[-7:]


def test_truncation_minus_one_leaves_one_token_of_context(tokenizer_stage: TokenizerStage) -> None:
    prompt = list(range(1000, 1200))
    result = tokenizer_stage.tokenize_sync(ids(prompt, truncate_prompt_tokens=-1))
    assert (result.token_ids, result.max_tokens) == (prompt[-127:], 1)  # as vLLM: one token can be generated


@pytest.mark.parametrize(
    ("length", "max_tokens", "room"),
    [(10, None, 118), (10, 1, 1), (10, 118, 118), (127, None, 1), (10, 119, 118), (100, 128, 28)],
)
def test_max_tokens(tokenizer_stage: TokenizerStage, length: int, max_tokens: int | None, room: int) -> None:
    assert tokenizer_stage.tokenize_sync(ids(list(range(length)), max_tokens=max_tokens)).max_tokens == room


def test_check_context_false_skips_length_checks(tokenizer_stage: TokenizerStage) -> None:
    prompt = list(range(300))
    result = tokenizer_stage.tokenize_sync(ids(prompt, max_tokens=10_000, check_context=False))
    assert (result.token_ids, result.max_tokens) == (prompt, 0)
    assert tokenizer_stage.tokenize_sync(text("", check_context=False)).token_ids == []


def test_detokenize(tokenizer_stage: TokenizerStage, hf_tokenizer: Any) -> None:
    sentence = "Hello, world! 123 naïve café"
    assert tokenizer_stage.detokenize_sync(hf_tokenizer.encode(sentence)) == sentence
    with pytest.raises(BadRequestError) as info:
        tokenizer_stage.detokenize_sync([1, 8000])
    assert info.value.param == "tokens"


async def test_async_variants(tokenizer_stage: TokenizerStage, hf_tokenizer: Any) -> None:
    result = await tokenizer_stage.tokenize(text("Hello world"))
    assert result.token_ids == hf_tokenizer.encode("Hello world")
    assert await tokenizer_stage.detokenize(result.token_ids) == "Hello world"
    with pytest.raises(BadRequestError):
        await tokenizer_stage.tokenize(ids([8000]))


# --- concurrency: one tokenizer copy per thread, truncation by slicing -----------------------------


@pytest.fixture(scope="module")
def stage8(tiny_model_path: Path) -> Any:
    stage = TokenizerStage(load_hf_tokenizer(str(tiny_model_path), False), max_model_len=4096, threads=8)
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def workload(hf_tokenizer: Any, chat_ids: Any) -> tuple[list[TokenizeRequest], list[list[int]]]:
    """1200 requests: text and chat prompts of many lengths, truncated to various k or not at all."""
    truncations = [None, 1, 2, 3, 7, 16, 33, 64, 100, 500]
    requests, full = [], []
    for i in range(1200):
        words = " ".join(f"w{j % 37}" for j in range(1 + (i * 7) % 90))
        keep = truncations[(i // 3) % len(truncations)]
        if i % 3 == 2:
            requests.append(chat([SYSTEM, user(words)], truncate_prompt_tokens=keep))
            full.append(chat_ids([SYSTEM, user(words)]))  # single-threaded, straight from HF
        else:
            requests.append(text(words, truncate_prompt_tokens=keep))
            full.append(hf_tokenizer.encode(words))
    keeps = [r.truncate_prompt_tokens for r in requests]
    expected = [f if k is None else f[-k:] for f, k in zip(full, keeps, strict=True)]
    # The mix is what makes the test: prompts of many lengths, most of the truncations really cut.
    assert len({len(f) for f in full}) >= 80
    assert sum(len(e) < len(f) for e, f in zip(expected, full, strict=True)) >= 600
    assert sum(k is None for k in keeps) >= 100
    return requests, expected


def test_concurrent_threads_give_exact_results(stage8: TokenizerStage, workload: Any) -> None:
    requests, expected = workload
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(stage8.tokenize_sync, requests))
    assert [len(r.token_ids) for r in results] == [len(e) for e in expected]
    assert [r.token_ids for r in results] == expected
    assert [r.max_tokens for r in results] == [4096 - len(e) for e in expected]


async def test_concurrent_async_tokenize_gives_exact_results(stage8: TokenizerStage, workload: Any) -> None:
    requests, expected = workload
    results = await asyncio.gather(*(stage8.tokenize(r) for r in requests))
    assert [len(r.token_ids) for r in results] == [len(e) for e in expected]
    assert [r.token_ids for r in results] == expected


def test_pool_never_lends_a_copy_to_two_threads() -> None:
    lock = threading.Lock()
    created: list[Copy] = []

    class Copy:
        def __init__(self) -> None:
            self.users = self.overlaps = self.uses = 0
            created.append(self)

    def use(copy: Copy) -> None:
        with lock:
            copy.users += 1
            copy.uses += 1
            copy.overlaps += copy.users > 1
        for _ in range(50):  # give other threads the GIL while the copy is held
            threading.Event().wait(0)
        with lock:
            copy.users -= 1

    pool = TokenizerPool(Copy, size=4)
    assert len(created) == 4

    def worker(_: int) -> None:
        for _ in range(100):
            with pool.borrow() as copy:
                use(copy)

    with ThreadPoolExecutor(16) as executor:
        list(executor.map(worker, range(16)))
    assert [c.overlaps for c in created] == [0, 0, 0, 0]
    assert sum(c.uses for c in created) == 1600
    assert len(created) == 4  # no copy is made on demand


def test_pool_returns_a_copy_when_the_body_raises() -> None:
    pool = TokenizerPool(object, size=1)
    with pytest.raises(RuntimeError), pool.borrow():
        raise RuntimeError("boom")
    with pool.borrow() as copy:  # would block forever if the copy had been lost
        assert copy is not None


def _fast(model: Any, normalizer: Any = None, pre_tokenizer: Any = None) -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tok)  # type: ignore[no-untyped-call]


def test_max_chars_per_token_bounds_the_tiny_models_token_count(hf_tokenizer: Any) -> None:
    bound = max_chars_per_token(hf_tokenizer)
    assert bound == max(len(t) for t in hf_tokenizer.get_vocab())
    # The densest texts it can meet: runs of its longest tokens, unicode, and the bench's kind of prose.
    longest = max(hf_tokenizer.get_vocab(), key=len)
    texts = [longest * 50, "#" * 10_000, " " * 5_000, "héllo wörld ünïcode 😀 " * 200, "serve123 graph45 " * 500]
    for text in texts:
        assert len(hf_tokenizer.encode(text, add_special_tokens=False)) >= -(-len(text) // bound)


def test_max_chars_per_token_is_none_where_a_token_can_stand_for_any_length() -> None:
    from tokenizers import models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}
    assert max_chars_per_token(_fast(models.WordPiece(vocab, unk_token="[UNK]"))) is None
    byte_level = pre_tokenizers.ByteLevel()
    assert max_chars_per_token(_fast(models.BPE(vocab, [("a", "b")]), normalizers.NFC(), byte_level)) is None
    shrinking = normalizers.Replace("aa", "a")
    assert max_chars_per_token(_fast(models.BPE(vocab, [("a", "b")]), shrinking, byte_level)) is None
    # Neither byte-level nor byte fallback: unknown characters become [UNK] (fused, any number in one).
    assert max_chars_per_token(_fast(models.BPE(vocab, [("a", "b")], unk_token="[UNK]", fuse_unk=True))) is None
    spelled = _fast(models.BPE(vocab, [("a", "b")], byte_fallback=True), normalizers.Replace(" ", "▁"))
    assert max_chars_per_token(spelled) == 5  # "[UNK]"
