"""serve_app/ingress/pipeline/work_admission.py: admission by the engine time a request needs."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.config import AdmissionConfig, AppArgs
from serve_app.errors import BadRequestError, OverloadedError
from serve_app.ingress.pipeline.generation import start_generation
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.work_admission import WorkGate, admit_prompt
from serve_app.messages import (
    SamplingSpec,
    TextPrompt,
    TokenizeRequest,
)
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.admission_support import decode, learning_gate
from tests.unit.conftest import Clock, CountingTokenizer, FakeLLM, HeldLLM


def gate(max_wait_s: float = 10.0) -> WorkGate:
    # 1 ms per prompt token, 10 ms per generated token (batch-wide).
    return WorkGate(prefill_tokens_per_s=1000, decode_tokens_per_s=100, max_wait_s=max_wait_s)


def test_a_burst_of_one_token_requests_is_admitted_where_long_generations_are_not() -> None:
    short = gate()
    tickets = [short.admit(prompt_tokens=256, max_tokens=1) for _ in range(35)]  # 0.266 s each: 9.3 s
    assert len(tickets) == 35 and short.backlog_s == pytest.approx(35 * 0.266)
    long = gate()
    admitted = 0
    with pytest.raises(OverloadedError) as refused:
        for _ in range(400):
            long.admit(prompt_tokens=256, max_tokens=256)  # 2.816 s each
            admitted += 1
    assert admitted == 3
    assert refused.value.reason == "expected_wait" and refused.value.status_code == 503


def test_progress_and_release_pay_the_backlog_off() -> None:
    g = gate()
    ticket = g.admit(prompt_tokens=100, max_tokens=10)  # 0.1 + 0.1 s
    ticket.generated(1)  # prefill done and one token
    assert g.backlog_s == pytest.approx(0.09)
    ticket.generated(50)  # more than it asked for pays no more than it owes
    assert g.backlog_s == pytest.approx(0.0)
    other = g.admit(prompt_tokens=100, max_tokens=10)
    other.release()
    other.release()  # idempotent: a stream closed twice
    assert g.backlog_s == pytest.approx(0.0)


def test_a_deadline_shorter_than_the_wait_is_refused_at_once() -> None:
    g = gate()
    g.admit(prompt_tokens=1000, max_tokens=0)  # 1 s of backlog
    with pytest.raises(OverloadedError, match=r"more than the 0\.5 s"):
        g.admit(prompt_tokens=10, max_tokens=10, deadline_s=0.5)
    assert g.admit(prompt_tokens=10, max_tokens=10, deadline_s=2.0).remaining_s == pytest.approx(0.11)


def test_no_float_residue_keeps_an_idle_engine_busy() -> None:
    g = WorkGate(prefill_tokens_per_s=16000, decode_tokens_per_s=5000, max_wait_s=5)
    for _ in range(4):
        ticket = g.admit(prompt_tokens=7, max_tokens=30)
        ticket.generated(3)
        ticket.release()
    assert g.backlog_s == 0.0 and g.live == 0
    g.admit(prompt_tokens=4000, max_tokens=30000)  # idle: admitted however large


def test_an_idle_engine_admits_a_request_larger_than_the_budget() -> None:
    g = gate(max_wait_s=1.0)
    big = g.admit(prompt_tokens=4000, max_tokens=4000)  # 44 s alone
    with pytest.raises(OverloadedError):
        g.admit(prompt_tokens=1, max_tokens=1)
    big.release()
    g.admit(prompt_tokens=1, max_tokens=1)


async def test_the_request_path_holds_work_until_the_stream_ends(
    app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    # 10 tokens generated take 1 s: a second 6-token request does not fit in 1 s behind the first.
    admission = AdmissionConfig(prefill_tokens_per_s=1e6, decode_tokens_per_s=10, max_wait_s=1.0)
    llm = HeldLLM()
    services = Services.create(app_args.model_copy(update={"admission": admission}), tokenizer_stage, llm)
    tokenize = TokenizeRequest(TextPrompt(text="hello"), add_special_tokens=True)

    def spec(budget: int) -> SamplingSpec:
        return SamplingSpec(max_tokens=min(budget, 6))

    stream = await start_generation(services, tokenize, spec, "a")
    assert services.work is not None and services.work.backlog_s == pytest.approx(0.5, abs=0.01)  # 1 of 6 done
    with pytest.raises(OverloadedError, match="it may wait"):
        await start_generation(services, tokenize, spec, "b")
    llm.release.set()
    assert sum(len(d.token_ids) for c in [c async for c in stream.chunks()] for d in c.deltas) == 6
    assert services.work.backlog_s == 0.0
    closed = await start_generation(services, tokenize, spec, "c")
    await closed.close()  # a client gone mid-stream gives its work back too
    assert services.work.backlog_s == 0.0


def test_a_ticket_takes_its_real_size_and_the_gate_learns_tokens_per_char() -> None:
    g = gate()
    ticket = g.admit(prompt_tokens=g.estimate_tokens(1000), max_tokens=10)  # 300 tokens guessed: 0.4 s
    assert g.backlog_s == pytest.approx(0.4)
    ticket.resize(prompt_tokens=250, max_tokens=20)  # 0.25 + 0.2 s
    assert g.backlog_s == pytest.approx(0.45)
    for _ in range(30):
        g.learn(chars=1000, tokens=250)
    assert abs(g.estimate_tokens(1000) - 250) <= 1


async def test_a_request_is_refused_before_the_tokenizer_sees_it(
    app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    admission = AdmissionConfig(prefill_tokens_per_s=150, decode_tokens_per_s=1e6, max_wait_s=1.0)
    tokenizer = CountingTokenizer(tokenizer_stage)
    services = Services.create(app_args.model_copy(update={"admission": admission}), tokenizer, FakeLLM())
    assert services.work is not None
    ahead = services.work.admit(prompt_tokens=100, max_tokens=0)  # 0.67 s of admitted work, not yet started

    def spec(budget: int) -> SamplingSpec:
        return SamplingSpec(max_tokens=min(budget, 2))

    ids = TokenizeRequest(TextPrompt(token_ids=list(range(10, 110))), add_special_tokens=False)  # 0.67 s, exact
    with pytest.raises(OverloadedError):
        await start_generation(services, ids, spec, "late")
    assert tokenizer.calls == 0
    ahead.release()
    stream = await start_generation(services, ids, spec, "in-time")
    assert tokenizer.calls == 1
    await stream.close()
    assert services.work.backlog_s == 0.0


@pytest.mark.parametrize("param", ["prompt", "messages"])
def test_a_prompt_longer_than_the_context_can_spell_is_a_400_at_once(app_args: AppArgs, param: str) -> None:
    g = gate()
    g.max_chars_per_token = 10
    limit = app_args.model.max_model_len  # tokens: 10 * limit characters cannot fit
    with pytest.raises(BadRequestError) as refused:
        admit_prompt(g, app_args, 10 * limit, None, max_tokens=1, deadline_s=None, param=param)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == param
    assert f"at least {limit} input tokens" in refused.value.message
    with pytest.raises(BadRequestError):  # token ids: counted exactly
        admit_prompt(g, app_args, 0, limit, max_tokens=1, deadline_s=None)
    assert g.live == 0  # nothing was admitted
    # One character less fits the bound (the tokenizer stage has the last word); truncation cuts instead.
    admit_prompt(g, app_args, 10 * (limit - 1), None, max_tokens=1, deadline_s=None).release()
    admit_prompt(g, app_args, 100 * limit, None, max_tokens=1, deadline_s=None, truncating=True).release()
    g.max_chars_per_token = None  # a tokenizer without a bound: weighed as before
    admit_prompt(g, app_args, 100 * limit, None, max_tokens=1, deadline_s=None).release()


def test_a_busy_engine_slower_than_configured_is_given_less_work() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = [g.admit(prompt_tokens=1, max_tokens=1000) for _ in range(4)]
    decode(clock, tickets, seconds=10, tokens_per_s=40)  # the rates say 100
    assert g.speed == pytest.approx(0.4, abs=0.01)
    for ticket in tickets:
        ticket.release()
    admitted = [g.admit(prompt_tokens=0, max_tokens=1000)]  # 10 s as configured, 25 s at this speed
    with pytest.raises(OverloadedError, match=r"needs about 2[45]\.[0-9] s more; more than the 90\.0 s"):
        for _ in range(10):
            admitted.append(g.admit(prompt_tokens=0, max_tokens=1000))
    assert len(admitted) == 3  # 75 s of the 90 it may wait: at the configured rates, 9


def test_work_given_back_unfinished_is_not_speed() -> None:
    clock = Clock()
    g = learning_gate(clock)
    steady = [g.admit(prompt_tokens=1, max_tokens=1000) for _ in range(4)]
    for _ in range(100):  # 10 s at the configured 100 tokens/s, and 10 requests a second that stop at once
        clock.now += 0.1
        for ticket in steady:
            ticket.generated(10 // len(steady) + (ticket is steady[0]) * (10 % len(steady)))
        stopped = g.admit(prompt_tokens=1, max_tokens=1000)  # 10 s of work admitted, 10 ms of it done
        stopped.generated(1)
        stopped.release()
    assert g.speed == pytest.approx(1.1, abs=0.02)  # counting the 10 s given back would read 100x


def test_services_learn_from_the_engines_batch_and_show_the_speed(
    app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    rates: dict[str, Any] = {"prefill_tokens_per_s": 1e6, "decode_tokens_per_s": 100, "max_wait_s": 3600}
    learning = Services.create(
        app_args.model_copy(update={"admission": AdmissionConfig(**rates)}), tokenizer_stage, FakeLLM()
    )
    assert learning.work is not None and learning.work.meter is not None
    assert learning.work.meter.busy_live == app_args.engine.max_num_seqs // 4
    learning.work.meter.speed = 0.4
    assert b"serve_graph_admission_speed 0.4" in learning.metrics.render()
    fixed = Services.create(
        app_args.model_copy(update={"admission": AdmissionConfig(**rates, learn_speed=False)}),
        tokenizer_stage,
        FakeLLM(),
    )
    assert fixed.work is not None and fixed.work.meter is None
    assert b"serve_graph_admission_speed 1.0" in fixed.metrics.render()
    by_count = Services.create(app_args, tokenizer_stage, FakeLLM())
    assert b"admission_speed" not in by_count.metrics.render()
