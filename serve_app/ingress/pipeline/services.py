"""What the ingress holds per model: its config, its stages (as clients), its metrics, health and
admission state (`Services`), and the graph's models by name (`ModelRouter`, `router.py`).

Each model keeps its own limits, admission (work gate, speech slots) and health: one model that is
full or down does not refuse requests for another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.ingress.observability.health import HealthMonitor
from serve_app.ingress.observability.metrics import IngressMetrics
from serve_app.ingress.pipeline.clients import LLMClient, MultimodalClient, TokenizerClient, VocoderClient
from serve_app.ingress.pipeline.inline_tokenizer import InlineTokenizer
from serve_app.ingress.pipeline.slots import Slots
from serve_app.ingress.pipeline.work_admission import WorkGate


@dataclass
class Services:
    """What the ingress needs: the config, the stages and its own metrics and health."""

    args: AppArgs
    tokenizer: TokenizerClient
    llm: LLMClient
    metrics: IngressMetrics
    health: HealthMonitor
    # None: the model takes text only.
    multimodal: MultimodalClient | None = None
    # None: the model does not speak.
    vocoder: VocoderClient | None = None
    # The talker's token layout, asked of the tokenizer stage at the first speech request.
    speech_layout: OrpheusLayout | None = None
    # Stages this process owns (in-process stages only; deployments clean up after themselves).
    closers: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)
    # Speech streams of this replica: `tts.max_streams` speaking, `tts.max_waiting_streams` waiting.
    speech_slots: Slots = field(init=False)
    # Admission by work (`admission.prefill_tokens_per_s`/`decode_tokens_per_s`); None: by count only.
    work: WorkGate | None = field(init=False)

    def __post_init__(self) -> None:
        tts = self.args.tts
        self.speech_slots = Slots(tts.max_streams, tts.max_waiting_streams) if tts else Slots(0, 0)
        admission = self.args.admission
        self.work = None
        if admission.prefill_tokens_per_s is not None and admission.decode_tokens_per_s is not None:
            seqs = self.args.engine.max_num_seqs if admission.learn_speed else None
            work = WorkGate(
                admission.prefill_tokens_per_s, admission.decode_tokens_per_s, admission.max_wait_s, max_num_seqs=seqs
            )
            self.metrics.show_admission_speed(lambda: work.speed)
            if isinstance(self.tokenizer, InlineTokenizer):  # the ingress's own tokenizer copy knows its bound
                work.max_chars_per_token = self.tokenizer.max_chars_per_token
            self.work = work

    @classmethod
    def create(
        cls,
        args: AppArgs,
        tokenizer: TokenizerClient,
        llm: LLMClient,
        multimodal: MultimodalClient | None = None,
        vocoder: VocoderClient | None = None,
    ) -> Services:
        checks = {"tokenizer": tokenizer.check_health, "llm": llm.check_health}
        for name, stage in (("multimodal", multimodal), ("vocoder", vocoder)):
            if stage is not None:
                checks[name] = stage.check_health
        monitor = HealthMonitor(checks, args.health.poll_interval_s, args.health.timeout_s)
        return cls(args, tokenizer, llm, IngressMetrics(), monitor, multimodal, vocoder)

    async def close(self) -> None:
        await self.health.stop()
        for close in reversed(self.closers):
            result = close()
            if result is not None:
                await result
