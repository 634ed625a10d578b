"""The interleaving schedule, Poisson arrivals, the closed/open load loops (fake requests) and the rest
reading."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from collections import Counter

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from load.bench.client import RequestRecord
from load.bench.cpu import Meter, Scope, Snapshot
from load.bench.datasets import WordDataset
from load.bench.runner import (
    Cell,
    Runner,
    SendNext,
    Target,
    Workload,
    arrival_offsets,
    closed_loop,
    open_loop,
    schedule,
)
from load.rss import Proc
from tests.unit.bench_support import serving


def test_schedule_interleaves_targets_and_alternates_who_goes_first() -> None:
    cells = schedule(["A", "B"], [1, 4], rounds=2)
    assert [(c.round, c.level, c.target) for c in cells] == [
        (0, 1, "A"), (0, 1, "B"), (0, 4, "B"), (0, 4, "A"),
        (1, 1, "B"), (1, 1, "A"), (1, 4, "A"), (1, 4, "B"),
    ]  # fmt: skip


def test_schedule_with_three_targets_gives_each_every_position() -> None:
    cells = schedule(["A", "B", "C"], [8], rounds=3)
    firsts = [cells[i].target for i in range(0, 9, 3)]
    assert sorted(firsts) == ["A", "B", "C"]
    assert Counter(cells) == Counter(Cell(r, 8, t) for r in range(3) for t in "ABC")


def test_schedule_fixed_order() -> None:
    cells = schedule(["A", "B"], [1, 2], rounds=2, rotate=False)
    assert [c.target for c in cells] == ["A", "B"] * 4


def test_poisson_arrivals() -> None:
    offsets = arrival_offsets(50.0, 100.0, random.Random(1))
    assert offsets == arrival_offsets(50.0, 100.0, random.Random(1))
    assert offsets[0] == 0.0 and offsets[-1] < 100.0
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert min(gaps) > 0
    assert len(offsets) == pytest.approx(5000, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(statistics.fmean(gaps), rel=0.1)


class FakeSend:
    """Requests that take `seconds`; records when each starts and the most in flight at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.starts: list[float] = []
        self.in_flight = self.most_in_flight = 0

    async def __call__(self) -> RequestRecord:
        self.starts.append(time.perf_counter())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.seconds)
        self.in_flight -= 1
        return RequestRecord(sent_at=self.starts[-1], input_len=1)


async def test_closed_loop_keeps_concurrency_and_stops_starting_at_the_deadline() -> None:
    fake = FakeSend(0.02)
    send: SendNext = fake
    start = time.perf_counter()
    records = await closed_loop(send, concurrency=3, duration_s=0.2)
    assert fake.most_in_flight == 3
    assert len(records) == len(fake.starts) >= 3 * 4  # 3 * 10 on an idle machine
    assert max(fake.starts) - start < 0.2


async def test_closed_loop_waits_out_retry_after_when_asked() -> None:
    refusals: list[float] = []

    async def refused() -> RequestRecord:
        refusals.append(time.perf_counter())
        return RequestRecord(sent_at=refusals[-1], input_len=1, status=503, error="HTTP 503", retry_after_s=0.1)

    await closed_loop(refused, concurrency=1, duration_s=0.25, honor_retry_after=True)
    assert 2 <= len(refusals) <= 3  # at 0, 0.1 and 0.2 s (a busy machine's late wake-up can skip the last)
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(refusals))
    refusals.clear()
    await closed_loop(refused, concurrency=1, duration_s=0.05)
    assert len(refusals) > 3  # without it, back to back


async def test_closed_loop_goes_on_until_enough_succeed_within_a_cap() -> None:
    fake = FakeSend(0.02)
    start = time.perf_counter()
    records = await closed_loop(fake, concurrency=2, duration_s=0.01, min_ok=20, max_duration_s=5.0)
    assert 20 <= len(records) <= 22  # the users stop once 20 have come back: at most one more each
    assert time.perf_counter() - start < 5.0

    async def failing() -> RequestRecord:
        await asyncio.sleep(0.01)
        return RequestRecord(sent_at=0.0, input_len=1, status=500, error="HTTP 500")

    start = time.perf_counter()
    records = await closed_loop(failing, concurrency=1, duration_s=0.05, min_ok=5, max_duration_s=0.2)
    assert not any(r.ok for r in records)
    assert 0.2 <= time.perf_counter() - start < 2.0  # no success ever: the cap ends it (not min_ok)


async def test_open_loop_follows_arrivals_and_caps_in_flight() -> None:
    fake = FakeSend(0.05)
    start = time.perf_counter()
    records = await open_loop(fake, [0.0, 0.1, 0.2], max_concurrency=None)
    assert len(records) == 3
    # Never early; late only by what this (shared, busy) machine's scheduler adds.
    assert all(o - 0.005 <= s - start < o + 0.08 for s, o in zip(fake.starts, [0.0, 0.1, 0.2], strict=True))

    capped = FakeSend(0.05)
    await open_loop(capped, [0.0] * 4, max_concurrency=2)
    assert capped.most_in_flight == 2


async def test_rest_is_read_for_every_target_while_each_is_probed_as_in_a_cell() -> None:
    probed: Counter[str] = Counter()

    def app(name: str) -> FastAPI:
        served = FastAPI()

        @served.get("/health")
        def health() -> JSONResponse:
            probed[name] += 1
            return JSONResponse({})

        return served

    snapshots = iter([Snapshot(0.0, {1: _proc(1, 0.0)}), Snapshot(0.3, {1: _proc(1, 0.06)})])

    def snapshot() -> Snapshot:
        return next(snapshots)

    meter = Meter({name: Scope(frozenset({1})) for name in ("a", "b")})
    meter.snapshot = snapshot  # type: ignore[method-assign]
    workload = Workload(mode="concurrency", levels=(1.0,), duration_s=1.0, health_interval_s=0.05, rest_s=0.3)
    with serving(app("a")) as a, serving(app("b")) as b:
        targets = [Target("a", a, "m"), Target("b", b, "m")]
        runner = Runner(targets, WordDataset(("w",), (1,), 1, 0), workload, progress=None, cpu=meter)  # type: ignore[arg-type]
        rest = await runner._at_rest(meter)
    spent = {name: cell.roles["other:python"].cpu_s for name, cell in rest.items()}
    assert spent == pytest.approx({"a": 0.06, "b": 0.06})
    # Each probe process's warm-up probe, then one per 0.05 s while rest is read: never none.
    assert set(probed) == {"a", "b"} and min(probed.values()) >= 3


def _proc(pid: int, cpu_s: float) -> Proc:
    return Proc(pid, 0, "python server.py", 0, cpu_s=cpu_s, pgid=pid, started=1.0)
