"""Running the workload: targets interleaved level by level and round by round, so that machine noise
(another process, thermal state, a GC pause) hits every target alike instead of one target's block.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import httpx

from load.bench import text_probe, tts
from load.bench.client import Endpoint, RequestRecord, send
from load.bench.cpu import CellCpu, Meter, at_rest
from load.bench.datasets import Dataset, WordDataset
from load.bench.health import HealthSample, ProbeProcess, loop_lag

Mode = Literal["concurrency", "rate"]


@dataclass(frozen=True)
class Cell:
    """One stretch of load: a target at a level (concurrency, or requests per second) in a round."""

    round: int
    level: float
    target: str


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    model: str


@dataclass(frozen=True)
class Workload:
    mode: Mode
    levels: tuple[float, ...]
    duration_s: float
    rounds: int = 1
    endpoint: Endpoint | Literal["speech"] = "completions"
    max_concurrency: int | None = None  # rate mode: arrivals beyond it wait, as vLLM's --max-concurrency
    warmup: int = 2
    health_interval_s: float = 0.1
    request_timeout_s: float = 300.0
    rotate: bool = True
    seed: int = 0
    # Closed loop: a user that got 503 + Retry-After waits that long before its next request, as a
    # well-behaved client does, instead of re-sending at once and loading the server with rejections.
    honor_retry_after: bool = False
    # Closed loop: a cell goes on past `duration_s` until this many requests succeeded, up to
    # `max_duration_s`: speech streams take seconds each, and a percentile of a handful says little.
    min_ok: int = 0
    max_duration_s: float | None = None
    # After the last cell, every target's CPU is read this long with nothing sent but the `/health`
    # probes each cell sends too (`Runner.rest`): what its processes spend on their own. 0: not read.
    rest_s: float = 0.0
    # Short text requests sent beside the load every this many seconds (`text_probe.py`); 0: none.
    text_probe_interval_s: float = 0.0


@dataclass
class CellResult:
    cell: Cell
    started_at: float  # perf_counter
    duration_s: float  # first request sent -> last response ended
    records: list[RequestRecord]
    health: list[HealthSample]
    loop_lag: list[float]  # seconds, see health.loop_lag
    cpu: CellCpu | None = None  # the target's processes' CPU time over the cell, see cpu.py
    text_probes: list[RequestRecord] = field(default_factory=list)  # see text_probe.py


class Progress(Protocol):
    def start_cell(self, cell: Cell) -> None: ...
    def request_done(self, record: RequestRecord) -> None: ...
    def end_cell(self, result: CellResult) -> None: ...


def schedule(targets: Sequence[str], levels: Sequence[float], rounds: int, rotate: bool = True) -> list[Cell]:
    """Every target at every level, each round. With `rotate` the target order shifts by one from level
    to level and, for each level, from round to round (A B, B A / B A, A B): no target always runs
    first, after a pause or a level change, nor always after the same neighbour."""
    cells: list[Cell] = []
    for r in range(rounds):
        for i, level in enumerate(levels):
            shift = (r + i) % len(targets) if rotate else 0
            order = [*targets[shift:], *targets[:shift]]
            cells.extend(Cell(r, level, t) for t in order)
    return cells


def arrival_offsets(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Poisson arrivals: exponential gaps with mean 1/rate, starting at 0, all before `duration_s`."""
    offsets = []
    at = 0.0
    while at < duration_s:
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


SendNext = Callable[[], Awaitable[RequestRecord]]


async def closed_loop(
    send_next: SendNext, concurrency: int, duration_s: float, honor_retry_after: bool = False, min_ok: int = 0,
    max_duration_s: float | None = None,
) -> list[RequestRecord]:  # fmt: skip
    """`concurrency` users sending back to back; none starts a request after `duration_s`, unless fewer
    than `min_ok` requests have succeeded: then until they have, but never after `max_duration_s`."""
    start = time.perf_counter()
    deadline = start + duration_s
    hard_deadline = start + max(duration_s, max_duration_s or duration_s)
    succeeded = 0

    def end() -> float:
        return deadline if succeeded >= min_ok else hard_deadline

    async def user() -> list[RequestRecord]:
        nonlocal succeeded
        done = []
        while time.perf_counter() < end():
            record = await send_next()
            succeeded += record.ok
            done.append(record)
            if honor_retry_after and record.retry_after_s:
                await asyncio.sleep(max(0.0, min(record.retry_after_s, end() - time.perf_counter())))
        return done

    return [r for records in await asyncio.gather(*(user() for _ in range(concurrency))) for r in records]


async def open_loop(send_next: SendNext, offsets: Sequence[float], max_concurrency: int | None) -> list[RequestRecord]:
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one() -> RequestRecord:
        if limit is None:
            return await send_next()
        async with limit:
            return await send_next()

    start = time.perf_counter()
    tasks = []
    for offset in offsets:
        await asyncio.sleep(start + offset - time.perf_counter())
        tasks.append(asyncio.create_task(one()))
    return list(await asyncio.gather(*tasks))


# Between the last cell and the rest reading: the last requests' streams and the stages' bookkeeping end.
REST_SETTLE_S = 2.0


