from __future__ import annotations

import asyncio

from flows.control.limit import FixedLimit
from flows.control.limiter import Lane, Limiter


class MutableLimit:
    def __init__(self, value: int) -> None:
        self.limit = value


async def test_limiter_never_exceeds_the_limit_and_admits_everyone() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(3))])
    peak = 0

    async def job() -> None:
        nonlocal peak
        async with limiter.slot():
            peak = max(peak, limiter.in_flight)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(job() for _ in range(50)))
    assert peak == 3
    assert limiter.in_flight == 0


async def test_limiter_spreads_over_lanes_by_free_room() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(1)), Lane("b", FixedLimit(3))])
    got = [(await limiter.acquire()).endpoint for _ in range(4)]
    assert sorted(got) == ["a", "b", "b", "b"]
    assert got[0] == "b"  # the lane with the most room goes first


async def test_a_raised_limit_admits_waiters_without_a_release() -> None:
    limit = MutableLimit(1)
    limiter: Limiter[str] = Limiter([Lane("a", limit)])
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    limit.limit = 2
    await limiter.notify()
    lane = await asyncio.wait_for(waiter, 1)
    assert lane.endpoint == "a" and limiter.in_flight == 2


async def test_a_lowered_limit_holds_new_requests_until_in_flight_drains() -> None:
    limit = MutableLimit(2)
    limiter: Limiter[str] = Limiter([Lane("a", limit)])
    first = await limiter.acquire()
    second = await limiter.acquire()
    limit.limit = 1
    waiter = asyncio.create_task(limiter.acquire())
    await limiter.release(first)
    await asyncio.sleep(0.01)
    assert not waiter.done()  # 1 in flight == new limit
    await limiter.release(second)
    await asyncio.wait_for(waiter, 1)
