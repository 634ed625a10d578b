"""The typed messages that pass between stages:
ingress -> multimodal -> ingress -> tokenizer -> ingress -> llm -> ingress (-> vocoder -> ingress).

Plain frozen dataclasses: Ray pickles them between replicas, and a streamed token pays for every
byte and every object here, so they carry only what the next stage needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

_M = TypeVar("_M")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def message(cls: type[_M]) -> type[_M]:
    """A frozen, slotted dataclass that pickles as its class and its field values.

    A slotted dataclass's own pickling calls `dataclasses.fields()` on every dump and load (~15 us each
    on a 2-core EPYC); `(class, values)` takes half that, and every streamed chunk pays it twice.
    """
    out = dataclass(frozen=True, slots=True)(cls)
    every = fields(out)  # type: ignore[arg-type]
    names = [f.name for f in every if f.init and not f.kw_only]
    if not names or len(names) < len(every):
        raise TypeError(f"{cls.__name__}: a message is rebuilt from its fields in order; each must be positional")
    get = attrgetter(*names)
    if len(names) == 1:
        out.__reduce__ = lambda self: (out, (get(self),))  # type: ignore[method-assign]
    else:
        out.__reduce__ = lambda self: (out, get(self))  # type: ignore[method-assign]
    return out


@message
class Deadline:
    """The time after which no stage starts work on a request: its one form, from the ingress, which sets it
    (serve_app/ingress/pipeline/deadline.py), to every stage that checks it (`DeadlineExceededError.check`)."""

    # Wall-clock seconds (time.time()): comparable across the replicas of a cluster, unlike a monotonic clock.
    at: float

    @classmethod
    def after(cls, seconds: float, start: float | None = None) -> Deadline:
        return cls((time.time() if start is None else start) + seconds)

    def remaining(self) -> float:
        return self.at - time.time()


@message
class ImagesRequest:
    """Ingress -> multimodal: the image URLs of one request (data:, http(s): or allowed file:), in order."""

    urls: list[str]
    deadline: Deadline | None = None


@message
class ProcessedImage:
    """Multimodal -> ingress -> llm: one decoded image, already resized to the model's input size."""

    # RGB, height x width x 3, uint8: pickled inline with the message between replicas, so it counts
    # towards RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH (configs/ray.env).
    pixels: Any
    # Content hash of the encoded bytes: the engine's multimodal cache key, so it never re-hashes pixels.
    content_hash: str
    # Tokens the image occupies in the prompt once the engine expands its placeholder.
    num_tokens: int
    cache_hit: bool


@message
class ProcessedImages:
    images: list[ProcessedImage]
    elapsed_s: float


@message
class ChatPrompt:
    """A chat conversation to render with the model's chat template."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@message
class TextPrompt:
    """A completion prompt: text to tokenize, or token ids to check and pass through."""

    text: str | None = None
    token_ids: list[int] | None = None


@message
class SpeechPrompt:
    """A text-to-speech prompt: the tokenizer stage builds the talker model's prompt from it."""

    text: str
    voice: str


@message
class TokenizeRequest:
    """Ingress -> tokenizer: render, tokenize, truncate and check one prompt against the context."""

    prompt: ChatPrompt | TextPrompt | SpeechPrompt
    add_special_tokens: bool
    truncate_prompt_tokens: int | None = None
    max_tokens: int | None = None
    # `/tokenize` wants the ids even when no room is left for generation.
    check_context: bool = True
    # Prompt tokens of each image once its placeholder is expanded, for the context-length check.
    image_tokens: list[int] = field(default_factory=list)
    # `/tokenize`'s `return_token_strs`: each token's string in the vocabulary too.
    token_strs: bool = False
    deadline: Deadline | None = None

    @property
    def prompt_param(self) -> str:
        """The request field the prompt came from, named by errors about its length."""
        return {ChatPrompt: "messages", SpeechPrompt: "input"}.get(type(self.prompt), "prompt")


@message
class TokenizedPrompt:
    """Tokenizer -> ingress: the prompt as token ids and the generation budget it leaves."""

    token_ids: list[int]
    max_tokens: int
    elapsed_s: float
    # Prompt length the engine sees: image placeholders expanded to their image tokens.
    num_prompt_tokens: int = 0
    token_strs: list[str] | None = None  # when asked for


@message
class SamplingSpec:
    """Ingress -> llm: the OpenAI sampling fields, mapped 1:1 onto vLLM's SamplingParams."""

    max_tokens: int
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: int | None = None
    # The prompt's own logprobs, this many alternatives a token (completions' `echo` with `logprobs`).
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Speech: sample audio-code tokens only (the LLM stage knows which) and skip detokenizing them.
    audio_codes: bool = False
    # Not a sampling field: vLLM takes it beside SamplingParams, for an engine that schedules by priority.
    priority: int = 0
    # Not a sampling field: the first chunk carries the prompt's ids as the engine has them (`return_token_ids`:
    # with images, their placeholders expanded to image tokens, which the ingress never sees).
    return_prompt_ids: bool = False


@message
class ReplyTo:
    """Where an llm replica sends a stream's chunks: an ingress replica's token inbox (`token_channel.py`)."""

    host: str
    port: int
    secret: bytes
    key: int


@message
class GenerateRequest:
    """Ingress -> llm: token ids in, no tokenizing on the engine's path."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    images: list[ProcessedImage] = field(default_factory=list)
    deadline: Deadline | None = None


@message
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]]


@message
class ChoiceDelta:
    """New output of one choice since the previous chunk."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None


@message
class GenerationChunk:
    """Llm -> ingress: one streamed step; several engine steps may be merged into one chunk."""

    deltas: list[ChoiceDelta]
    finished: bool
    # First chunk only: seconds from submitting to the engine to its first output (queue + prefill),
    # the engine's part of the time to first token.
    engine_ttft_s: float | None = None
    # First chunk only, when the sampling asked for them: the logprobs of the prompt's tokens after its
    # first (which has none), as the engine saw them.
    prompt_logprobs: list[TokenLogprob] | None = None
    # First chunk only, when the sampling asked for them: the prompt's ids as the engine has them.
    prompt_token_ids: list[int] | None = None


@message
class VocodeRequest:
    """Ingress -> vocoder: codec frames of one stream to turn into audio.

    `frames` holds `context` frames already decoded (so the codec's receptive field sees them and the
    chunk joins its predecessor without a click) followed by the new frames; each frame is one
    codec step's codes (7 for Orpheus/SNAC).
    """

    frames: list[list[int]]
    context: int
    deadline: Deadline | None = None


@message
class AudioChunk:
    """Vocoder -> ingress: the new frames' audio as 16-bit little-endian mono PCM."""

    pcm: bytes
    elapsed_s: float
