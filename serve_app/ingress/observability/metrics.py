"""The ingress's Prometheus metrics: requests, in-flight, per-stage time and calls, rejections, TTFT.

Stages report their own time in the messages they return (as HF text-embeddings-inference reports
per-stage time), so one histogram here covers the whole path without scraping every replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class IngressMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "serve_graph_requests", "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "status"], registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "serve_graph_requests_in_flight", "Requests being answered.", ["endpoint"], registry=self.registry
        )
        self.stage_seconds = Histogram(
            "serve_graph_stage_seconds",
            "Time per stage: multimodal and tokenizer (inside the stage), multimodal_call and tokenizer_call "
            "(incl. the hop), "
            "llm_first_chunk (generate call to first chunk), llm_engine (engine submit to first output, inside "
            "the llm replica), vocoder, total.",
            ["stage"], buckets=_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.stage_in_flight = Gauge(
            "serve_graph_stage_in_flight",
            "Calls from this ingress to each stage not yet answered (for llm: streams open): the stage's queue "
            "plus its work in progress, as this ingress sees it.",
            ["stage"], registry=self.registry,
        )  # fmt: skip
        self.rejections = Counter(
            "serve_graph_rejections",
            "Requests refused or ended early, by the stage that was full or late and the reason: stage_full "
            "(Serve queue limit), engine_queue_full, max_streams (speech), ingress_full (admission.max_in_flight), "
            "expected_wait (admission by work; stage `gate`: refused by HAProxy), deadline.",
            ["stage", "reason"], registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "serve_graph_ttft_seconds",
            "Time to first token: total (ingress start of the request path to the first chunk), engine (its "
            "submit to first output inside the llm replica) and framework (total - engine: hops, stages, queues).",
            ["part"], buckets=_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter("serve_graph_tokens", "Prompt and generated tokens.", ["kind"], registry=self.registry)
        self.image_cache = Counter(
            "serve_graph_image_cache", "Images of requests found (hit) or not (miss) in the multimodal stage's "
            "processed-image cache; hit rate = hit / (hit + miss).", ["result"], registry=self.registry,
        )  # fmt: skip

    def show_admission_speed(self, speed: Callable[[], float]) -> None:
        """The gauge of a model admitted by work (`work_admission.py`); other models have none."""
        Gauge(
            "serve_graph_admission_speed",
            "How fast the engine clears admitted work against admission's configured rates, as learned from the "
            "traffic (1: as configured; 0.5: half as fast, so half as much is admitted; engine_speed.py).",
            registry=self.registry,
        ).set_function(speed)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Merged(Collector):
    """Several expositions as one: families of the same name merged, each part's samples labelled."""

    def __init__(self, parts: list[tuple[str | None, bytes]]) -> None:
        self.parts = parts

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for model, text in self.parts:
            for family in text_string_to_metric_families(text.decode()):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    labels = sample.labels if model is None else {"model": model, **sample.labels}
                    into.samples.append(sample._replace(labels=labels))
        return merged.values()


def merge_expositions(parts: list[tuple[str | None, bytes]]) -> bytes:
    """Prometheus texts as one valid exposition (one HELP/TYPE per family); the samples of a part with a
    name get `model="<name>"`, so the same metric of several models stays apart."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(parts))
    return generate_latest(registry)
