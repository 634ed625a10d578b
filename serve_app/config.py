"""Application arguments: the `args:` block of a Serve config YAML, validated once at startup.

Deployment options (replicas, autoscaling, `max_ongoing_requests`, `max_queued_requests`, resources)
are not here: they live in the YAML's `deployments:` list, where Ray Serve itself validates them.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_validator

from serve_app.engine_config import EngineConfig
from serve_app.strict_args import Strict, parse_args


class ModelConfig(Strict):
    path: str = Field(
        description="Local model directory, or a Hugging Face model id (downloaded by vLLM on first use).",
        min_length=1,
    )
    served_model_name: str | None = Field(
        default=None, description="Name clients pass as `model`; defaults to the directory or id name."
    )
    tokenizer: str | None = Field(default=None, description="Tokenizer directory or id; defaults to `path`.")
    max_model_len: int = Field(
        ge=16, le=10_000_000, description="Context length in tokens: prompt plus generated tokens."
    )
    trust_remote_code: bool = Field(
        default=False, description="Run Python code shipped with the model. Off unless you trust the model."
    )

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.path.rstrip("/")).name

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.path


class TokenizerStageConfig(Strict):
    threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Worker threads per tokenizer replica; each owns its own tokenizer copy, never shared.",
    )
    inline_max_chars: int = Field(
        default=2048,
        ge=0,
        le=100_000,
        description="Prompts (without images) of at most this many characters are tokenized by the ingress "
        "itself, sparing them the hop to the tokenizer stage, which costs more CPU than tokenizing them "
        "(serve_app/ingress/pipeline/inline_tokenizer.py); 0 sends every prompt to the stage.",
    )


class LimitsConfig(Strict):
    max_n: int = Field(default=16, ge=1, le=256, description="Largest `n` (choices per request) accepted.")
    max_logprobs: int = Field(default=20, ge=0, le=100, description="Largest `logprobs`/`top_logprobs`.")
    max_prompts_per_request: int = Field(
        default=64, ge=1, le=4096, description="Largest list of prompts in one `/v1/completions` request."
    )
    max_request_bytes: int = Field(
        default=32 * 2**20, ge=1024, le=2**31, description="Largest HTTP request body, images included."
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Largest `max_tokens`/`max_completion_tokens` accepted (400 above), and the most a request "
        "that gives none generates (its route's default otherwise: 16 for completions, what the context leaves "
        "after the prompt for chat); unset: no cap but the context (`model.max_model_len`).",
    )
    request_timeout_s: float | None = Field(
        default=None,
        gt=0.0,
        le=86_400.0,
        description="Deadline of a generation request (chat, completions, speech) when it sends no "
        "`X-Request-Timeout` header; unset: none. Past it every stage stops work on the request: 504 "
        "`deadline_exceeded`, or an error event when the stream has started.",
    )
    max_request_timeout_s: float = Field(
        default=3600.0,
        gt=0.0,
        le=86_400.0,
        description="Cap on the `X-Request-Timeout` header: a larger value is lowered to this.",
    )


class ImageFetchConfig(Strict):
    timeout_s: float = Field(default=10.0, gt=0.0, le=120.0, description="Time limit for fetching one image URL.")
    max_redirects: int = Field(default=3, ge=0, le=10, description="Redirects followed; each target is re-checked.")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts, IP addresses or CIDR networks that may be fetched although they are loopback, "
        "private, link-local or otherwise non-public (refused by default: server-side request forgery).",
    )
    allowed_local_dir: str | None = Field(
        default=None, description="Directory whose files `file://` URLs may read; `file://` is refused when unset."
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_addresses_or_names(cls, hosts: list[str]) -> list[str]:
        # An entry that is neither would match no URL: a typo must not leave a host silently refused.
        for host in hosts:
            host_entry(host)
        return hosts


_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*")


def host_entry(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | str:
    """An `allowed_hosts` entry: its network (an address is a network of one), or its host name lower-cased
    without a trailing dot; ValueError when it is neither."""
    try:
        return ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        name = entry.lower().rstrip(".")
        if not _HOST_NAME.fullmatch(name):
            raise ValueError(f"{entry!r} is not a host name, an IP address or a CIDR network") from None
        return name


ImageFormat = Literal["PNG", "JPEG", "WEBP", "GIF", "BMP"]


def _all_image_formats() -> list[ImageFormat]:
    return list(get_args(ImageFormat))


class MultimodalConfig(Strict):
    """Image inputs; the multimodal deployment exists only when this block is in the YAML."""

    max_image_bytes: int = Field(
        default=10 * 2**20, ge=1024, le=2**30, description="Largest encoded image (after base64 decoding or fetching)."
    )
    max_image_pixels: int = Field(
        default=25_000_000,
        ge=64,
        # Pillow refuses more than twice its MAX_IMAGE_PIXELS (~179M) when it opens a file.
        le=178_000_000,
        description="Largest width x height, checked from the header before decoding (decompression bombs).",
    )
    max_images_per_request: int = Field(default=4, ge=1, le=64, description="Images in one request, all messages.")
    formats: list[ImageFormat] = Field(
        default_factory=_all_image_formats,
        min_length=1,
        description="Image formats accepted, as detected from the bytes (never from the URL or MIME type).",
    )
    threads: int = Field(default=2, ge=1, le=64, description="Decode/resize worker threads per replica.")
    cache_entries: int = Field(
        default=256, ge=0, le=100_000, description="Processed images kept per replica, keyed by content hash; 0: off."
    )
    fetch: ImageFetchConfig = Field(default_factory=ImageFetchConfig, description="Fetching `http(s)` image URLs.")


class TtsConfig(Strict):
    """Text-to-speech (`/v1/audio/speech`) with an Orpheus-style talker; the vocoder deployment exists
    only when this block is in the YAML."""

    codec: str = Field(
        min_length=1,
        description="SNAC codec directory or HF id (e.g. hubertsiuzdak/snac_24khz) the vocoder decodes with.",
    )
    voices: list[str] = Field(min_length=1, description="Voices the talker knows; any other is a 400.")
    max_input_chars: int = Field(default=4096, ge=1, le=100_000, description="Longest `input` accepted.")
    max_audio_s: float = Field(default=60.0, gt=0.0, le=3600.0, description="Cap on one response's audio.")
    audio_s_per_char: float = Field(
        default=0.2,
        gt=0.0,
        le=10.0,
        description="Per-request cap on audio: 1 s plus this per input character (never above max_audio_s); "
        "a talker that never emits its stop token still ends.",
    )
    constrain_to_audio_tokens: bool = Field(
        default=True, description="Let the talker sample only audio-code tokens and its stop token."
    )
    temperature: float = Field(default=0.6, ge=0.0, le=2.0, description="Talker sampling temperature.")
    top_p: float = Field(default=0.8, gt=0.0, le=1.0, description="Talker nucleus sampling.")
    repetition_penalty: float = Field(default=1.1, gt=0.0, le=2.0, description="Talker repetition penalty.")
    first_chunk_frames: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Codec frames in the first audio chunk (an Orpheus/SNAC frame is ~85 ms of audio). Fewer: "
        "sooner first audio. More: more audio in hand for a player that starts at the first chunk, so fewer "
        "underruns when the talker is only a little faster than real time (the CPU config: 4).",
    )
    chunk_frames: int = Field(
        default=8,
        ge=1,
        le=256,
        description="The most codec frames in a later audio chunk. A later chunk holds half the frames sent "
        "before it, at least `first_chunk_frames` and at most this, so that a player that starts at the first "
        "chunk is not left waiting by a talker faster than real time.",
    )
    context_frames: int = Field(
        default=2, ge=0, le=16, description="Frames decoded again before each chunk, so chunks join without clicks."
    )
    max_chunks_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Credits per stream: vocoder calls one stream may have outstanding. A slow vocoder or "
        "client stops that stream's reading of the talker, and no other stream's.",
    )
    max_streams: int = Field(
        default=8,
        ge=1,
        le=10_000,
        description="Speech streams one ingress replica admits at once; more wait (`max_waiting_streams`) or "
        "get 503 + Retry-After instead of slowing every admitted stream below real time.",
    )
    max_waiting_streams: int = Field(
        default=8,
        ge=0,
        le=10_000,
        description="Speech requests that wait, in arrival order and within their deadline, for one of the "
        "`max_streams` to end; more get 503 + Retry-After at once.",
    )
    codec_threads: int = Field(default=1, ge=1, le=64, description="Torch threads per vocoder replica.")
    sample_rate: int = Field(default=24_000, ge=8_000, le=192_000, description="The codec's output rate (SNAC 24 kHz).")
    samples_per_frame: int = Field(
        default=2048, ge=1, le=65_536, description="Audio samples per codec frame (SNAC 24 kHz: 2048)."
    )


class AuthConfig(Strict):
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Bearer tokens accepted in `Authorization`; with any set (here or from `api_keys_env`), "
        "every route but `/health` requires one.",
    )
    api_keys_env: str | None = Field(
        default=None,
        description="Environment variable (of the ingress replica) holding more keys, comma-separated: keeps "
        "them out of the YAML.",
    )
    max_concurrent_per_key: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests (streams included, held until their last byte) one key may have in progress on "
        "one ingress replica; more get 429 + Retry-After. Only with keys configured; unset: no limit.",
    )


class AdmissionConfig(Strict):
    """What the ingress admits and how it answers a request it does not: the engine's expected wait over
    `max_wait_s` or the request's deadline (`expected_wait`, admission by work from the two rates), the
    ingress at `max_in_flight` (`ingress_full`), a stage at its queue limit (`stage_full`), the engine's
    waiting queue full (`engine_queue_full`), `tts.max_streams` speech streams (`max_streams`)."""

    status_code: Literal[503, 429] = Field(
        default=503, description="HTTP status of a rejection: 503 (server busy) or 429 (clients that back off on it)."
    )
    retry_after_s: int = Field(
        default=1, ge=0, le=3600,
        description="Seconds in the `Retry-After` of a rejection (also of a key over `auth.max_concurrent_per_key`).",
    )  # fmt: skip
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Generation requests (chat, completions, speech) one ingress replica holds at once, streams "
        "included; more are refused (reason `ingress_full`). Set it below the ingress deployment's "
        "`max_ongoing_requests`, whose overflow Serve's proxy refuses with a plain-text 503. Unset: no limit here. "
        "With several models one ingress holds them all: its bound is the sum of the models' limits.",
    )
    prefill_tokens_per_s: float | None = Field(
        default=None,
        gt=0.0,
        le=1e9,
        description="Admission by work (serve_app/ingress/pipeline/work_admission.py): prompt tokens per second "
        "the engine prefills when saturated (`python -m load.ceiling` measures it). With `decode_tokens_per_s`, "
        "a request is admitted only while the work admitted before it, plus its own, fits in `max_wait_s` and its "
        "deadline (reason `expected_wait`). Unset: requests are admitted by count only.",
    )
    decode_tokens_per_s: float | None = Field(
        default=None,
        gt=0.0,
        le=1e9,
        description="Tokens per second the engine generates over its whole batch when saturated; with "
        "`prefill_tokens_per_s`. A request weighs its `max_tokens` (when it gives none, a chat what the context "
        "leaves, a completion 16, speech its audio cap).",
    )
    max_wait_s: float = Field(
        default=10.0,
        gt=0.0,
        le=3600.0,
        description="With the two rates set: the longest a request may expect to wait for the engine to clear "
        "the work admitted before it; longer is refused at once rather than queued.",
    )

    learn_speed: bool = Field(
        default=True,
        description="With the two rates set: measure how fast the engine clears admitted work and scale every "
        "expected wait by it (serve_app/ingress/pipeline/engine_speed.py: busy windows, a quarter of "
        "`engine.max_num_seqs` requests live or more, move it either way; quieter ones only raise it back towards "
        "the rates), so that rates measured on one machine admit about what another clears "
        "(`serve_graph_admission_speed` shows it). False: the rates as given.",
    )

    @model_validator(mode="after")
    def _rates_together(self) -> AdmissionConfig:
        if (self.prefill_tokens_per_s is None) != (self.decode_tokens_per_s is None):
            raise ValueError("prefill_tokens_per_s and decode_tokens_per_s are set together, or neither")
        return self


class HealthConfig(Strict):
    poll_interval_s: float = Field(
        default=2.0, gt=0.0, le=60.0, description="How often the ingress checks the stages in the background."
    )
    timeout_s: float = Field(default=5.0, gt=0.0, le=60.0, description="Time a stage has to answer a check.")


class AppArgs(Strict):
    """Everything `deployments.graph:build_app` needs; the YAML `args:` block maps onto it."""

    model: ModelConfig = Field(description="The chat/completion model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM engine options.")
    tokenizer: TokenizerStageConfig = Field(
        default_factory=TokenizerStageConfig, description="Tokenizer stage options."
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Request limits.")
    multimodal: MultimodalConfig | None = Field(
        default=None, description="Image inputs for a vision-language model; leave out for a text-only model."
    )
    tts: TtsConfig | None = Field(
        default=None, description="Text-to-speech with an Orpheus-style talker; leave out for other models."
    )
    health: HealthConfig = Field(default_factory=HealthConfig, description="Background health checks.")
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Admission under load (by expected work and by count) and the status and Retry-After of a refusal.",
    )
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Optional API keys.")

    @property
    def max_budget(self) -> int:
        """The most tokens a request may ask to generate: the context, or `limits.max_tokens` if lower."""
        return min(self.model.max_model_len, self.limits.max_tokens or self.model.max_model_len)

    @model_validator(mode="after")
    def _local_paths_absolute(self) -> AppArgs:
        # Replicas do not share the launcher's working directory, so a relative local path is pinned
        # here, in the process that read the YAML.
        updates: dict[str, Any] = {}
        for field in ("path", "tokenizer"):
            value = getattr(self.model, field)
            if value and Path(value).exists() and not Path(value).is_absolute():
                updates[field] = str(Path(value).resolve())
        if updates:
            object.__setattr__(self, "model", self.model.model_copy(update=updates))
        if self.tts is not None and Path(self.tts.codec).exists() and not Path(self.tts.codec).is_absolute():
            object.__setattr__(self, "tts", self.tts.model_copy(update={"codec": str(Path(self.tts.codec).resolve())}))
        return self


def parse_app_args(raw: dict[str, Any] | AppArgs) -> AppArgs:
    return parse_args(AppArgs, raw)
