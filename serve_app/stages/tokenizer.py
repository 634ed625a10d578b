"""Tokenizer stage: chat template, tokenization, truncation and context-length checks.

Hugging Face fast tokenizers keep truncation/padding state on a shared Rust object without a lock:
two threads using one tokenizer give silently wrong results (measured in the field notes). So every
worker thread owns its own copy, handed out by `TokenizerPool`, and truncation is done by slicing ids,
never by changing tokenizer state.
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.messages import ChatPrompt, SpeechPrompt, TextPrompt, TokenizedPrompt, TokenizeRequest

TokenizerFactory = Callable[[], Any]


def load_hf_tokenizer(path: str, trust_remote_code: bool) -> TokenizerFactory:
    def factory() -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)

    return factory


class TokenizerPool:
    """Tokenizer copies, each lent to one thread at a time."""

    def __init__(self, factory: TokenizerFactory, size: int) -> None:
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(size):
            self._free.put(factory())

    @contextmanager
    def borrow(self) -> Iterator[Any]:
        tokenizer = self._free.get()
        try:
            yield tokenizer
        finally:
            self._free.put(tokenizer)


def _message_text(content: Any, index: int) -> str:
    """OpenAI content (a string or a list of parts) as the plain text a text-only template expects."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            texts.append(part.get("text", ""))
        elif kind in _MEDIA_PARTS:
            raise BadRequestError(
                f"messages[{index}]: content of type '{kind}' is not supported: this model takes text only.",
                param="messages",
            )
        else:
            raise BadRequestError(f"messages[{index}]: unknown content part type '{kind}'.", param="messages")
    return "\n".join(texts)


def _message_parts(content: Any, index: int) -> Any:
    """Content for a vision model's template: text parts and `{"type": "image"}` placeholders, the
    Hugging Face convention; the images themselves travel to the engine separately."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind in ("image", "image_url"):
            parts.append({"type": "image"})
        elif kind in _MEDIA_PARTS:
            raise BadRequestError(
                f"messages[{index}]: content of type '{kind}' is not supported by this model.", param="messages"
            )
        else:
            raise BadRequestError(f"messages[{index}]: unknown content part type '{kind}'.", param="messages")
    return parts


def _developer_as_system(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """OpenAI's `developer` role as vLLM renders it: a template that never names the role gets those
    messages as `system` ones, and then all system messages as one at the start when they are not a
    single first message, which some templates require (vLLM's `safe_apply_chat_template`)."""
    roles = [m["role"] for m in messages]
    if "developer" not in roles or '"developer"' in template or "'developer'" in template:
        return messages
    system = [m for m in messages if m["role"] in ("system", "developer")]
    rest = [m for m in messages if m["role"] not in ("system", "developer")]
    if len(system) == 1 and roles[0] == "developer":
        return [{**system[0], "role": "system"}, *rest]
    texts = []
    for message in system:
        content = message["content"]
        if not isinstance(content, str):
            if any(part.get("type") != "text" for part in content):
                # vLLM drops such a part, and the engine then gets an image without its placeholder.
                raise BadRequestError(
                    "This model's chat template has no developer role, so developer and system messages are "
                    "merged into one system message, which carries text only: move the image to a user message.",
                    param="messages",
                )
            content = "\n".join(part.get("text", "") for part in content)
        texts.append(content)
    return [{"role": "system", "content": "\n\n".join(text for text in texts if text)}, *rest]


def max_chars_per_token(tok: Any) -> int | None:
    """The most characters of prompt text that one token can stand for, or None where no bound holds.

    A BPE tokenizer that spells every character with tokens of its vocabulary (byte-level, as Llama 3,
    GPT-2 and Qwen, or with byte fallback, as Llama 2 and Mistral) and whose normalizer never shortens
    text turns `c` characters into at least c / bound tokens, before a chat template adds its own. Not so
    for WordPiece or Unigram (an unknown word of any length is one token), nor after NFC, accent
    stripping and the like: None for those.
    """
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: nothing to inspect
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    spelled = bool(model.get("byte_fallback")) or _has_type(spec.get("pre_tokenizer"), "ByteLevel")
    if model.get("type") != "BPE" or not spelled or not _keeps_length(spec.get("normalizer")):
        return None
    return max(len(token) for token in tok.get_vocab())


def _has_type(node: Any, kind: str) -> bool:
    if not isinstance(node, dict):
        return False
    return node.get("type") == kind or any(_has_type(n, kind) for n in node.get("pretokenizers") or [])


def _keeps_length(normalizer: Any) -> bool:
    """Whether a normalizer (tokenizer.json's) never makes text shorter."""
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_keeps_length(n) for n in normalizer.get("normalizers") or [])
    if kind == "Replace":
        pattern = (normalizer.get("pattern") or {}).get("String")
        return isinstance(pattern, str) and len(normalizer.get("content") or "") >= len(pattern)
    return kind in ("Prepend", "Lowercase", "NFD")


