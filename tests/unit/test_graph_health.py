"""serve_app/graph_health.py: the graph's `/health`, from the reports of each application's ingress."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest

from serve_app.graph_health import GraphHealthApp, GraphHealthArgs, Report


def reporting(*reports: Report | BaseException | None) -> Callable[[], Awaitable[Report]]:
    """An ingress that answers each poll with the next of `reports` (the last repeats); an exception is
    raised, None never answers (a hung ingress)."""
    answers = list(reports)

    async def report() -> Report:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is None:
            await asyncio.Event().wait()
        if isinstance(answer, BaseException):
            raise answer
        assert not isinstance(answer, BaseException) and answer is not None
        return answer

    return report


OK: Report = (True, {"tokenizer": "ok", "llm": "ok"})


async def get_health(
    reports: dict[str, Callable[[], Awaitable[Report]]],
    polls: int = 1,
    stamp: Callable[[int], Awaitable[None]] | None = None,
) -> httpx.Response:
    args = GraphHealthArgs(applications=list(reports), poll_interval_s=0.01, timeout_s=0.05)
    app = GraphHealthApp(args, reports, stamp)
    app.start()
    try:
        await asyncio.sleep(0.1 * polls)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://health") as client:
            return await client.get("/health")
    finally:
        await app.stop()


async def test_green_when_every_application_is() -> None:
    response = await get_health({"llm-app": reporting(OK), "tts-app": reporting(OK)})
    assert response.status_code == 200
    app = {"status": "ok", "stages": {"ingress": "ok", "tokenizer": "ok", "llm": "ok"}}
    assert response.json() == {"status": "ok", "applications": {"llm-app": app, "tts-app": app}}


async def test_a_failed_stage_is_named_with_its_application() -> None:
    broken: Report = (False, {"tokenizer": "ok", "llm": "EngineDeadError: gone"})
    response = await get_health({"llm-app": reporting(OK), "tts-app": reporting(broken)})
    assert response.status_code == 503
    apps = response.json()["applications"]
    assert apps["llm-app"]["status"] == "ok"
    assert apps["tts-app"] == {
        "status": "ServiceUnavailableError: llm: EngineDeadError: gone",
        "stages": {"ingress": "ok", "tokenizer": "ok", "llm": "EngineDeadError: gone"},
    }


async def test_a_hung_ingress_turns_red_after_the_timeout() -> None:
    response = await get_health({"llm-app": reporting(None)})
    assert response.status_code == 503
    app = response.json()["applications"]["llm-app"]
    assert "no answer within 0.05 s" in app["status"] and app["stages"] == {"ingress": "no answer"}


async def test_an_unreachable_ingress_is_red_and_recovers() -> None:
    response = await get_health({"llm-app": reporting(RuntimeError("no such application"), OK)}, polls=3)
    assert response.status_code == 200
    response = await get_health({"llm-app": reporting(RuntimeError("no such application"))})
    error = "RuntimeError: no such application"
    assert response.json()["applications"]["llm-app"] == {"status": error, "stages": {"ingress": error}}


async def test_the_asgi_lifespan_starts_and_stops_the_polls() -> None:
    calls = 0

    async def report() -> Report:
        nonlocal calls
        calls += 1
        return OK

    app = GraphHealthApp(GraphHealthArgs(applications=["llm-app"], poll_interval_s=0.01), {"llm-app": report})
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    sent: list[str] = []

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    lifespan = asyncio.create_task(app({"type": "lifespan"}, inbox.get, send))  # type: ignore[arg-type]
    await inbox.put({"type": "lifespan.startup"})
    await asyncio.sleep(0.1)
    assert calls > 1 and app.monitor.report() == (True, {"llm-app": "ok"})
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(lifespan, 1)
    polled = calls
    await asyncio.sleep(0.05)
    assert calls == polled
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_the_stamp_is_green_for_two_poll_intervals_red_as_zero_and_zero_at_the_end() -> None:
    stamps: list[int] = []

    async def stamp(until_ms: int) -> None:
        stamps.append(until_ms)

    before_ms = int(time.time() * 1000)
    await get_health({"llm-app": reporting(OK)}, stamp=stamp)
    green = [until for until in stamps if until]
    assert len(green) > 5 and all(before_ms + 20 <= until <= time.time() * 1000 + 20 for until in green)
    assert stamps[-1] == 0  # stopped
    stamps.clear()
    await get_health({"llm-app": reporting((False, {"llm": "EngineDeadError: gone"}))}, stamp=stamp)
    assert len(stamps) > 5 and set(stamps) == {0}


async def test_a_failing_stamp_is_logged_once_and_this_app_still_answers(caplog: pytest.LogCaptureFixture) -> None:
    async def stamp(until_ms: int) -> None:
        raise ConnectionRefusedError("no HAProxy")

    response = await get_health({"llm-app": reporting(OK)}, polls=3, stamp=stamp)
    assert response.status_code == 200
    assert caplog.text.count("the health stamp failed") == 1


async def test_a_stop_that_meets_a_failing_stamp_ends_the_stamping() -> None:
    app: GraphHealthApp
    cancelled = 0

    async def stamp(until_ms: int) -> None:
        nonlocal cancelled
        # `stop` stamps red once more after the loop ended: only the loop's stamps cancel it.
        if app._stamping is not None:
            app._stamping.cancel()  # the stop's cancel, arriving as the stamp fails (3.11's wait_for lost it)
            cancelled += 1
        raise ConnectionRefusedError("no HAProxy")

    args = GraphHealthArgs(applications=["llm-app"], poll_interval_s=0.01, timeout_s=0.05)
    app = GraphHealthApp(args, {"llm-app": reporting(OK)}, stamp)
    app.start()
    try:
        assert app._stamping is not None
        await asyncio.wait_for(asyncio.gather(app._stamping, return_exceptions=True), 1)
    finally:
        await app.stop()
    assert cancelled == 1


async def test_a_hung_stamp_neither_stops_the_polls_nor_the_next_stamps() -> None:
    calls = 0

    async def stamp(until_ms: int) -> None:
        nonlocal calls
        calls += 1
        await asyncio.Event().wait()

    polled = 0

    async def report() -> Report:
        nonlocal polled
        polled += 1
        return OK

    response = await get_health({"llm-app": report}, stamp=stamp)
    assert response.status_code == 200 and polled > 3 and calls > 3


async def test_red_is_stamped_before_this_app_answers_it() -> None:
    stamps: list[int] = []

    async def stamp(until_ms: int) -> None:
        stamps.append(until_ms)

    args = GraphHealthArgs(applications=["llm-app"], poll_interval_s=60, timeout_s=0.05)
    app = GraphHealthApp(args, {"llm-app": reporting((False, {"llm": "EngineDeadError: gone"}))}, stamp)
    app.start()
    try:
        await asyncio.sleep(0.1)  # one poll, and one stamp of it; the next stamp in 30 s
        stamps.clear()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://health") as client:
            assert (await client.get("/health")).status_code == 503
        assert stamps == [0]
    finally:
        await app.stop()
