"""serve_app/ingress/pipeline/engine_speed.py: the speed admission learns, driven through a gate's tickets."""

from __future__ import annotations

import pytest

from serve_app.ingress.pipeline.engine_speed import EngineSpeed
from serve_app.ingress.pipeline.work_admission import WorkGate, WorkTicket
from tests.unit.admission_support import decode, learning_gate
from tests.unit.conftest import Clock


def admit(gate: WorkGate, n: int) -> list[WorkTicket]:
    return [gate.admit(prompt_tokens=1, max_tokens=1000) for _ in range(n)]


def test_a_busy_engine_moves_the_speed_either_way() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 4)
    decode(clock, tickets, seconds=10, tokens_per_s=40)  # the rates say 100
    assert g.speed == pytest.approx(0.4, abs=0.01)
    decode(clock, tickets, seconds=10, tokens_per_s=200)  # faster than configured, busy: believed
    assert g.speed == pytest.approx(2.0, abs=0.01)


def test_a_quiet_engine_only_raises_the_speed_and_not_past_the_configured_rates() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 3)  # below the busy mark
    decode(clock, tickets, seconds=6, tokens_per_s=30)  # a few requests' pace is not the batch's
    assert g.speed == 1.0
    assert g.meter is not None
    g.meter.speed = 0.1  # as after a slow spell, now admitting too little to make the engine busy again
    decode(clock, tickets, seconds=10, tokens_per_s=30)
    assert g.speed == pytest.approx(0.3, abs=0.01)
    decode(clock, tickets, seconds=10, tokens_per_s=210)  # cached prompts or a lucky spell: no further than 1
    assert g.speed == pytest.approx(1.0, abs=0.01)


def test_a_load_hovering_at_the_busy_mark_is_quiet_but_still_measured() -> None:
    clock = Clock()
    g = learning_gate(clock)
    steady = [g.admit(prompt_tokens=1, max_tokens=200) for _ in range(3)]
    assert g.meter is not None
    g.meter.speed = 0.1
    for _ in range(100):  # a fourth request comes and goes every 0.1 s: busy half the time
        clock.now += 0.1
        for ticket in steady:
            ticket.generated(1)
        extra = g.admit(prompt_tokens=1, max_tokens=10)
        extra.generated(1)
        extra.release()
    assert g.speed == pytest.approx(0.4, abs=0.01)  # raised (40 tokens/s of 100), never lowered


def test_a_short_dip_below_the_busy_mark_still_counts_as_busy() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 1) + [g.admit(prompt_tokens=1, max_tokens=10) for _ in range(3)]
    for step in range(200):  # 10 s at 40 tokens/s; each second one request ends and the next comes 0.05 s later
        clock.now += 0.05
        if step % 20 == 10:
            tickets.pop().release()
        elif step % 20 == 11:
            tickets.append(g.admit(prompt_tokens=1, max_tokens=10))
        tickets[0].generated(2)
    assert g.speed == pytest.approx(0.4, abs=0.01)  # busy 95 % of each window


def test_a_quiet_spell_between_busy_ones_is_not_counted_as_busy() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 4)
    decode(clock, tickets, seconds=2.5, tokens_per_s=120)
    before = g.speed
    tickets.pop().release()  # three live: the rest of this window is quiet
    decode(clock, tickets, seconds=5, tokens_per_s=30)
    assert g.speed == before  # ~0.75 and 0.3 seen, but not busy for 90 % of any of these windows
    tickets.append(g.admit(prompt_tokens=1, max_tokens=1000))
    decode(clock, tickets, seconds=8, tokens_per_s=40)
    assert g.speed == pytest.approx(0.4, abs=0.01)


def test_idle_time_is_no_window() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 4)
    decode(clock, tickets, seconds=0.5, tokens_per_s=80)
    for ticket in tickets:
        ticket.release()
    clock.now += 2.0  # nothing admitted for 2 s
    tickets = admit(g, 4)
    decode(clock, tickets, seconds=1, tokens_per_s=80)
    assert g.speed == pytest.approx(0.9, abs=0.04)  # half way to 0.8; a window spanning the 2 s would be quiet


def test_progress_reported_after_the_last_release_is_ignored() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 4)
    assert g.meter is not None
    g.meter.speed = 0.1
    decode(clock, tickets, seconds=0.5, tokens_per_s=80)
    for ticket in tickets:
        ticket.release()
    clock.now += 3.0
    tickets[0].generated(1)  # a late chunk of a released request: no window spanning the idle 3 s (0.11 seen)
    assert g.speed == 0.1


def test_the_busy_mark_is_a_quarter_of_the_batch_rounded_up() -> None:
    assert [EngineSpeed(n, Clock()).busy_live for n in (1, 4, 5, 16, 64, 65)] == [1, 1, 2, 4, 16, 17]


def test_a_stall_is_dropped_not_learned() -> None:
    clock = Clock()
    g = learning_gate(clock)
    tickets = admit(g, 4)
    clock.now += 5.0  # busy, and nothing comes out for 5 s
    tickets[0].generated(1)
    assert g.speed == 1.0  # 0.002 of the configured rate is a fault, not a machine
    decode(clock, tickets, seconds=8, tokens_per_s=40)
    assert g.speed == pytest.approx(0.4, abs=0.01)


def test_a_gate_without_a_meter_keeps_the_configured_rates() -> None:
    clock = Clock()
    g = WorkGate(prefill_tokens_per_s=1e6, decode_tokens_per_s=100, max_wait_s=90, clock=clock)
    decode(clock, admit(g, 8), seconds=3, tokens_per_s=16)
    assert g.meter is None and g.speed == 1.0
