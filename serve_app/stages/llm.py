"""LLM stage: the vLLM engine, fed token ids, streaming merged deltas back.

The engine is injected (`LLMStage(engine)`), so unit tests can drive the stage with a fake;
`LLMStage.from_args` builds the real `AsyncLLM`. The tokenizer stage has already rendered,
tokenized and length-checked the prompt, so nothing here tokenizes on the request path; the engine
only detokenizes its own output incrementally, which stop strings need.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import aclosing, contextmanager, nullcontext
from typing import Any, Protocol

from prometheus_client import Info

from serve_app.config import AppArgs
from serve_app.errors import (
    BadRequestError,
    DeadlineExceededError,
    EngineDeadError,
    OverloadedError,
    ServiceUnavailableError,
)
from serve_app.messages import ChoiceDelta, GenerateRequest, GenerationChunk, SamplingSpec, TokenLogprob
from serve_app.stages import engine_session, gloo_device, penalties, rms_norm, top_p
from serve_app.stages.engine_ipc import socket_files_removed_at_shutdown
from serve_app.stages.engine_placement import bind_engine_cores, cpu_has_native_bf16, omp_threads, resolve_dtype
from serve_app.stages.engine_watchdog import EngineWatchdog
from serve_app.stages.stream_pacing import paced
from serve_app.stages.vllm_logging import log_handlers_kept

# Serve sends this logger to the replica's log file.
logger = logging.getLogger("ray.serve")

# JSON has no -inf; vLLM's OpenAI server uses the same floor.
_LOGPROB_FLOOR = -9999.0
# In this process's default registry, which the llm deployment's `metrics_text` serves to `/metrics`.
_ENGINE_INFO = Info(
    "serve_graph_engine",
    "The dtype, cores, session, executor, top-p, penalties and RMSNorm the engine of this llm replica runs with.",
)


class Engine(Protocol):
    """The part of vLLM's `AsyncLLM` this stage uses."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncGenerator[Any, None]: ...

    async def check_health(self) -> None: ...

    def get_num_unfinished_requests(self) -> int: ...

    def shutdown(self) -> None: ...


# vLLM configures its logging while the engine is made, which closes the log handlers the replica has.
@log_handlers_kept()
def build_engine(args: AppArgs) -> Engine:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    on_cpu = current_platform.is_cpu()
    dtype = resolve_dtype(args.engine.dtype, on_gpu=not on_cpu, native_bf16=on_cpu and cpu_has_native_bf16())
    norm = rms_norm.used(args.engine.rms_norm, on_cpu=on_cpu, eager=args.engine.enforce_eager, dtype=dtype)
    placement = {
        "dtype": dtype,
        "cpu_cores": "-",
        "own_session": str(args.engine.own_session).lower(),
        "top_p": args.engine.top_p if on_cpu else "sort",
        "penalties": args.engine.penalties if on_cpu else "dense",
        "rms_norm": norm,
    }
    engine_session.request_own_session(args.engine.own_session)
    top_p.request(args.engine.top_p)
    penalties.request(args.engine.penalties)
    gloo_device.request()
    if on_cpu:
        placement["cpu_cores"] = bind_engine_cores(args.engine.cpu_cores, omp_threads())
    engine_args = AsyncEngineArgs(
        model=args.model.path,
        tokenizer=args.model.tokenizer_path,
        served_model_name=[args.model.name],
        max_model_len=args.model.max_model_len,
        trust_remote_code=args.model.trust_remote_code,
        dtype=dtype,
        enforce_eager=args.engine.enforce_eager,
        max_num_seqs=args.engine.max_num_seqs,
        scheduling_policy=args.engine.scheduling_policy,
        max_num_batched_tokens=args.engine.max_num_batched_tokens,
        gpu_memory_utilization=args.engine.gpu_memory_utilization,
        tensor_parallel_size=args.engine.tensor_parallel_size,
        enable_prefix_caching=args.engine.enable_prefix_caching,
        seed=args.engine.seed,
        stream_interval=args.engine.stream_interval,
        disable_log_stats=not args.engine.log_stats,
        model_impl=args.engine.model_impl,
        generation_config=args.engine.generation_config,
        ir_op_priority=rms_norm.priority(norm),
    )
    if args.multimodal is not None:
        # The multimodal stage enforces the same bound first, with a 400 that names it.
        engine_args.limit_mm_per_prompt = {"image": args.multimodal.max_images_per_request}
    vllm_config = engine_args.create_engine_config()
    uni = on_cpu and args.engine.executor_backend == "uni" and vllm_config.parallel_config.world_size == 1
    placement["executor"] = "uni" if uni else str(vllm_config.parallel_config.distributed_executor_backend)
    shown = (placement[k] for k in ("cpu_cores", "own_session", "executor", "top_p", "penalties", "rms_norm"))
    logger.info("engine for %s: dtype %s (asked %s), cores %s, own session %s, executor %s, top-p %s, penalties %s, "
                "RMSNorm %s", args.model.name, dtype, args.engine.dtype, *shown)  # fmt: skip
    _ENGINE_INFO.info(placement)
    with _worker_in_engine_core(vllm_config) if uni else nullcontext():
        return socket_files_removed_at_shutdown(
            lambda: AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=not args.engine.log_stats)
        )