class Runner:
    """Sends each target the dataset's prompts in order, continuing across cells, so two targets get
    the same prompts and no target sees a prompt twice (that would hit its prefix cache)."""

    def __init__(
        self, targets: Sequence[Target], dataset: Dataset, workload: Workload, progress: Progress,
        cpu: Meter | None = None, probe_prompts: WordDataset | None = None,
    ) -> None:  # fmt: skip
        """`probe_prompts`: the text probes' prompts, when `workload.text_probe_interval_s` sends any."""
        self.targets = {t.name: t for t in targets}
        self.dataset = dataset
        self.workload = workload
        self.progress = progress
        self.cpu = cpu
        self.next_prompt = dict.fromkeys(self.targets, 0)
        self.probe_prompts = probe_prompts
        self.next_probe = dict.fromkeys(self.targets, 0)
        self.rest: dict[str, CellCpu] = {}  # read by `run`

    def _sender(self, client: httpx.AsyncClient, target: Target, report: bool) -> SendNext:
        async def send_next() -> RequestRecord:
            index = self.next_prompt[target.name]
            self.next_prompt[target.name] += 1
            prompt = self.dataset.prompt(index)
            endpoint = self.workload.endpoint
            if endpoint == "speech":
                record = await tts.send(client, target.url, target.model, prompt)
            else:
                record = await send(client, target.url, endpoint, target.model, prompt)
            if report:
                self.progress.request_done(record)
            return record

        return send_next

    async def run(self) -> list[CellResult]:
        w = self.workload
        capacity = int(max(w.levels)) if w.mode == "concurrency" else w.max_concurrency
        limits = httpx.Limits(max_connections=capacity, max_keepalive_connections=capacity)
        # Text probes get their own pool: queued behind busy load connections they would time the pool.
        async with (
            httpx.AsyncClient(timeout=w.request_timeout_s, limits=limits) as client,
            httpx.AsyncClient(timeout=w.request_timeout_s) as probe_client,
        ):
            for target in self.targets.values():
                warm = self._sender(client, target, report=False)
                for _ in range(w.warmup):
                    await warm()
            results = []
            for cell in schedule(list(self.targets), w.levels, w.rounds, w.rotate):
                self.progress.start_cell(cell)
                result = await self._run_cell(client, probe_client, cell)
                self.progress.end_cell(result)
                results.append(result)
            if self.cpu and w.rest_s > 0:
                await asyncio.sleep(REST_SETTLE_S)
                self.rest = await self._at_rest(self.cpu)
        return results

    async def _at_rest(self, meter: Meter) -> dict[str, CellCpu]:
        """Every target at once, probed as in a cell, so that what a cell spends above this is its requests'
        alone. After the cells rather than before them: a Ray cluster is busier for minutes after it starts
        (the default config, two minutes after `make serve`: 0.35 of a core outside the engines, probed;
        ten minutes later 0.27 without probes), and whatever the first request starts is running by then."""
        w = self.workload
        with contextlib.ExitStack() as probing:
            for target in self.targets.values():
                probing.enter_context(ProbeProcess(target.url, w.health_interval_s))
            return await asyncio.to_thread(at_rest, meter, list(self.targets), w.rest_s)

    async def _run_cell(self, client: httpx.AsyncClient, probe_client: httpx.AsyncClient, cell: Cell) -> CellResult:
        w = self.workload
        target = self.targets[cell.target]
        send_next = self._sender(client, target, report=True)
        # `/health` from a process of its own, which this loop's stalls under the load cannot delay.
        with ProbeProcess(target.url, w.health_interval_s) as prober:
            # A thread: reading every process's /proc entries takes a while on a busy machine.
            before = await asyncio.to_thread(self.cpu.snapshot) if self.cpu else None
            stop = asyncio.Event()
            lags = asyncio.create_task(loop_lag(stop))
            texts = asyncio.create_task(self._text_probes(probe_client, target, stop))
            started_at = time.perf_counter()
            if w.mode == "concurrency":
                records = await closed_loop(
                    send_next, int(cell.level), w.duration_s, w.honor_retry_after, w.min_ok, w.max_duration_s
                )
            else:
                # The same arrival times for every target of a (round, level): only the target differs.
                rng = random.Random(f"{w.seed}:{cell.round}:{cell.level}")
                records = await open_loop(send_next, arrival_offsets(cell.level, w.duration_s, rng), w.max_concurrency)
            duration_s = time.perf_counter() - started_at
            stop.set()
            lag, text_probes = await lags, await texts
            # In a thread: the hand-over waits for the probe in flight, which this loop has no part in.
            health = await asyncio.to_thread(prober.stop)
        cpu = None
        if self.cpu and before:
            cpu = self.cpu.measure(cell.target, before, await asyncio.to_thread(self.cpu.snapshot))
        return CellResult(cell, started_at, duration_s, records, health, lag, cpu, text_probes)

    async def _text_probes(self, client: httpx.AsyncClient, target: Target, stop: asyncio.Event) -> list[RequestRecord]:
        w = self.workload
        if self.probe_prompts is None or w.text_probe_interval_s <= 0 or w.endpoint == "speech":
            return []
        records = await text_probe.probe(
            client, target.url, w.endpoint, target.model, self.probe_prompts, self.next_probe[target.name], stop,
            w.text_probe_interval_s,
        )  # fmt: skip
        self.next_probe[target.name] += len(records)  # the next cell's probes go on from here: no prompt twice
        return records
