"""The graph's models behind one base URL: each request's `Services` is picked by its `model`.

    ModelRouter.route(name, capability)   the routes: the model's Services, or the OpenAI error
    ModelRouter.lookup(name)              middlewares (pure ASGI, before the body is parsed): the
                                          model's Services, or None when `name` names none of them

A request without `model` (or with `""`) goes, as in vLLM's server, to the first model of the config, or for an
endpoint only some models serve (speech, for `/v1/audio/*`) to the first of those. An unknown model
is a 404 `model_not_found`.
What belongs to the front door (API keys, the body size limit, the in-flight backstop, the requests
counted by endpoint) is the graph's; limits, admission, health and stage metrics are each model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from serve_app.config import AdmissionConfig, AuthConfig
from serve_app.errors import NotFoundError
from serve_app.ingress.observability.metrics import IngressMetrics, merge_expositions
from serve_app.ingress.pipeline.services import Services

Capability = Literal["chat", "completions", "vision", "speech"]


def capabilities(services: Services) -> list[Capability]:
    """What a model does, as `/v1/models` lists it: every model chats and completes text; a
    `multimodal:` block adds images (vision), a `tts:` block speech."""
    found: list[Capability] = ["chat", "completions"]
    if services.multimodal is not None:
        found.append("vision")
    if services.vocoder is not None:
        found.append("speech")
    return found


class ModelRouter:
    def __init__(self, models: Sequence[Services], auth: AuthConfig | None = None) -> None:
        if not models:
            raise ValueError("a graph serves at least one model")
        self.models = {services.args.model.name: services for services in models}
        if len(self.models) != len(models):
            raise ValueError(f"model names must differ, got {[s.args.model.name for s in models]}")
        self.several = len(models) > 1
        only = models[0]
        # The only model's auth unless the graph's is given (the single-model `args:` form carries its own).
        self.auth = auth if auth is not None else only.args.auth
        # Requests by endpoint, and refusals before a model is known: with one model, its own metrics
        # (unlabelled, as before several were served); with several, the front door's own.
        self.metrics = IngressMetrics() if self.several else only.metrics
        # How a refusal before routing answers (status, Retry-After): the only model's, else the defaults.
        self.admission = AdmissionConfig() if self.several else only.args.admission
        self.max_request_bytes = max(s.args.limits.max_request_bytes for s in models)
        # The replica's backstop: the sum of the models' `admission.max_in_flight` (those that set one; none
        # set: no backstop). Each model's own admission (work gate, speech slots) stays per model.
        limits = [s.args.admission.max_in_flight for s in models if s.args.admission.max_in_flight is not None]
        self.max_in_flight = sum(limits) if limits else None

    def lookup(self, name: str | None) -> Services | None:
        """The Services of model `name` (None or "": of the first model); None when there is no such model."""
        if not name:
            return next(iter(self.models.values()))
        return self.models.get(name)

    def route(self, name: str | None, capability: Capability | None = None) -> Services:
        """The Services of the model a request names (see the module docstring for one without `model`)."""
        if name:
            services = self.models.get(name)
            if services is None:
                raise NotFoundError.no_model(name)
            return services
        able = [s for s in self.models.values() if capability is not None and capability in capabilities(s)]
        return able[0] if able else next(iter(self.models.values()))

    def health_report(self) -> tuple[bool, dict[str, str]]:
        """Every model's stages as its monitor last saw them; keys `<model>/<stage>` with several models."""
        if not self.several:
            return next(iter(self.models.values())).health.report()
        ok, details = True, dict[str, str]()
        for name, services in self.models.items():
            model_ok, stages = services.health.report()
            ok = ok and model_ok
            details |= {f"{name}/{stage}": detail for stage, detail in stages.items()}
        return ok, details

    async def render_metrics(self) -> bytes:
        """The ingress's metrics and each model's llm stage's; with several models every sample of a
        model carries a `model` label (the front door's requests by endpoint have none)."""
        parts: list[tuple[str | None, bytes]] = [] if not self.several else [(None, self.metrics.render())]
        for name, services in self.models.items():
            text = services.metrics.render()
            try:
                text += (await services.llm.metrics_text()).encode()
            except Exception as exc:  # the ingress's own metrics must still be served when an llm is down
                text += f"# llm stage metrics unavailable ({name}): {type(exc).__name__}\n".encode()
            parts.append((name if self.several else None, text))
        return parts[0][1] if not self.several else merge_expositions(parts)

    def start(self) -> None:
        for services in self.models.values():
            services.health.start()

    async def close(self) -> None:
        for services in self.models.values():
            await services.close()