@contextmanager
def _worker_in_engine_core(vllm_config: Any) -> Iterator[None]:
    """Let the engine core run its model worker itself (`uni`) on a CPU. vLLM's CPU platform always
    starts the worker in a process of its own (`mp`): OpenMP takes its thread count and binding from the
    environment of the process it starts in, and only the `mp` executor sets it. Here the replica sets
    the same variables (vLLM's own `OMPProcessManager`) while `AsyncLLM` starts the engine core process,
    which inherits them: one process per engine instead of two that spin waiting on each other
    (docs/benchmarks.md, section 19, the `uni` run). The binding then holds the whole engine core (its
    scheduler and socket threads too) on the engine's cores. The replica's own OpenMP read its
    environment when it imported torch, before this; any other process it started meanwhile would
    inherit the binding, and it starts none."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    vllm_config.parallel_config.distributed_executor_backend = "uni"
    with OMPProcessManager(vllm_config).configure_omp_envs(rank=0, local_rank=0):
        yield


def _client_errors() -> tuple[type[Exception], ...]:
    """Exceptions vLLM raises for a bad request: since vLLM's `VLLMClientError` hierarchy, its
    validation errors (e.g. `n=0`, `min_tokens > max_tokens`) are no longer ValueErrors."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: plain ValueError
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)


# The sampling fields a request may leave out, to the model's defaults or vLLM's.
_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def sampling_defaults(engine: Any) -> dict[str, Any]:
    """The model's sampling defaults (`engine.generation_config`: its `generation_config.json` with
    `auto`), which `vllm serve` gives every field of `_DEFAULTED` a request leaves out. Its `max_tokens`
    is not among them: a request without one gets the room its prompt leaves."""
    defaults = engine.model_config.get_diff_sampling_param()
    return {name: defaults[name] for name in _DEFAULTED if name in defaults}


