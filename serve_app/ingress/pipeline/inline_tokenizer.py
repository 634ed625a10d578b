"""Short prompts are tokenized in the ingress itself; long ones, and those with images, in the tokenizer stage.

The stage exists so that tokenizing a long prompt (hundreds of milliseconds for 300K characters) never
holds the ingress's event loop. For a short prompt the trade is the other way round: one Ray Serve hop
to the stage costs the graph ~2-4 ms of CPU (caller and callee; the bench's per-process table), while
rendering and encoding a 1,000-character chat takes ~0.3 ms. Below `tokenizer.inline_max_chars`
characters the ingress does it on its own loop, with its own tokenizer copy used by that one thread only
(fast tokenizers are not safe to share across threads), through the same `TokenizerStage` logic, so
the result is the stage's to the token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.ingress.pipeline.clients import TokenizerClient
from serve_app.messages import ChatPrompt, SpeechPrompt, TextPrompt, TokenizedPrompt, TokenizeRequest

if TYPE_CHECKING:
    from serve_app.stages.tokenizer import TokenizerStage


def prompt_chars(prompt: ChatPrompt | TextPrompt | SpeechPrompt) -> int:
    """Characters of the prompt's text (chat: of its messages' text parts)."""
    if isinstance(prompt, ChatPrompt):
        return sum(content_chars(m.get("content")) for m in prompt.messages)
    return len(prompt.text or "")


def content_chars(content: Any) -> int:
    """Characters of a chat message's text: a string, or the text parts of a list (an image's URL or
    data is not text the tokenizer sees)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


class InlineTokenizer:
    """A `TokenizerClient`: `local` (called on the event loop) for short prompts without images, else `stage`."""

    def __init__(self, local: TokenizerStage, stage: TokenizerClient, max_chars: int) -> None:
        self._local = local
        self._stage = stage
        self._max_chars = max_chars

    @classmethod
    def around(cls, args: AppArgs, stage: TokenizerClient) -> TokenizerClient:
        """`stage` itself when the config inlines nothing, else `stage` with a local tokenizer in front."""
        max_chars = args.tokenizer.inline_max_chars
        if max_chars == 0:
            return stage
        # Imported here: an ingress that inlines nothing never loads the tokenizer library.
        from serve_app.stages.tokenizer import TokenizerStage

        return cls(TokenizerStage.from_args(args, threads=1), stage, max_chars)

    @property
    def max_chars_per_token(self) -> int | None:
        """The tokenizer's bound (`stages.tokenizer.max_chars_per_token`): the ingress refuses a prompt
        that cannot fit the context before any tokenizing (`work_admission.admit_prompt`)."""
        return self._local.max_chars_per_token

    def inlines(self, request: TokenizeRequest) -> bool:
        return not request.image_tokens and prompt_chars(request.prompt) <= self._max_chars

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        if self.inlines(request):
            return self._local.tokenize_sync(request)
        return await self._stage.tokenize(request)

    async def speech_layout(self) -> OrpheusLayout | None:
        return self._local.layout

    def __getattr__(self, method: str) -> Any:
        # Every other client method is the stage's.
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self._stage, method)
