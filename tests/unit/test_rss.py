"""Per-stage RSS from process tables, against a hand-made process tree."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from load.rss import (
    MIB,
    Proc,
    RssSample,
    RssSampler,
    StageRss,
    ThreadTimes,
    list_processes,
    markdown,
    mixed_clusters_warning,
    stage_of,
    stage_rss,
    summarize,
    thread_times,
)

# Two Serve clusters: the one under launcher 10, and another one's controller under raylet 40.
TREE = [
    Proc(1, 0, "/sbin/init", 1 * MIB),
    Proc(10, 1, "python -m load.graph_launcher --port 8100", 150 * MIB),
    Proc(11, 10, "/ray/raylet --raylet_socket_name=x", 30 * MIB),
    Proc(12, 11, "ray::ServeReplica:llm-app:llm", 600 * MIB),
    Proc(13, 12, "VLLM::EngineCore", 400 * MIB),
    Proc(14, 13, "VLLM::Worker", 1000 * MIB),
    Proc(15, 11, "ray::ServeReplica:llm-app:tokenizer.handle_request", 500 * MIB),
    Proc(16, 11, "ray::ServeReplica:llm-app:tokenizer", 300 * MIB),
    Proc(17, 11, "ray::ProxyActor", 140 * MIB),
    Proc(18, 11, "ray::ServeController.listen_for_change", 145 * MIB),
    Proc(19, 11, "ray::IDLE", 100 * MIB),
    Proc(40, 1, "/ray/raylet --raylet_socket_name=y", 30 * MIB),
    Proc(41, 40, "ray::ServeController", 145 * MIB),
]


@pytest.mark.parametrize(
    ("title", "stage"),
    [
        ("ray::ServeReplica:llm-app:llm", "llm-app:llm"),
        ("ray::ServeReplica:vision-app:multimodal.handle_request_streaming", "vision-app:multimodal"),
        ("ray::ServeReplica:tts-app:vocoder  ", "tts-app:vocoder"),
        ("ray::ProxyActor", "proxy"),
        ("ray::ServeController.listen_for_change", "controller"),
        ("VLLM::EngineCore", None),
        ("ray::IDLE", None),
        ("python -m ray::ServeReplica:a:b", None),
    ],
)
def test_stage_of_a_process_title(title: str, stage: str | None) -> None:
    assert stage_of(title) == stage


def test_children_count_with_their_stage_and_replicas_add_up() -> None:
    assert stage_rss(TREE, root_pid=10) == {
        "controller": StageRss(145 * MIB, 1),
        "llm-app:llm": StageRss((600 + 400 + 1000) * MIB, 1),  # the engine core and its worker too
        "llm-app:tokenizer": StageRss((500 + 300) * MIB, 2),
        "proxy": StageRss(140 * MIB, 1),
    }


def test_without_a_root_every_cluster_counts() -> None:
    assert stage_rss(TREE)["controller"] == StageRss(2 * 145 * MIB, 2)


def test_a_root_that_is_not_readable_still_selects_its_descendants() -> None:
    unreadable_launcher = [p for p in TREE if p.pid != 10]
    assert set(stage_rss(unreadable_launcher, root_pid=10)) == {"controller", "llm-app:llm", "llm-app:tokenizer",
                                                                "proxy"}  # fmt: skip


def test_a_parent_cycle_ends() -> None:
    assert stage_rss([Proc(5, 6, "ray::ProxyActor", MIB), Proc(6, 5, "x", MIB)]) == {"proxy": StageRss(2 * MIB, 1)}


def sample(at: float, **mib: float) -> RssSample:
    return RssSample(at, {stage.replace("_", ":"): StageRss(int(v * MIB), 1) for stage, v in mib.items()})


SAMPLES = [
    sample(0.0, proxy=100, app_llm=2000),
    sample(1.0, proxy=120, app_llm=2500),
    sample(2.0, proxy=110, app_llm=2400, app_tokenizer=300),
    sample(3.0, proxy=105),
]


def test_summary_of_a_span_start_peak_end() -> None:
    summary = summarize(SAMPLES, start=1.0, end=3.0)
    assert summary["proxy"] == {"start_mib": 120, "peak_mib": 120, "end_mib": 105, "processes": 1, "samples": 3}
    # Missing from the last sample (a replica restarting): summed over the samples it is in.
    assert summary["app:llm"] == {"start_mib": 2500, "peak_mib": 2500, "end_mib": 2400, "processes": 1, "samples": 2}
    assert summary["app:tokenizer"]["samples"] == 1
    assert set(summarize(SAMPLES, start=2.5)) == {"proxy"}
    assert summarize(SAMPLES, start=10.0) == {}


def test_markdown_table() -> None:
    lines = markdown(summarize(SAMPLES))
    assert "| proxy | 1 | 100 | 120 | 105 | +5 |" in lines


def test_sampler_samples_in_the_background_until_stopped() -> None:
    calls = []

    def procs() -> list[Proc]:
        calls.append(time.perf_counter())
        return TREE

    with RssSampler(interval_s=0.01, root_pid=10, list_procs=procs) as sampler:
        time.sleep(0.1)
    taken = len(sampler.samples)
    assert taken >= 3  # the first at once, some on the interval, one at stop
    assert sampler.samples[-1].stages["llm-app:llm"].rss_bytes == 2000 * MIB
    time.sleep(0.05)
    assert len(sampler.samples) == taken == len(calls)


def test_two_clusters_are_flagged() -> None:
    both = [RssSample(0.0, stage_rss(TREE))]
    assert "2 Serve clusters" in mixed_clusters_warning(summarize(both))[0]
    assert mixed_clusters_warning(summarize([RssSample(0.0, stage_rss(TREE, root_pid=10))])) == []


def test_thread_times_are_each_threads_schedstat(tmp_path: Path) -> None:
    for tid, stat in (("7", "1500000000 2500000000 42\n"), ("9", "250000000 0 3\n"), ("10", "")):
        (tmp_path / "7" / "task" / tid).mkdir(parents=True)
        (tmp_path / "7" / "task" / tid / "schedstat").write_text(stat)  # run ns, run-queue delay ns, slices
    assert thread_times(7, tmp_path) == {7: ThreadTimes(1.5, 2.5), 9: ThreadTimes(0.25, 0.0)}  # 10: unreadable
    assert thread_times(8, tmp_path) is None  # gone: unknown, not zero
    (tmp_path / "7" / "task" / "7" / "schedstat").write_text("")
    (tmp_path / "7" / "task" / "9" / "schedstat").write_text("")
    assert thread_times(7, tmp_path) is None  # no schedstats in this kernel
    if Path("/proc/self/task").exists() and Path("/proc/self/schedstat").exists():
        # The real files: this thread's is among them, and its run time is the first field.
        mine = thread_times(os.getpid())
        assert mine is not None and threading.get_native_id() in mine
        assert 0.0 < mine[threading.get_native_id()].cpu_s <= time.thread_time() + 0.1


def test_threads_are_read_only_when_asked() -> None:
    """The CPU meter's readings take every thread's times; the RSS sampler, once a second, does not."""
    me = os.getpid()
    assert next(p for p in list_processes() if p.pid == me).threads is None
    if Path("/proc/self/schedstat").exists():
        mine = next(p for p in list_processes(threads=True) if p.pid == me).threads
        assert mine is not None and threading.get_native_id() in mine
