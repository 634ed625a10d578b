"""The vLLM engine's options: the `engine:` block of a model's `args:` (`serve_app/config.py` holds the rest)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_app.strict_args import Strict

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
TopP = Literal["histogram", "sort"]
Penalties = Literal["sparse", "dense"]
RmsNorm = Literal["kernel", "native"]


class EngineConfig(Strict):
    dtype: Dtype = Field(
        default="auto",
        description="Weight and activation dtype. `auto`: the checkpoint's on a GPU; on a CPU bfloat16 where it "
        "is native (AVX512-BF16/AMX), else float32 (emulated bfloat16 decodes ~5x slower). The llm replica logs "
        "its choice and `/metrics` shows it (`serve_graph_engine_info`).",
    )
    cpu_cores: str = Field(
        default="spread",
        pattern=r"^(spread|auto|nobind|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)$",
        description="CPU engines only: the cores the engine's OpenMP threads are bound to. `spread`: the cores "
        "of its node that the fewest other engines hold (as many as OMP_NUM_THREADS, default 1), so engines "
        "on one node never share a core while another idles; `auto`: vLLM's own binding (one core kept for "
        "an API server, every engine on the rest); `nobind`; or a core list such as `1` or `0-3,8`.",
    )
    own_session: bool = Field(
        default=True,
        description="Run the engine's processes in a Linux session of their own, at a lower weight. With autogroup "
        "scheduling (on in most distributions) the kernel then shares the CPU between the engine, which keeps a "
        "core busy while generating, and the rest of the graph (ingress, /health, replicas) before it shares it "
        "among processes; in one session with them the engine starved them (serve_app/stages/engine_session.py).",
    )
    executor_backend: Literal["uni", "mp"] = Field(
        default="uni",
        description="CPU engines only: where the engine runs its model. `uni`: in the engine core's own "
        "process. `mp`: in a worker process of its own, as vLLM's CPU platform always does (`vllm serve` on a "
        "CPU cannot be told otherwise); the two processes spin while each waits for the other, ~1.6 cores "
        "under any load, where `uni` keeps ~0.8 busy and serves more (docs/benchmarks.md, section 19, `uni`). "
        "An engine of several workers (`tensor_parallel_size` > 1) always runs them in processes of their own.",
    )
    top_p: TopP = Field(
        default="histogram",
        description="CPU engines only: how the engine applies a request's top-p. `histogram`: finds the "
        "nucleus's smallest probability from a histogram and sorts only the tokens near it, the same tokens "
        "kept (serve_app/stages/top_p.py). `sort`: vLLM's own, which sorts every row of logits at every step: "
        "the default talker made 60.4 tokens/s with it against 74.1 (docs/benchmarks.md, sections 54-55).",
    )
    penalties: Penalties = Field(
        default="sparse",
        description="CPU engines only: how the engine applies a batch's repetition penalties when it has no "
        "presence or frequency penalty. `sparse`: to the logits of the tokens each sequence has seen only, "
        "the same logits out (serve_app/stages/penalties.py, which says what that saves). `dense`: vLLM's own, "
        "which builds tables the size of the vocabulary at every step.",
    )
    rms_norm: RmsNorm = Field(
        default="kernel",
        description="Eager (`enforce_eager`) float32 CPU engines only, others run `native`: what runs the model's "
        "RMSNorm layers. `kernel`: the C++ kernels of vLLM's CPU build, ~10x faster a call "
        "(serve_app/stages/rms_norm.py). `native`: vLLM's own choice on a CPU, PyTorch ops one by one.",
    )
    enforce_eager: bool = Field(
        default=False, description="Skip torch.compile and graph capture: much faster start, slower decode."
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="How the engine orders requests waiting for one of its `max_num_seqs` slots. `fcfs`: by "
        "arrival. `priority`: by the request's `priority` (lower first, then arrival; vLLM's "
        "`--scheduling-policy priority`), which also picks the running request to preempt when the KV cache is "
        "full; it never frees a slot for a waiting request. Requests that set a `priority` other than 0 are "
        "refused (400) by an engine that schedules `fcfs`.",
    )
    max_num_seqs: int = Field(default=256, ge=1, le=4096, description="Sequences the engine schedules in one step.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=16, le=10_000_000, description="Token budget of one engine step; vLLM picks one when unset."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Share of GPU memory vLLM may use (GPU only)."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one engine spans.")
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="Reuse KV cache across prompts with a common prefix; vLLM default when unset.",
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Engine seed for requests that give none.")
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Tokens the engine gathers before it emits a streamed chunk. Each chunk pays the "
        "llm->ingress->proxy hops, so a few tokens per chunk saves CPU under load; the first token is "
        "never held back.",
    )
    stream_interval_ms: float = Field(
        default=0.0,
        ge=0.0,
        le=1000.0,
        description="At most one streamed chunk per this many milliseconds after the first: outputs the engine "
        "emits sooner wait, at most that long, and go out merged with the ones after them. Each chunk costs the "
        "same CPU in the llm replica, the ingress and the proxy, so when the engine decodes fast this cuts the "
        "CPU per request; the first chunk and the last are never held, so it adds nothing to the time to first "
        "token or to the end, only changes how often a stream's text arrives. 0: every output goes out as it comes.",
    )
    log_stats: bool = Field(
        default=True, description="Collect engine statistics (vLLM's Prometheus metrics in `/metrics`)."
    )
    model_impl: Literal["auto", "vllm", "transformers"] = Field(
        default="auto",
        description="vLLM's own model code, or its Transformers backend. The CPU vision config needs "
        "`transformers`: vLLM's LLaVA code imports torchvision, which has no CPU build for this torch.",
    )
    generation_config: Literal["auto", "vllm"] = Field(
        default="auto",
        description="Sampling defaults for what a request leaves out (temperature, top_p, top_k, min_p and the "
        "penalties): `auto` the model's `generation_config.json`, as `vllm serve`; `vllm` vLLM's neutral ones.",
    )
    watchdog_timeout_s: float | None = Field(
        default=60.0,
        ge=1.0,
        le=3600.0,
        description="Engine hang watchdog: with requests waiting on the engine and no output from it for this "
        "long, the llm stage declares the engine hung: its requests fail with 503, its health check fails (Serve "
        "replaces the replica). Longer than the slowest prefill the engine may run; null turns it off.",
    )
    max_waiting_requests: int = Field(
        default=256,
        ge=0,
        le=1_000_000,
        description="Sequences that may wait for one of the engine's `max_num_seqs` slots (a request with `n` "
        "choices counts `n`); beyond that the llm stage answers 503/429 with Retry-After (reason "
        "`engine_queue_full`) instead of queueing. On top of the llm deployment's `max_queued_requests`.",
    )
