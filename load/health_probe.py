"""`/health` latency while a burst of long prompts hits the server (the seed-002 measurement).

Long prompts (tens of thousands of tokens) beyond the model's context are rejected with a 400, after
tokenizing them where a server cannot tell sooner: work that stalls a single-process server's event
loop. Targets are measured one after another in the same run, each with an idle phase first; the
probes run in a process of their own (`ProbeProcess`), apart from the load's saturated client, and by
default in a session of their own too (`--probe-session`).

With `--floor haproxy-refuser`, a server that answers `/health` from its config alone (load/refusers.py) is
probed too, at the same instants and from the same process (the target's probe is sent first), while each
target is loaded: what any server on the machine gets under that load, the probe's own wake-ups included
(the load client saturates the same cores). A target's probe minus the floor's beside it is the target's
own share (`above_floor_ms`).

Each probe is also timed by the kernel's stamps (`*_stamped_ms`, load/bench/health.py): the server's own time
to answer, without the probe process's wait for a CPU.
`python -m load.health_probe --target graph=http://127.0.0.1:8000 --target baseline=http://127.0.0.1:8001`
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from load.bench import report, targets
from load.bench.health import HealthSample, ProbeProcess, loop_lag, summarize, summarize_stamped
from load.meta import run_meta, save_result
from load.stats import fmt_ms, summary_ms

WORDS = [
    "serve",
    "graph",
    "token",
    "stage",
    "engine",
    "health",
    "probe",
    "latency",
    "queue",
    "replica",
    "batch",
    "stream",
]


PROBE_INTERVAL_S = 0.1


def long_prompt(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(words))


async def load(client: httpx.AsyncClient, url: str, stop: asyncio.Event, prompts: list[str],
               statuses: Counter[int | str]) -> None:  # fmt: skip
    i = 0
    while not stop.is_set():
        body = {"model": None, "prompt": prompts[i % len(prompts)], "max_tokens": 16}
        i += 1
        try:
            response = await client.post(f"{url}/v1/completions", json=body)
        except httpx.TransportError as exc:  # a connection the server dropped: counted as such, the load goes on
            statuses[type(exc).__name__] += 1
            continue
        statuses[response.status_code] += 1


async def measure(url: str, concurrency: int, duration_s: float, prompts: list[str],
                  floor_url: str | None = None, *, own_session: bool) -> dict[str, Any]:  # fmt: skip
    limits = httpx.Limits(max_connections=concurrency + 4)
    with ProbeProcess(url, PROBE_INTERVAL_S, own_session=own_session) as prober:
        await asyncio.sleep(3)
        idle = prober.stop()
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        statuses: Counter[int | str] = Counter()
        stop = asyncio.Event()
        lag = asyncio.create_task(loop_lag(stop))
        with ProbeProcess(url, PROBE_INTERVAL_S, beside=floor_url, own_session=own_session) as prober:
            tasks = [asyncio.create_task(load(client, url, stop, prompts, statuses)) for _ in range(concurrency)]
            await asyncio.sleep(duration_s)
            loaded = await asyncio.to_thread(prober.stop)  # the load goes on meanwhile
        stop.set()
        await asyncio.gather(*tasks)
        lags = await lag
    return {"idle_health_ms": summarize(idle), "loaded_health_ms": summarize(loaded),
            "loaded_health_stamped_ms": summarize_stamped(loaded), **floor_summary(loaded),
            "responses": dict(statuses), "requests_per_s": sum(statuses.values()) / duration_s,
            "load_client_lag_max_ms": round(1000 * max(lags, default=0.0), 1)}  # fmt: skip


def floor_summary(samples: list[HealthSample]) -> dict[str, Any]:
    """The floor's probes (sent at the same instants as `samples`), and by how much each of `samples` took
    longer than the floor's probe beside it: the target's own share. Empty without a floor."""
    pairs = [(s, s.beside) for s in samples if s.beside is not None]
    if not pairs:
        return {}
    floors = [floor for _, floor in pairs]
    return {"floor_health_ms": summarize(floors), "floor_health_stamped_ms": summarize_stamped(floors),
            "above_floor_ms": summary_ms([s.latency - floor.latency for s, floor in pairs])}  # fmt: skip


@contextmanager
def floor_server(kind: str | None, log_dir: Path) -> Iterator[str | None]:
    """The floor's URL while it runs: a `kind` of load/refusers.py at nice 15 in a session of its own, as the
    graph's HAProxy and `vllm serve` run; None without a `kind`."""
    if kind is None:
        yield None
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    spec = dataclasses.replace(targets.LAUNCHERS[kind](None), own_session=True)
    with targets.launched(spec, log_dir / f"{kind}.log") as (url, _):
        yield url


def _answers(counts: dict[str, int]) -> str:
    """`{"400": 7173, "ReadError": 2}` as `400: 7,173, ReadError: 2`."""
    return ", ".join(f"{kind}: {count:,}" for kind, count in counts.items())


# Where load.health_probe's probes ran; files before stop 54 do not say (None).
PROBE_SESSIONS = {
    "own": "The probes ran from a process in a session of its own, as a real prober's.",
    "load-client": "The probes ran from a process in the load client's session, sharing its CPU as one autogroup.",
    None: "Where the probes ran was not recorded: from stop 18 to 53 in a process in the load client's session, "
    "before that on the client's own event loop.",
}


