"""The ingress's Prometheus metrics: requests, in-flight and per-stage time.

Stages report their own time in the messages they return (as HF text-embeddings-inference reports
per-stage time), so one histogram here covers the whole path without scraping every replica.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
            "llm_first_chunk (generate call to first chunk), total.",
            ["stage"], buckets=_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter("serve_graph_tokens", "Prompt and generated tokens.", ["kind"], registry=self.registry)
        self.image_cache = Counter(
            "serve_graph_image_cache", "Images of requests found (hit) or not (miss) in the multimodal stage's "
            "processed-image cache; hit rate = hit / (hit + miss).", ["result"], registry=self.registry,
        )  # fmt: skip

    def render(self) -> bytes:
        return generate_latest(self.registry)