def to_sampling_params(
    spec: SamplingSpec, audio_token_ids: list[int] | None = None, defaults: Mapping[str, Any] | None = None
) -> Any:
    """SamplingSpec -> vLLM SamplingParams, `defaults` for the fields it leaves out; vLLM's own range
    checks become 400s."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    optional = dict(defaults or {})
    optional.update({name: value for name in _DEFAULTED if (value := getattr(spec, name)) is not None})
    try:
        return SamplingParams(
            n=spec.n,
            max_tokens=spec.max_tokens,
            seed=spec.seed,
            stop=list(spec.stop),
            stop_token_ids=list(spec.stop_token_ids),
            ignore_eos=spec.ignore_eos,
            min_tokens=spec.min_tokens,
            logprobs=spec.logprobs,
            prompt_logprobs=spec.prompt_logprobs,
            include_stop_str_in_output=spec.include_stop_str_in_output,
            skip_special_tokens=spec.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
            **optional,
            **_audio_options(spec, audio_token_ids),
        )
    except _client_errors() as exc:
        raise BadRequestError(str(exc)) from exc


def _audio_options(spec: SamplingSpec, audio_token_ids: list[int] | None) -> dict[str, Any]:
    if not spec.audio_codes:
        return {}
    # Codes are never shown as text; a talker confined to its codebook (plus stop) cannot derail.
    options: dict[str, Any] = {"detokenize": False}
    if audio_token_ids is not None:
        options["allowed_token_ids"] = audio_token_ids
    return options


def _token_logprobs(token_ids: list[int], logprobs: list[dict[int, Any]], k: int) -> list[TokenLogprob]:
    result = []
    for token_id, candidates in zip(token_ids, logprobs, strict=False):
        chosen = candidates[token_id]
        ranked = sorted((c for c in candidates.values() if c.rank is not None and c.rank <= k),
                        key=lambda c: c.rank)  # fmt: skip
        top = [(_text(c), _floor(c.logprob), list(_text(c).encode())) for c in ranked]
        token = _text(chosen)
        result.append(TokenLogprob(token, _floor(chosen.logprob), list(token.encode()), top))
    return result


def _text(logprob: Any) -> str:
    return logprob.decoded_token or ""


def _floor(value: float) -> float:
    return _LOGPROB_FLOOR if math.isinf(value) or math.isnan(value) else max(value, _LOGPROB_FLOOR)


def to_chunk(output: Any, spec: SamplingSpec, engine_ttft_s: float | None = None) -> GenerationChunk:
    deltas = []
    for choice in output.outputs:
        logprobs = None
        if spec.logprobs is not None and choice.logprobs is not None:
            logprobs = _token_logprobs(list(choice.token_ids), list(choice.logprobs), spec.logprobs)
        deltas.append(
            ChoiceDelta(
                index=choice.index,
                text=choice.text,
                token_ids=list(choice.token_ids),
                finish_reason=choice.finish_reason,
                stop_reason=choice.stop_reason,
                logprobs=logprobs,
            )
        )
    prompt = output.prompt_token_ids or ()
    prompt_logprobs = None
    if spec.prompt_logprobs is not None and output.prompt_logprobs:  # all of them in the first output
        # vLLM's first entry is None: the first token has no logprob.
        prompt_logprobs = _token_logprobs(list(prompt[1:]), list(output.prompt_logprobs[1:]), spec.prompt_logprobs)
    prompt_ids = list(prompt) if spec.return_prompt_ids and engine_ttft_s is not None else None  # the first chunk's
    return GenerationChunk(deltas, output.finished, engine_ttft_s, prompt_logprobs, prompt_ids)


class LLMStage:
    """Runs generation requests on one engine."""

    def __init__(
        self,
        engine: Engine,
        audio_token_ids: list[int] | None = None,
        max_seqs: int | None = None,
        watchdog: EngineWatchdog | None = None,
        stream_interval_s: float = 0.0,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self._engine = engine
        self._defaults = defaults  # `sampling_defaults`: what a request leaves out
        # At most one chunk per this many seconds after the first (`engine.stream_interval_ms`).
        self._stream_interval_s = stream_interval_s
        self._watchdog = watchdog if watchdog is not None else EngineWatchdog(None)
        self._audio_token_ids = audio_token_ids
        # Engine slots plus its waiting queue (`max_num_seqs + max_waiting_requests`); None: unbounded.
        self._max_seqs = max_seqs
        # Sequences submitted and not finished; counted here, not asked of the engine, so concurrent
        # admissions cannot all pass the check before any of them reaches the engine.
        self._seqs = 0

    @staticmethod
    def parts(args: AppArgs) -> tuple[Engine, list[int] | None, int, EngineWatchdog, float, dict[str, Any]]:
        """The constructor's arguments for `args`: this builds the engine."""
        audio_token_ids = None
        if args.tts is not None and args.tts.constrain_to_audio_tokens:
            from transformers import AutoTokenizer

            from serve_app.codecs.orpheus import OrpheusLayout

            tokenizer = AutoTokenizer.from_pretrained(
                args.model.tokenizer_path, trust_remote_code=args.model.trust_remote_code
            )
            layout = OrpheusLayout.from_tokenizer(tokenizer)
            audio_token_ids = [*layout.audio_token_ids(), layout.stop_id]
        max_seqs = args.engine.max_num_seqs + args.engine.max_waiting_requests
        watchdog = EngineWatchdog(args.engine.watchdog_timeout_s)
        engine = build_engine(args)
        defaults = sampling_defaults(engine)
        logger.info("sampling defaults of %s (generation_config %s): %s", args.model.name,
                    args.engine.generation_config, defaults or "vLLM's")  # fmt: skip
        return engine, audio_token_ids, max_seqs, watchdog, args.engine.stream_interval_ms / 1000, defaults

    @classmethod
    def from_args(cls, args: AppArgs) -> LLMStage:
        return cls(*cls.parts(args))

    # `generate`, `check_health` and `metrics_text` are the `LLMClient` methods: what the ingress calls
    # in-process. The deployment (`deployments/llm.py`, a subclass) answers `check_health` as it is,
    # `metrics_text` from its process's registry, and runs `generate` inside `generate_to`, whose chunks
    # take the token channel.

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.inputs import TokensInput, TokensPrompt, tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        DeadlineExceededError.check(request.deadline, "llm")
        params = to_sampling_params(request.sampling, self._audio_token_ids, self._defaults)
        prompt: TokensPrompt | TokensInput
        if request.images:
            # A raw prompt: vLLM's renderer runs the model's multimodal processor on it, in its thread pool.
            prompt = TokensPrompt(
                prompt_token_ids=request.prompt_token_ids,
                multi_modal_data={"image": [image.pixels for image in request.images]},
                multi_modal_uuids={"image": [image.content_hash for image in request.images]},
            )
        else:
            # Already rendered (token ids): vLLM checks it on this loop, as it does for `vllm serve`, instead
            # of handing it to its renderer's thread pool: a thread switch a request (0.78 against 0.63 ms
            # of CPU a one-token request, docs/benchmarks-notes.md, stop 44).
            prompt = tokens_input(request.prompt_token_ids)
        n = self._admit(request.sampling.n)
        submitted = time.perf_counter()
        first = True
        # aclosing: if our caller goes away (client disconnect cancels the Serve call), the engine's
        # generator is closed now, which aborts the request in the engine, not whenever GC runs.
        try:
            engine_outputs = self._engine.generate(
                prompt, params, request.request_id, priority=request.sampling.priority
            )
            async with (
                aclosing(engine_outputs) as outputs,
                aclosing(paced(outputs, self._watchdog.next_output, self._stream_interval_s)) as chunks,
            ):
                async for output in chunks:
                    yield to_chunk(output, request.sampling, time.perf_counter() - submitted if first else None)
                    first = False
        except VLLMEngineDeadError as exc:
            raise EngineDeadError(f"The engine died: {exc}") from exc
        except _client_errors() as exc:
            # vLLM checks a request when it takes it, before its first output; a ValueError or TypeError
            # after that is a fault of ours or the engine's, not the client's 400.
            if not first:
                raise
            raise BadRequestError(str(exc)) from exc
        finally:
            self._seqs -= n

    def _admit(self, n: int) -> int:
        """Count `n` sequences in, or refuse them while the engine's slots and waiting queue are full."""
        if self._max_seqs is not None:
            if n > self._max_seqs:
                raise BadRequestError(
                    f"n is {n}; this engine holds at most {self._max_seqs} sequences at once.", param="n"
                )
            if self._seqs + n > self._max_seqs:
                raise OverloadedError(
                    f"The engine's waiting queue is full ({self._seqs} sequences in progress); retry later.",
                    code="overloaded",
                    stage="llm",
                    reason="engine_queue_full",
                )
        self._seqs += n
        return n

    async def check_health(self) -> None:
        self._watchdog.check()
        try:
            await self._engine.check_health()
        except Exception as exc:
            raise ServiceUnavailableError(f"engine unhealthy: {exc}") from exc

    async def metrics_text(self) -> str:
        """The engine's metrics for the ingress's `/metrics`. In one process they are already in the
        ingress's registry; the deployment answers with its own process's."""
        return ""

    def num_unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests()

    def shutdown(self) -> None:
        self._engine.shutdown()