def markdown(result: dict[str, Any]) -> list[str]:
    """A run's tables, as docs/benchmarks.md shows them: `/health` idle and loaded, the floor beside each
    loaded target, and the same probes by the kernel's stamps."""
    targets = result["targets"]
    reference = targets.get("graph")
    handicapped = report.handicaps(result)
    lines = [
        "Prompts far beyond the 4,096-token context, so every request is tokenized and rejected with 400. "
        + PROBE_SESSIONS[result.get("probe_session")],
        "",
        "| target | idle p50 ms | loaded p50 | p95 | p99 | max | req/s | answers | p99 vs graph |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    floors = []
    for name, t in targets.items():
        idle, loaded = t["idle_health_ms"], t["loaded_health_ms"]
        flag = "graph" in handicapped or name in handicapped
        vs = report.ratio(loaded["p99"], reference["loaded_health_ms"]["p99"], flag) if reference else "n/a"
        lines.append(
            f"| {name} | {fmt_ms(idle['p50'])} | {fmt_ms(loaded['p50'])} | {fmt_ms(loaded['p95'])} "
            f"| {fmt_ms(loaded['p99'])} | {fmt_ms(loaded['max'])} | {t['requests_per_s']:.1f} "
            f"| {_answers(t['responses'])} | {vs} |"
        )
        if floor := t.get("floor_health_ms"):
            above = t["above_floor_ms"]
            floors.append(f"| {name} | {fmt_ms(loaded['p99'])} | {fmt_ms(floor['p50'])} | {fmt_ms(floor['p99'])} "
                          f"| {fmt_ms(above['p50'])} | {fmt_ms(above['p99'])} | {fmt_ms(above['max'])} |")  # fmt: skip
    if floors:
        lines += ["", f"The floor: `{result['floor']}` (answering `/health` from its config alone, nice 15, a "
                  "session of its own), probed at the same instants by the same process while each target was "
                  "loaded; a target's probe minus the floor's beside it is its own share.", "",
                  "| target | its p99 ms | floor p50 | floor p99 | own share p50 | p99 | max |",
                  "|---|---|---|---|---|---|---|", *floors]  # fmt: skip
    lines += _stamped_health(targets)
    return [*lines, *report.handicap_notes(handicapped)]


def _stamped_health(targets: dict[str, Any]) -> list[str]:
    """The long prompts' `/health` by the kernel's stamps; nothing for runs before they were taken."""
    rows = []
    for name, t in targets.items():
        if stamped := t.get("loaded_health_stamped_ms"):
            floor = t.get("floor_health_stamped_ms")
            floor_cells = f"{fmt_ms(floor['p50'])} | {fmt_ms(floor['p99'])}" if floor else "- | -"
            rows.append(f"| {name} | {fmt_ms(stamped['p50'])} | {fmt_ms(stamped['p99'])} | {fmt_ms(stamped['max'])} "
                        f"| {stamped['unstamped']} | {floor_cells} |")  # fmt: skip
    if not rows:
        return []
    return ["", "The same loaded probes as the kernel stamped them: from just before each was written to the "
            "arrival of its answer's last bytes, without the probe process's own wait to read them.", "",
            "| target | p50 ms | p99 | max | unstamped | floor p50 | floor p99 |",
            "|---|---|---|---|---|---|---|", *rows]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", action="append", required=True, help="name=url, repeatable")
    parser.add_argument("--concurrency", type=int, default=60)
    parser.add_argument("--words", type=int, default=15000, help="words per prompt (~2 tokens each)")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument(
        "--floor",
        choices=["haproxy-refuser", "python-refuser"],
        default=None,
        help="start this server (load/refusers.py) and probe its /health beside each loaded target",
    )
    parser.add_argument(
        "--probe-session",
        choices=["own", "load-client"],
        default="own",
        help="the probe process in a session of its own, as a real prober (default), or in the load client's "
        "(stops 18-53): with the kernel's autogroups, a session shares the CPU as one",
    )
    parser.add_argument("--label", default="", help="what is special about this run, shown in the report")
    parser.add_argument("--out", default=None, help="write JSON results here")
    opts = parser.parse_args()
    prompts = [long_prompt(opts.words, seed) for seed in range(8)]
    results: dict[str, Any] = {
        **run_meta(),
        "label": opts.label,
        "kind": "health_probe",
        "concurrency": opts.concurrency,
        "words_per_prompt": opts.words,
        "duration_s": opts.duration,
        "floor": opts.floor,
        "probe_session": opts.probe_session,
        "targets": {},
    }
    logs = Path(opts.out or "results/health_probe.json").parent / "health-probe-logs"
    own_session = opts.probe_session == "own"
    with floor_server(opts.floor, logs) as floor_url:
        for target in opts.target:
            name, url = target.split("=", 1)
            measured = measure(url, opts.concurrency, opts.duration, prompts, floor_url, own_session=own_session)
            results["targets"][name] = asyncio.run(measured)
            print(name, json.dumps(results["targets"][name]), flush=True)
    save_result(opts.out, results)


if __name__ == "__main__":
    main()
