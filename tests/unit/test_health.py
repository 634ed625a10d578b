"""serve_app/ingress/observability/health.py: the background health monitor."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.ingress.observability.health import HealthMonitor


class Check:
    """A stage check the test controls: ok, failing, or hanging until cancelled."""

    def __init__(self, error: BaseException | None = None, hang: bool = False) -> None:
        self.error = error
        self.hang = hang
        self.calls = 0
        self.called = asyncio.Event()
        self.cancelled = False

    async def __call__(self) -> None:
        self.calls += 1
        self.called.set()
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.error is not None:
            raise self.error


def monitor(timeout_s: float = 5.0, **checks: Check) -> HealthMonitor:
    return HealthMonitor(dict(checks), interval_s=60.0, timeout_s=timeout_s)


def monitor_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "health-monitor" and not t.done()]


async def test_starting_before_the_first_poll() -> None:
    assert monitor(tokenizer=Check(), llm=Check()).report() == (
        False,
        {"tokenizer": "starting", "llm": "starting"},
    )


async def test_ok_after_a_poll() -> None:
    m = monitor(tokenizer=Check(), llm=Check())
    await m.poll_once()
    assert m.report() == (True, {"tokenizer": "ok", "llm": "ok"})


async def test_failing_check_is_unhealthy_with_detail() -> None:
    m = monitor(tokenizer=Check(), llm=Check(RuntimeError("engine gone")))
    await m.poll_once()
    assert m.report() == (False, {"tokenizer": "ok", "llm": "RuntimeError: engine gone"})


async def test_detail_is_capped() -> None:
    m = monitor(llm=Check(ValueError("x" * 1000)))
    await m.poll_once()
    detail = m.report()[1]["llm"]
    assert len(detail) == 300
    assert detail.startswith("ValueError: xxx")


async def test_hanging_check_times_out_and_is_cancelled() -> None:
    hanging = Check(hang=True)
    m = monitor(timeout_s=0.01, tokenizer=Check(), llm=hanging)
    await m.poll_once()
    assert m.report() == (False, {"tokenizer": "ok", "llm": "no answer within 0.01 s"})
    assert hanging.cancelled


async def test_mark_failed_turns_red_at_once_until_the_next_poll() -> None:
    m = monitor(tokenizer=Check(), llm=Check())
    await m.poll_once()
    m.mark_failed("llm", "The engine died")
    assert m.report() == (False, {"tokenizer": "ok", "llm": "The engine died"})
    await m.poll_once()  # a new replica answers again
    assert m.report() == (True, {"tokenizer": "ok", "llm": "ok"})


async def test_recovery_after_failure() -> None:
    llm = Check(RuntimeError("down"))
    m = monitor(llm=llm)
    await m.poll_once()
    assert m.report()[0] is False
    llm.error = None
    await m.poll_once()
    assert m.report() == (True, {"llm": "ok"})


async def test_start_polls_in_the_background_and_stop_cancels() -> None:
    hanging = Check(hang=True)
    m = monitor(tokenizer=Check(), llm=hanging)
    m.start()
    m.start()  # idempotent
    assert len(monitor_tasks()) == 1
    await asyncio.wait_for(hanging.called.wait(), 10)
    await m.stop()
    assert hanging.cancelled
    assert hanging.calls == 1
    assert monitor_tasks() == []
    await m.stop()  # stopping twice is harmless


async def test_background_poll_reports_ok() -> None:
    tokenizer, llm = Check(), Check()
    m = monitor(tokenizer=tokenizer, llm=llm)
    m.start()
    try:
        await asyncio.wait_for(asyncio.gather(tokenizer.called.wait(), llm.called.wait()), 10)
        # Both checks have been entered; the poll finishes once the loop runs its gather callback.
        for _ in range(100):
            if "starting" not in m.report()[1].values():
                break
            await asyncio.sleep(0)
        assert m.report() == (True, {"tokenizer": "ok", "llm": "ok"})
    finally:
        await m.stop()


async def test_stop_without_start() -> None:
    await monitor(llm=Check()).stop()


@pytest.mark.parametrize("error", [KeyError("k"), ConnectionError("refused")])
async def test_any_exception_is_unhealthy(error: Exception) -> None:
    m = monitor(llm=Check(error))
    await m.poll_once()
    assert m.report() == (False, {"llm": f"{type(error).__name__}: {error}"})


class GatedCheck:
    """Answers ok, but only once `release` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.entered.set()
        await self.release.wait()


async def test_a_poll_begun_before_a_failure_does_not_hide_it() -> None:
    gated = GatedCheck()
    m = HealthMonitor({"llm": gated}, interval_s=60.0, timeout_s=5.0)
    poll = asyncio.create_task(m.poll_once())
    await asyncio.wait_for(gated.entered.wait(), 10)
    m.mark_failed("llm", "replica lost mid-call: ActorDiedError")
    gated.release.set()
    await poll
    assert m.report() == (False, {"llm": "replica lost mid-call: ActorDiedError"})
    await m.poll_once()  # begun after the failure: a replacement answering turns it green
    assert m.report() == (True, {"llm": "ok"})
