"""`/health` of the whole graph, answered by a process that does no request-path work.

An ingress replica's event loop also parses, admits and streams every request; under load its own
`/health` route waited behind that work (p99 1.0-1.8 s against 19-27 ms for `vllm serve`). This app
runs in a replica of its own (`deployments/health.py`, `route_prefix: /health`), so a probe waits
for nothing but itself. It polls each application's ingress in the background: the ingress answers
with its own stages' last check, so a dead or hung stage shows here within two poll intervals, and a
hung or dead ingress (the call times out or fails) within one poll interval plus the timeout.

It also stamps its verdict into its node's HAProxy (`stamp`, `ingress/gate/`): while the stamp is green
and fresh (two poll intervals), HAProxy answers `GET /health` itself and the probe never waits for a
Python event loop; red, stale, or asked with a query string, it reaches this app.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from pydantic import Field, model_validator
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from serve_app.errors import ServiceUnavailableError
from serve_app.ingress.observability.health import Check, HealthMonitor
from serve_app.strict_args import Strict


class GraphHealthArgs(Strict):
    """The `args:` of the graph's `/health` application (`deployments.health:build_health_app`)."""

    applications: list[str] = Field(
        min_length=1, description="Names of the applications (of this config) whose ingress and stages it watches."
    )

    @model_validator(mode="after")
    def _distinct(self) -> GraphHealthArgs:
        if len(set(self.applications)) != len(self.applications):
            raise ValueError(f"applications must be distinct, got {self.applications}")
        return self

    poll_interval_s: float = Field(default=1.0, gt=0.0, le=60.0, description="How often it asks each ingress.")
    timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=60.0,
        description="Time an ingress has to answer; past it the application is unhealthy (a hung ingress). "
        "Above the ingress's worst answer time under overload, or `/health` flaps red under load.",
    )


logger = logging.getLogger(__name__)

# What an application's ingress reports: (all stages ok, {stage: "ok" or what failed}).
Report = tuple[bool, dict[str, str]]


def ingress_check(report: Callable[[], Awaitable[Report]], stages: dict[str, str]) -> Check:
    """A check that keeps the application's stages in `stages` and fails naming those not ok (the ingress
    itself, when it cannot answer at all)."""

    async def check() -> None:
        try:
            ok, latest = await report()
        except asyncio.CancelledError:  # the monitor's timeout: a hung ingress
            stages.clear()
            stages["ingress"] = "no answer"
            raise
        except Exception as exc:
            stages.clear()
            stages["ingress"] = f"{type(exc).__name__}: {exc}"[:300]
            raise
        stages.clear()
        stages.update({"ingress": "ok", **latest})
        if not ok:
            raise ServiceUnavailableError("; ".join(f"{s}: {d}" for s, d in latest.items() if d != "ok"))

    return check


class GraphHealthApp:
    """A plain ASGI app answering every GET with the last report: under `route_prefix: /health` the
    path it sees is empty, which a router would redirect to `/health/` (307) rather than answer."""

    def __init__(
        self,
        args: GraphHealthArgs,
        reports: Mapping[str, Callable[[], Awaitable[Report]]],
        stamp: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        # Each application's stages as its ingress last reported them ({} before its first answer).
        self.stages: dict[str, dict[str, str]] = {app: {} for app in reports}
        checks = {app: ingress_check(report, self.stages[app]) for app, report in reports.items()}
        self.monitor = HealthMonitor(checks, args.poll_interval_s, args.timeout_s)
        # Takes the Unix time in ms until which the graph is green, 0 when it is not. Stamped every half
        # poll interval from the last verdict, apart from the polls: a poll slowed by a busy ingress (up
        # to `timeout_s`) does not let the stamp lapse, and a red verdict reaches HAProxy within half an
        # interval. Green lasts two intervals, so a hung or dead health replica goes stale by itself.
        self._stamp_sink = stamp
        self._stamp_every_s = args.poll_interval_s / 2
        self._green_for_ms = int(2000 * args.poll_interval_s)
        self._stamp_failing = False  # each change logged once
        self._stamping: asyncio.Task[None] | None = None
        self._stamp_lock = asyncio.Lock()

    def start(self) -> None:
        self.monitor.start()
        if self._stamp_sink is not None and self._stamping is None:
            self._stamping = asyncio.get_running_loop().create_task(self._stamp_forever(), name="health-stamp")

    async def stop(self) -> None:
        if self._stamping is not None:
            self._stamping.cancel()
            await asyncio.gather(self._stamping, return_exceptions=True)
            self._stamping = None
            await self._stamp(False)  # shutting down: not green for the stamp's remaining life
        await self.monitor.stop()

    async def _stamp_forever(self) -> None:
        while True:
            await self._stamp()
            await asyncio.sleep(self._stamp_every_s)

    async def _stamp(self, green: bool | None = None) -> None:
        """Stamps `green`, or the last verdict, one stamp at a time: a green one begun before a red poll
        cannot land after the red one."""
        assert self._stamp_sink is not None
        async with self._stamp_lock:
            green = self.monitor.report()[0] if green is None else green
            until_ms = int(time.time() * 1000) + self._green_for_ms if green else 0
            try:
                # Not `wait_for`: on Python 3.11 a cancel (`stop`) that meets a stamp failing at that moment
                # is lost to the `except` below, and the stamping loop then never ends.
                async with asyncio.timeout(self._stamp_every_s):
                    await self._stamp_sink(until_ms)
            except Exception as exc:  # HAProxy reloading, hung or absent: this app answers /health meanwhile
                if not self._stamp_failing:
                    logger.warning("the health stamp failed (this app answers /health until it works): %r", exc)
                self._stamp_failing = True
                return
            if self._stamp_failing:
                logger.info("the health stamp works again")
            self._stamp_failing = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        ok, details = self.monitor.report()
        if not ok and self._stamping is not None:
            # HAProxy's green must end before anyone hears red here (a client that saw red and asks
            # `/health` again gets red, not the stamp's last half interval of green).
            await self._stamp(False)
        apps = {app: {"status": detail, "stages": self.stages[app]} for app, detail in details.items()}
        body = {"status": "ok" if ok else "unhealthy", "applications": apps}
        await JSONResponse(body, status_code=200 if ok else 503)(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
