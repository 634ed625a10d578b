"""Slots: a bounded number of holders, a bounded queue of waiters served in arrival order."""

from __future__ import annotations

import asyncio

from serve_app.ingress.pipeline.slots import Slots


async def test_holders_up_to_the_limit_enter_at_once() -> None:
    slots = Slots(2, 0)
    assert await slots.acquire() and await slots.acquire()
    assert slots.held == 2


async def test_beyond_the_waiting_bound_a_caller_is_refused_at_once() -> None:
    slots = Slots(1, 1)
    assert await slots.acquire()
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    assert slots.waiting == 1
    assert await slots.acquire() is False
    slots.release()
    assert await waiter and (slots.held, slots.waiting) == (1, 0)


async def test_waiters_enter_in_arrival_order() -> None:
    slots = Slots(1, 3)
    assert await slots.acquire()
    order: list[int] = []

    async def wait(k: int) -> None:
        assert await slots.acquire()
        order.append(k)

    waiters = [asyncio.ensure_future(wait(k)) for k in range(3)]
    await asyncio.sleep(0)
    for _ in range(3):
        slots.release()
        await asyncio.sleep(0.01)
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    slots = Slots(1, 1)
    assert await slots.acquire()
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.waiting == 0
    slots.release()
    assert slots.held == 0 and await slots.acquire()