_MEDIA_PARTS = frozenset({"image", "image_url", "input_image", "input_audio", "audio_url", "video_url"})


class TokenizerStage:
    """Turns prompts into token ids that fit the model's context."""

    def __init__(
        self, factory: TokenizerFactory, max_model_len: int, threads: int, vision: bool = False, speech: bool = False
    ) -> None:
        self._pool = TokenizerPool(factory, threads)
        self.max_model_len = max_model_len
        self.vision = vision
        # As many threads as copies, so a thread never waits for a copy; requests beyond that wait in
        # the executor's queue, which the deployment's max_ongoing_requests bounds.
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="tokenizer")
        with self._pool.borrow() as tok:
            self.vocab_size = len(tok)
            # The talker's token layout: the ingress needs its audio ids to assemble codec frames.
            self.layout = OrpheusLayout.from_tokenizer(tok) if speech else None

    @staticmethod
    def parts(args: AppArgs, threads: int | None = None) -> tuple[TokenizerFactory, int, int, bool, bool]:
        """The constructor's arguments for `args`, with `threads` worker threads (default `tokenizer.threads`)."""
        factory = load_hf_tokenizer(args.model.tokenizer_path, args.model.trust_remote_code)
        vision, speech = args.multimodal is not None, args.tts is not None
        return factory, args.model.max_model_len, threads or args.tokenizer.threads, vision, speech

    @classmethod
    def from_args(cls, args: AppArgs, threads: int | None = None) -> TokenizerStage:
        return cls(*cls.parts(args, threads))

    @functools.cached_property
    def max_chars_per_token(self) -> int | None:
        """`max_chars_per_token` of this model's tokenizer (asked by the ingress only, once)."""
        with self._pool.borrow() as tok:
            return max_chars_per_token(tok)

    # The `TokenizerClient` methods: what the ingress calls, in-process or through the deployment (which
    # is this class). They run off the caller's event loop, so the loop stays free for health checks.
    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.tokenize_sync, request)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.detokenize_sync, token_ids)

    async def speech_layout(self) -> OrpheusLayout | None:
        return self.layout

    async def check_health(self) -> None:
        return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def tokenize_sync(self, request: TokenizeRequest) -> TokenizedPrompt:
        # Checked here, in the worker thread: a request that waited past its deadline in the
        # executor's queue is dropped without being tokenized.
        DeadlineExceededError.check(request.deadline, "tokenizer")
        start = time.perf_counter()
        with self._pool.borrow() as tok:
            token_ids = self._truncate(self._encode(tok, request), request)
            token_strs = list(tok.convert_ids_to_tokens(token_ids)) if request.token_strs else None
        # Each image's placeholder token becomes `image_tokens[i]` tokens in the engine.
        num_prompt_tokens = len(token_ids) + sum(request.image_tokens) - len(request.image_tokens)
        max_tokens = self._check_length(num_prompt_tokens, request) if request.check_context else 0
        return TokenizedPrompt(token_ids, max_tokens, time.perf_counter() - start, num_prompt_tokens, token_strs)

    def detokenize_sync(self, token_ids: list[int]) -> str:
        self._check_ids(token_ids, "tokens")
        with self._pool.borrow() as tok:
            return str(tok.decode(token_ids))

    def _encode(self, tok: Any, request: TokenizeRequest) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, SpeechPrompt):
            return self._speech_prompt(tok, prompt)
        if isinstance(prompt, TextPrompt):
            if prompt.token_ids is not None:
                self._check_ids(prompt.token_ids, "prompt")
                return list(prompt.token_ids)
            return list(tok.encode(prompt.text or "", add_special_tokens=request.add_special_tokens))
        text = self._render_chat(tok, prompt)
        return list(tok.encode(text, add_special_tokens=request.add_special_tokens))

    def _speech_prompt(self, tok: Any, prompt: SpeechPrompt) -> list[int]:
        """The Orpheus talker's prompt: start marker, `voice: text` with BOS, end markers."""
        if self.layout is None:
            raise BadRequestError.no_speech(None)
        text = list(tok.encode(f"{prompt.voice}: {prompt.text}", add_special_tokens=True))
        return [*self.layout.start_ids, *text, *self.layout.end_ids]

    def _render_chat(self, tok: Any, prompt: ChatPrompt) -> str:
        if not prompt.messages:
            raise BadRequestError("messages must not be empty.", param="messages")
        content = _message_parts if self.vision else _message_text
        messages = [{**m, "content": content(m.get("content"), i)} for i, m in enumerate(prompt.messages)]
        if prompt.continue_final_message and prompt.add_generation_prompt:
            raise BadRequestError(
                "continue_final_message and add_generation_prompt cannot both be true.",
                param="continue_final_message",
            )
        if getattr(tok, "chat_template", None) is None:
            raise BadRequestError("This model has no chat template; use /v1/completions.", param="messages")
        # The template apply_chat_template renders (the default one, when a tokenizer has several).
        messages = _developer_as_system(messages, tok.get_chat_template())
        try:
            rendered = tok.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=prompt.add_generation_prompt,
                continue_final_message=prompt.continue_final_message,
                **prompt.chat_template_kwargs,
            )
        except Exception as exc:  # a template error is the client's messages not fitting the template
            raise BadRequestError(f"Chat template failed to render: {exc}", param="messages") from exc
        return str(rendered)

    def _check_ids(self, token_ids: list[int], param: str) -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise BadRequestError(f"Token id {bad} is out of vocabulary (size {self.vocab_size}).", param=param)

    def _truncate(self, token_ids: list[int], request: TokenizeRequest) -> list[int]:
        keep = request.truncate_prompt_tokens
        if keep is None:
            return token_ids
        if request.image_tokens:
            # Cutting the prompt could cut an image's placeholder and leave its pixels unmatched.
            raise BadRequestError("truncate_prompt_tokens cannot be used with images.", param="truncate_prompt_tokens")
        if keep == -1:  # the context less one token, so that one can still be generated (vLLM: with a budget)
            keep = self.max_model_len - 1
        if keep > self.max_model_len:
            raise BadRequestError(
                f"truncate_prompt_tokens ({keep}) cannot exceed max_model_len ({self.max_model_len}).",
                param="truncate_prompt_tokens",
            )
        # vLLM's semantics: keep the last `keep` tokens (left truncation).
        return token_ids[-keep:] if keep < len(token_ids) else token_ids

    def _check_length(self, n: int, request: TokenizeRequest) -> int:
        if n == 0:
            raise BadRequestError("The prompt is empty.", param=request.prompt_param)
        if n >= self.max_model_len:
            raise BadRequestError.context_length_exceeded(self.max_model_len, str(n), request.prompt_param)
        room = self.max_model_len - n
        if request.max_tokens is None:
            return room
        # As vLLM 0.32 (`get_max_tokens`, `TokenizeParams`): a budget past the context is a 400, one past
        # the room this prompt leaves is cut to that room (a client that always asks for a large budget).
        if request.max_tokens > self.max_model_len:  # the ingress's check too (`validation.check_limits`)
            raise BadRequestError.budget_past_context(request.max_tokens, self.max_model_len, "max_tokens")
        return min(request.max_tokens, room)
