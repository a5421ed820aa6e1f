"""The gate that enforces the limits: one lane per endpoint, requests admitted to the lane with room.

Following Netflix's concurrency-limits, the law (a ``Limit``, see ``limit.py``) is apart from who
enforces it (this ``Limiter``): the limiter only reads each lane's number at every admission.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from flows.control.limit import Limit

T = TypeVar("T")


class Lane(Generic[T]):
    """One endpoint behind the gate: its law, and how many of its requests are in flight."""

    def __init__(self, endpoint: T, limit: Limit) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.in_flight = 0
        self.projected_tokens = 0.0
        """Projected KV demand of this lane's requests in flight (what the token budget reads)."""
        self.completed = 0

    @property
    def room(self) -> int:
        return self.limit.limit - self.in_flight


class Limiter(Generic[T]):
    """Admits a request to the lane (endpoint) with the most room; waits while every lane is full.

    The limit is re-read at every admission (instead of sizing a semaphore once), so an adaptive law
    can shrink or grow a window between two requests without draining anything: in-flight requests
    finish, new ones wait. One condition serves all lanes, so a free slot anywhere wakes a waiter.
    """

    def __init__(self, lanes: list[Lane[T]]) -> None:
        if not lanes:
            raise ValueError("at least one endpoint is needed")
        self.lanes = lanes
        self.waiting = 0
        self._changed = asyncio.Condition()

    @property
    def in_flight(self) -> int:
        return sum(lane.in_flight for lane in self.lanes)

    def _best(self) -> Lane[T] | None:
        lane = max(self.lanes, key=lambda candidate: candidate.room)
        return lane if lane.room > 0 else None

    async def notify(self) -> None:
        """Wake waiters after a limit changed."""
        async with self._changed:
            self._changed.notify_all()

    async def acquire(self, cost: float = 0.0) -> Lane[T]:
        """A slot on the lane with the most room; ``cost`` is the request's projected KV demand."""
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self._best() is not None)
            finally:
                self.waiting -= 1
            lane = self._best()
            assert lane is not None
            lane.in_flight += 1
            lane.projected_tokens += cost
            return lane

    async def release(self, lane: Lane[T], cost: float = 0.0) -> None:
        async with self._changed:
            lane.in_flight -= 1
            lane.projected_tokens = max(0.0, lane.projected_tokens - cost)
            self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[T]:
        lane = await self.acquire()
        try:
            yield lane.endpoint
        finally:
            await self.release(lane)
