"""The limits app's tokenizer scales up under sustained load and back down after it, within its bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.serve._private.common import ReplicaState

from tests.integration.support import LIMITS_APP, TEXT_MODEL, deployment, wait_for

# ~120 KB of text: tens of milliseconds of tokenizing, so that requests pile up at the tokenizer stage.
PROMPT = "the quick brown fox jumps over the lazy dog while parsing json and yaml files " * 1500


def running_replicas(stage: str) -> int:
    status = serve.status().applications[LIMITS_APP].deployments[deployment(TEXT_MODEL, stage)]
    return int(status.replica_states.get(ReplicaState.RUNNING, 0))


def target_replicas(metrics_url: str, stage: str) -> float | None:
    """Serve's `serve_autoscaling_target_replicas`, as Prometheus scrapes it from the head node's Ray metrics."""
    text = httpx.get(metrics_url, timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "ray_serve_autoscaling_target_replicas"
                    and sample.labels.get("application") == LIMITS_APP
                    and sample.labels.get("deployment") == deployment(TEXT_MODEL, stage)):  # fmt: skip
                return float(sample.value)
    return None


@contextmanager
def sustained_load(url: str, clients: int) -> Iterator[list[int | str]]:
    """`clients` threads posting /tokenize back to back until the block ends; yields the statuses seen (a
    client's HTTP error, which ends that client, as its repr)."""
    stop = threading.Event()
    statuses: list[int | str] = []

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                try:
                    statuses.append(http.post(f"{url}/tokenize", json={"prompt": PROMPT}).status_code)
                except httpx.HTTPError as exc:  # a thread's exception would only be a warning
                    statuses.append(repr(exc))
                    return

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_tokenizer_scales_up_under_load_and_down_after(limits_url: str, cluster: Any) -> None:
    metrics_url = f"http://127.0.0.1:{cluster.head_node.metrics_export_port}/metrics"
    wait_for(lambda: running_replicas("tokenizer") == 1, 60, "the tokenizer to start at its minimum")
    started = time.monotonic()
    with sustained_load(limits_url, clients=12) as statuses:
        wait_for(lambda: running_replicas("tokenizer") == 2, 60, "the tokenizer to scale up")
        scaled_up_s = time.monotonic() - started
        # Ray exports metrics every few seconds: the scale-up shows there a little later.
        wait_for(lambda: target_replicas(metrics_url, "tokenizer") == 2, 30, "the metrics to show 2 replicas")
        assert running_replicas("tokenizer") == 2  # max_replicas bounds it
    stopped = time.monotonic()
    wait_for(lambda: running_replicas("tokenizer") == 1, 90, "the tokenizer to scale back down")
    scaled_down_s = time.monotonic() - stopped
    wait_for(lambda: target_replicas(metrics_url, "tokenizer") == 1, 30, "the metrics to show 1 replica")
    print(f"\nscaled up after {scaled_up_s:.1f} s of load, down {scaled_down_s:.1f} s after it; "
          f"{len(statuses)} requests")  # fmt: skip
    assert statuses and set(statuses) == {200}
    # Only the tokenizer is autoscaled; the other stages kept their fixed replica counts.
    assert running_replicas("llm") == 1
