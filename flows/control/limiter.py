"""The gate that enforces the limits: one lane per endpoint, requests admitted to the lane with room.

Following Netflix's concurrency-limits, the law (a ``Limit``, see ``limit.py``) is apart from who
enforces it (this ``Limiter``): the limiter only reads each lane's number at every admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from flows.control.limit import Limit
from flows.control.pacer import Pacer

T = TypeVar("T")

LIFE_ALPHA = 0.05
"""Weight of one answer in a lane's request life: about the last 20-40 answers count."""


class Lane(Generic[T]):
    """One endpoint behind the gate: its law, and how many of its requests are in flight."""

    def __init__(self, endpoint: T, limit: Limit) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.in_flight = 0
        self.projected_tokens = 0.0
        """Projected KV demand of this lane's requests in flight (what the token budget reads)."""
        self.completed = 0
        self.life_s: float | None = None
        """How long this lane's requests hold their slot, a moving average of the completed ones."""
        self.pacer = Pacer()
        """Spreads admissions when the law asks for it (``Decision.pace_per_s``); unpaced by default."""

    def finished(self, held_s: float) -> None:
        """One request answered after holding its slot ``held_s`` seconds (all its turns)."""
        self.completed += 1
        weight = max(LIFE_ALPHA, 1.0 / self.completed)  # a plain mean of the first answers
        self.life_s = held_s if self.life_s is None else self.life_s + weight * (held_s - self.life_s)

    @property
    def room(self) -> int:
        return self.limit.limit - self.in_flight


class Limiter(Generic[T]):
    """Admits a request to the lane (endpoint) with the most room; waits while every lane is full.

    The limit is re-read at every admission (instead of sizing a semaphore once), so an adaptive law
    can shrink or grow a window between two requests without draining anything: in-flight requests
    finish, new ones wait. One condition serves all lanes, so a free slot anywhere wakes a waiter.

    Waiters are served first come, first served: only the one at the head of the queue may take a
    slot. Without the queue a dispatcher that had just been admitted asked again before the others
    woke up, found the next free slot first, and kept winning: each shard's dispatcher is a waiter,
    so a run's categories went one after the other (measured: all of one category's 150 prompts
    before the first of the other's) instead of side by side.
    """

    def __init__(self, lanes: list[Lane[T]]) -> None:
        if not lanes:
            raise ValueError("at least one endpoint is needed")
        self.lanes = lanes
        self.waiting = 0
        self._changed = asyncio.Condition()
        self._queue: deque[object] = deque()
        """One ticket per waiter, in arrival order: the head is served first."""

    @property
    def in_flight(self) -> int:
        return sum(lane.in_flight for lane in self.lanes)

    def _best(self, now: float) -> tuple[Lane[T] | None, float | None]:
        """The lane with the most room whose pacer admits now; else how long until a paced lane
        would (None: no lane has room, wait for a release or a new limit)."""
        waits = []
        for lane in self.lanes:
            if lane.room > 0:
                waits.append((lane.pacer.wait_s(now), lane))
            else:
                lane.pacer.forget_waiter()
        if not waits:
            return None, None
        ready = [lane for wait, lane in waits if wait == 0.0]
        if ready:
            return max(ready, key=lambda candidate: candidate.room), None
        return None, min(wait for wait, _ in waits)

    async def notify(self) -> None:
        """Wake waiters after a limit changed."""
        async with self._changed:
            self._changed.notify_all()

    async def acquire(self, cost: float = 0.0) -> Lane[T]:
        """A slot on the lane with the most room; ``cost`` is the request's projected KV demand."""
        async with self._changed:
            self.waiting += 1
            ticket = object()
            self._queue.append(ticket)
            try:
                while True:
                    now = time.monotonic()
                    lane, wait = self._best(now) if self._queue[0] is ticket else (None, None)
                    if lane is not None:
                        break
                    if wait is None:
                        await self._changed.wait()
                    else:  # room, but paced: wake when the bucket allows, or earlier on a change
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), wait)
            finally:
                self.waiting -= 1
                if self._queue[0] is ticket and len(self._queue) > 1:
                    self._changed.notify_all()  # served or cancelled: the next in line may have room
                self._queue.remove(ticket)
            lane.pacer.take(now)
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
