"""Admission set up for the tests of its parts: a work gate on a test clock, the engine decoding against
it, and fixed rates for the HAProxy gate's tests."""

from __future__ import annotations

from serve_app.config import AdmissionConfig, AppArgs
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.work_admission import WorkGate, WorkTicket
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import Clock, FakeLLM


def learning_gate(clock: Clock) -> WorkGate:
    # 10 ms per generated token, 90 s of wait; max_num_seqs 16: busy from 4 live requests.
    return WorkGate(prefill_tokens_per_s=1e6, decode_tokens_per_s=100, max_wait_s=90, max_num_seqs=16, clock=clock)


def decode(clock: Clock, tickets: list[WorkTicket], seconds: float, tokens_per_s: float) -> None:
    """The engine generates `tokens_per_s` over the batch, spread evenly over `tickets`, for `seconds`."""
    for _ in range(round(seconds * 10)):
        clock.now += 0.1
        for ticket in tickets:
            ticket.generated(round(tokens_per_s * 0.1 / len(tickets)))


RATES = AdmissionConfig(prefill_tokens_per_s=1000, decode_tokens_per_s=100, max_wait_s=4.5, status_code=429,
                        retry_after_s=7, learn_speed=False)  # fmt: skip


def gated(app_args: AppArgs, tokenizer_stage: TokenizerStage, admission: AdmissionConfig = RATES) -> Services:
    """The app's services with `admission`'s rates, on a fake engine."""
    return Services.create(app_args.model_copy(update={"admission": admission}), tokenizer_stage, FakeLLM())
