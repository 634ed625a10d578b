"""CPU time per request by process role (load/bench/cpu.py), from hand-made process tables."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from load.bench import cpu, report
from load.bench.client import RequestRecord
from load.bench.health import HealthSample
from load.bench.runner import Cell, CellResult, Workload
from load.rss import Proc, ThreadTimes

RAY = "/venv/lib/python3.11/site-packages/ray"
BENCH = 99


def proc(pid: int, ppid: int, title: str, cpu_s: float = 0.0, pgid: int = 1, started: float = 1.0) -> Proc:
    return Proc(pid, ppid, title, 0, cpu_s=cpu_s, pgid=pgid, started=started)


# A graph on `make serve`'s Ray (the proxy listens on 8000), `vllm serve` on 8003, and a baseline the bench
# started (its group 40, one process of which its parent left behind), next to unrelated processes.
TREE = [
    proc(1, 0, "/sbin/init"),
    proc(BENCH, 1, "python -m load.bench --start baseline"),
    proc(11, 1, f"{RAY}/core/src/ray/gcs/gcs_server --gcs_server_port=6379"),
    proc(12, 1, f"{RAY}/core/src/ray/raylet/raylet --raylet_socket_name=x"),
    proc(13, 12, f"/venv/bin/python {RAY}/dashboard/agent.py --node-ip-address=127.0.0.1"),
    proc(20, 12, "ray::ServeReplica:llm-app:llm"),
    proc(21, 20, "VLLM::EngineCore"),
    proc(22, 21, "/venv/bin/python -c from multiprocessing.resource_tracker import main;main(9)"),
    proc(23, 12, "ray::ServeReplica:llm-app:ingress"),
    proc(24, 12, "ray::ServeReplica:llm-app:ingress.handle_request"),
    proc(25, 12, "ray::ProxyActor"),
    proc(26, 25, "/venv/bin/haproxy -db -f /tmp/haproxy-serve/haproxy.cfg"),
    proc(27, 12, "ray::ServeController"),
    proc(28, 12, "ray::IDLE"),
    proc(30, 1, "python -m load.vllm_cli serve models/tiny-chat --port 8003"),
    proc(31, 30, "VLLM::EngineCore"),
    proc(40, BENCH, "python -m load.baseline --port 8001", pgid=40),
    proc(41, 40, "VLLM::EngineCore", pgid=40),
    proc(42, 1, "/venv/bin/python -c from multiprocessing.spawn import spawn_main", pgid=40),
    proc(50, 1, "python unrelated.py"),
]
LISTENERS = {8000: {25}, 8003: {30}}
GRAPH = {11, 12, 13, 20, 21, 22, 23, 24, 25, 26, 27, 28}


def table(procs: list[Proc]) -> dict[int, Proc]:
    return {p.pid: p for p in procs}


@pytest.mark.parametrize(
    ("pid", "role"),
    [
        (11, "gcs_server"), (12, "raylet"), (13, "dashboard_agent"), (20, "llm-app:llm"), (21, "engine"),
        (22, "engine"),  # no role of its own: its parent's
        (23, "llm-app:ingress"), (24, "llm-app:ingress"), (25, "proxy"), (26, "haproxy"), (27, "controller"),
        (28, "ray_worker"), (30, "api_server"), (31, "engine"), (40, "baseline"), (41, "engine"),
        (42, "other:python"),
    ],
)  # fmt: skip
def test_roles(pid: int, role: str) -> None:
    assert cpu.role_of(table(TREE), pid) == role


def test_each_target_gets_its_processes() -> None:
    meter, unmeasured = cpu.meter(
        {"baseline": 40}, {"graph": "http://127.0.0.1:8000/vision", "vllm": "http://127.0.0.1:8003", "far": "http://h"},
        lambda: TREE, lambda port: LISTENERS.get(port, set()),
    )  # fmt: skip
    assert unmeasured == ["far"]  # nothing here listens on port 80
    procs = table(TREE)
    members = {name: set(scope.members(procs)) for name, scope in meter.scopes.items()}
    # Every Ray process, though the GCS and raylet do not descend from the proxy that listens.
    assert members["graph"] == GRAPH
    assert members["vllm"] == {30, 31}
    assert members["baseline"] == {40, 41, 42}  # 42 by its process group
    assert meter.scopes["graph"].describe() == "descendants of 25 + every Ray process of the machine"
    assert meter.scopes["baseline"].describe() == "process group 40 + descendants of 40"


# Every process has used 5 s of CPU at the first reading.
BEFORE = cpu.Snapshot(10.0, table([proc(p.pid, p.ppid, p.title, 5.0, p.pgid) for p in TREE]))


def after(spent: dict[int, float], reused: int | None = None) -> cpu.Snapshot:
    """TREE 2 s after BEFORE, each process having spent `spent` more seconds; pid `reused` now a new process."""
    procs = [
        proc(p.pid, p.ppid, p.title, 5.0 + spent.get(p.pid, 0.0), p.pgid, 9.0 if p.pid == reused else p.started)
        for p in TREE
    ]
    return cpu.Snapshot(12.0, table(procs))


def test_usage_per_role_between_two_readings() -> None:
    spent = {21: 1.0, 22: 0.5, 23: 0.25, 24: 0.25, 25: 0.125, 26: 0.125, 11: 0.1, 50: 3.0, 31: 9.0}
    usage = cpu.usage(BEFORE, after(spent, reused=12), cpu.Scope(frozenset({25}), ray=True))
    assert usage.wall_s == 2.0
    assert usage.roles["engine"] == cpu.RoleCpu(1.5, 2)
    assert usage.roles["llm-app:ingress"] == cpu.RoleCpu(0.5, 2)  # two replicas added up
    assert usage.roles["haproxy"].cpu_s == 0.125
    assert usage.roles["raylet"].cpu_s == 5.0  # a new process behind a reused pid: all its time is new
    assert usage.roles["llm-app:llm"].cpu_s == 0.0
    assert "other:python" not in usage.roles  # pid 50 is nobody's target

    pooled = cpu.pool([usage, usage, None], requests=10)
    assert pooled is not None
    assert pooled["wall_s"] == 4.0
    assert pooled["roles"]["engine"]["ms_per_request"] == pytest.approx(300.0)
    assert pooled["roles"]["llm-app:ingress"]["core_share"] == pytest.approx(0.25)
    # proxy 0.125 + haproxy 0.125 + ingress 0.5 + gcs 0.1 + raylet 5.0, twice, over 10 requests
    assert pooled["outside_engine_ms_per_request"] == pytest.approx(1170.0)
    assert pooled["engine_ms_per_request"] == pytest.approx(300.0)
    assert cpu.pool([None], requests=10) is None


def threads(*times: tuple[int, float, float]) -> dict[int, ThreadTimes]:
    return {tid: ThreadTimes(ran, waited) for tid, ran, waited in times}


def test_busiest_threads_waiting_for_a_cpu() -> None:
    """A role's busiest threads' run-queue delay over the cell: of each process the thread that ran the most
    in it (not the one that waited the most), counted from zero for a thread or process started in between,
    added up over the role's processes, left out where it could not be read, and shown as a share of the
    wall time beside its CPU."""
    idle = {pid: threads((pid, 1.0, 1.0), (pid + 1000, 1.0, 1.0)) for pid in BEFORE.procs}
    before = cpu.Snapshot(10.0, {pid: replace(p, threads=idle[pid]) for pid, p in BEFORE.procs.items()})
    now = {pid: replace(p, threads=idle[pid]) for pid, p in after({}, reused=12).procs.items()}
    now[21] = replace(now[21], threads=threads((21, 2.0, 1.5), (1021, 1.1, 1.9)))  # stepping: ran 1.0, waited 0.5
    now[22] = replace(now[22], threads=threads((22, 1.2, 1.1), (1022, 1.0, 1.0)))
    now[23] = replace(now[23], threads=threads((23, 1.01, 1.05), (1023, 1.0, 1.0), (5023, 0.3, 0.2)))  # new loop
    now[24] = replace(now[24], threads=None)  # exited between the listing and its threads
    now[27] = replace(now[27], threads=None)
    now[12] = replace(now[12], threads=threads((12, 0.5, 1.3), (1012, 0.1, 0.1)))
    usage = cpu.usage(before, cpu.Snapshot(12.0, now), cpu.Scope(frozenset({25}), ray=True))
    assert usage.roles["engine"].wait_s == pytest.approx(0.6)  # the engine core and its helper
    assert usage.roles["llm-app:ingress"].wait_s == pytest.approx(0.2)  # pid 24's unread wait adds nothing
    assert usage.roles["raylet"].wait_s == pytest.approx(1.3)  # a new process behind a reused pid: all its wait
    assert usage.roles["proxy"].wait_s == 0.0
    assert usage.roles["controller"].wait_s is None  # its only process: unknown
    unread_before = cpu.Snapshot(10.0, {**before.procs, 21: replace(before.procs[21], threads=None)})
    assert cpu.usage(unread_before, cpu.Snapshot(12.0, now), cpu.Scope(frozenset({25}), ray=True)).roles[
        "engine"
    ].wait_s == pytest.approx(0.1)  # the core's threads unread before the cell: its helper's only
    assert cpu.busiest_wait(None, replace(now[21], threads={})) is None  # no thread read: unknown
    if Path("/proc/self/schedstat").exists():  # the meter's own readings take threads
        assert cpu.Meter({}).snapshot().procs[os.getpid()].threads is not None

    pooled = cpu.pool([usage], requests=4)
    assert pooled is not None
    assert pooled["roles"]["engine"]["busiest_thread_wait_share"] == pytest.approx(0.3)
    # A second cell where the controller's wait was read: the first, unread, does not halve its share.
    read = cpu.CellCpu(2.0, {**usage.roles, "controller": cpu.RoleCpu(0.0, 1, 0.4)})
    both = cpu.pool([usage, read], requests=8)
    assert both is not None and both["roles"]["controller"]["busiest_thread_wait_share"] == pytest.approx(0.2)
    text = "\n".join(cpu.markdown("concurrency", [("4", "graph", {"cpu": pooled})]))
    assert "| busiest threads waiting |" in text
    assert "| graph | 4 | engine | 2 | 0.00 | 0.000 | - | 0.300 |" in text
    assert "| graph | 4 | llm-app:ingress | 2 | 0.00 | 0.000 | - | 0.100 |" in text
    assert "| graph | 4 | controller | 1 | 0.00 | 0.000 | - | - |" in text
    # Threads of different kinds: not added up (the new raylet's 5 s of CPU count in its CPU).
    assert "| **outside engine** | 10 | **1,250.00** | **2.500** | **-** | **-** |" in text
    assert "|---|---:|---|---:|---:|---:|---:|---:|" in text  # eight columns
    rows = [("4", "graph", {"cpu": pooled}), ("4", "empty", {"cpu": {"roles": {}}})]
    assert "| empty | 4 | no process found | - | - | - | - | - |" in "\n".join(cpu.markdown("concurrency", rows))
    # A result file from before the column: the table as it was.
    old = {role: {k: v for k, v in s.items() if k != cpu.WAIT} for role, s in pooled["roles"].items()}
    text = "\n".join(cpu.markdown("concurrency", [("4", "graph", {"cpu": {**pooled, "roles": old}})]))
    assert "| graph | 4 | engine | 2 | 0.00 | 0.000 | - |\n" in text + "\n" and "waiting" not in text
    assert "| **outside engine** | 10 | **1,250.00** | **2.500** | **-** |\n" in text
    # A result file of stop 29, with its main threads' waits: shown as such.
    renamed = {cpu.WAIT: "main_thread_wait_share"}
    main = {role: {renamed.get(k, k): v for k, v in s.items()} for role, s in pooled["roles"].items()}
    text = "\n".join(cpu.markdown("concurrency", [("4", "graph", {"cpu": {**pooled, "roles": main}})]))
    assert "| main threads waiting |" in text and "busiest" not in text
    assert "| graph | 4 | engine | 2 | 0.00 | 0.000 | - | 0.300 |" in text


def test_report_column_and_role_table() -> None:
    meter = cpu.Meter({"graph": cpu.Scope(frozenset({25}), ray=True), "vllm": cpu.Scope(frozenset({30}))})
    spent = {21: 1.0, 23: 0.4, 25: 0.2, 30: 0.1, 31: 2.0}
    graph_cpu = meter.measure("graph", BEFORE, after(spent))
    vllm_cpu = meter.measure("vllm", BEFORE, after(spent))
    assert meter.measure("baseline", BEFORE, after(spent)) is None  # no scope: not measured
    # At rest, over 2 s: the graph's ingress 0.1 s and engine 0.2 s, vllm's API server 0.02 s.
    graph_rest = meter.measure("graph", BEFORE, after({23: 0.1, 21: 0.2}))
    vllm_rest = meter.measure("vllm", BEFORE, after({30: 0.02}))
    assert graph_rest is not None and vllm_rest is not None  # both have a scope
    rest = {"graph": graph_rest, "vllm": vllm_rest}

    def cell(target: str, usage: cpu.CellCpu | None) -> CellResult:
        records = [RequestRecord(sent_at=0.0, input_len=4, status=200, latency=0.2, content_times=[0.1, 0.2],
                                 prompt_tokens=4, output_tokens=2) for _ in range(4)]  # fmt: skip
        return CellResult(Cell(0, 4.0, target), 0.0, 2.0, records, [HealthSample(0.0, 0.001, 200)], [0.0], usage)

    workload = Workload(mode="concurrency", levels=(4.0,), duration_s=2.0)
    targets = {name: {"url": f"http://{name}"} for name in ("graph", "vllm", "baseline")}
    cells = [cell("graph", graph_cpu), cell("vllm", vllm_cpu), cell("baseline", None)]
    results = report.jsonable(report.build(cells, workload, targets, {}, {}, rest=rest))
    graph = results["results"]["graph"]["4"]["cpu"]
    assert graph["outside_engine_ms_per_request"] == pytest.approx(150.0)
    # 0.6 s outside the engine, less the 0.05 of a core it spends at rest over the cell's 2 s, over 4 requests.
    assert graph["above_rest_ms_per_request"] == pytest.approx(125.0)
    assert graph["rest_outside_engine_core_share"] == pytest.approx(0.05)
    assert graph["roles"]["engine"]["rest_core_share"] == pytest.approx(0.1)
    assert graph["roles"]["proxy"]["rest_core_share"] == 0.0  # idle at rest
    assert results["results"]["vllm"]["4"]["cpu"]["above_rest_ms_per_request"] == pytest.approx(20.0)
    assert results["results"]["baseline"]["4"]["cpu"] is None
    assert [c["cpu_outside_engine_ms_per_request"] for c in results["cells"]] == pytest.approx([150.0, 25.0, None])
    text = report.markdown(results)
    assert "| max | CPU ms/req outside engine | above rest |" in text
    assert "| 1.00 | 150.00 | 125.00 |" in text and "| 1.00 | 25.00 | 20.00 |" in text and "| 1.00 | - | - |" in text
    assert "| vllm | 4 | 1.00x | 1.00x | 6.00x | 6.25x |" in text  # the graph over vllm
    assert "| graph | 4 | llm-app:ingress | 2 | 100.00 | 0.200 | 0.050 |" in text
    assert "| graph | 4 | **outside engine** | 10 | **150.00** | **0.300** | **0.050** |" in text
    assert "| graph | 4 | engine | 2 | 250.00 | 0.500 | 0.100 |" in text
    assert "| vllm | 4 | api_server | 1 | 25.00 | 0.050 | 0.010 |" in text
    assert "more than one Serve cluster" not in text
    # Without a rest reading (and in result files from before it), the columns are empty.
    plain = report.jsonable(report.build(cells, workload, targets, {}, {}))
    assert "above_rest_ms_per_request" not in plain["results"]["graph"]["4"]["cpu"]
    assert "| 1.00 | 150.00 | - |" in report.markdown(plain)


def test_at_rest_reads_each_target_between_two_snapshots() -> None:
    readings = iter([BEFORE, after({23: 0.3, 30: 0.1})])
    meter = cpu.Meter({"graph": cpu.Scope(frozenset({25}), ray=True), "vllm": cpu.Scope(frozenset({30}))})
    meter.snapshot = lambda: next(readings)  # type: ignore[method-assign]
    slept: list[float] = []
    rest = cpu.at_rest(meter, ["graph", "vllm", "far"], 2.0, slept.append)
    assert slept == [2.0]
    assert set(rest) == {"graph", "vllm"}  # no scope for "far"
    assert rest["graph"].roles["llm-app:ingress"].cpu_s == pytest.approx(0.3)
    assert rest["vllm"].wall_s == 2.0


def test_a_second_serve_cluster_is_flagged() -> None:
    second = [*TREE, proc(60, 1, f"{RAY}/core/src/ray/raylet/raylet"), proc(61, 60, "ray::ServeController")]
    before = cpu.Snapshot(0.0, table(second))
    usage = cpu.usage(before, cpu.Snapshot(1.0, table(second)), cpu.Scope(frozenset({25}), ray=True))
    assert usage.roles["controller"].processes == 2
    row = ("1", "graph", {"cpu": report.jsonable(cpu.pool([usage], 1))})
    assert "**CPU counts more than one Serve cluster** at graph @ 1" in "\n".join(cpu.markdown("concurrency", [row]))
