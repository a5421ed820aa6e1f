"""The gate that enforces the limits: one lane per endpoint, requests admitted to the lane with room.

Following Netflix's concurrency-limits, the law (a ``Limit``, see ``limit.py``) is apart from who
enforces it (this ``Limiter``): the limiter only reads each lane's number at every admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar

import numpy as np

from flows.control.decode_clock import DecodeClock
from flows.control.demand import CategoryDemand
from flows.control.limit import Limit
from flows.control.outlook import Cohort, Outlook, project
from flows.control.pacer import Pacer
from flows.control.signals import ServerSample

T = TypeVar("T")

LIFE_ALPHA = 0.05
"""Weight of one answer in a lane's request life and decode rate: about the last 20-40 answers count."""


class Footprint(Protocol):
    """What a request will hold in the KV cache (a prompt's ``Demand``): its prompt, and its
    category's expectations, read afresh at every projection (they are learned while it runs)."""

    @property
    def model(self) -> CategoryDemand: ...

    @property
    def prompt_chars(self) -> int: ...


class Lane(Generic[T]):
    """One endpoint behind the gate: its law, and how many of its requests are in flight."""

    def __init__(self, endpoint: T, limit: Limit) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.in_flight = 0
        self.footprints: dict[int, tuple[CategoryDemand, dict[Footprint, tuple[int, float, float]]]] = {}
        """This lane's requests in flight that the token budget counts, by category (the key: its
        model's id), each with its prompt's characters, when it was admitted and the decode clock
        then: kept as rows ready for the projection's columns."""
        self.clock = DecodeClock()
        """Tokens a running request has made: each footprint's progress since its admission."""
        self.completed = 0
        self.life_s: float | None = None
        """How long this lane's requests hold their slot, a moving average of the completed ones."""
        self._tokens = 0.0
        """Output tokens per answer, averaged like ``life_s``: their ratio is the decode rate."""
        self._tokens_squared = 0.0
        """Their square, averaged alike: with ``_tokens`` it gives how much answers differ in length."""
        self.pacer = Pacer()
        """Spreads admissions when the law asks for it (``Decision.pace_per_s``); unpaced by default."""
        self.credit = math.inf
        """Admissions the law's token budget allows now (``Decision.credit``, redone when a request ends),
        in newcomers of ``_credit_unit`` tokens: each admission spends its own size in them."""
        self._credit_unit: float | None = None
        """The modelled KV of the newcomer the credit was counted in (the outlook's: the prompt and
        answer of those in flight on average); None: every admission spends one."""
        self.budget_tokens: float | None = None
        """The law's token budget (``Decision.budget_tokens``); None: no budget, no credit to redo."""
        self.block_tokens: int | None = None
        """The server's KV block (``ServerSample.block_tokens``): the outlook counts half of one more
        per request, what rounding it up to whole blocks wastes on average."""

    def finished(self, held_s: float, completion_tokens: int = 0) -> None:
        """One request answered after holding its slot ``held_s`` seconds (all its turns)."""
        self.completed += 1
        weight = max(LIFE_ALPHA, 1.0 / self.completed)  # a plain mean of the first answers
        self.life_s = held_s if self.life_s is None else self.life_s + weight * (held_s - self.life_s)
        self._tokens += weight * (completion_tokens - self._tokens)
        self._tokens_squared += weight * (completion_tokens**2 - self._tokens_squared)

    @property
    def answered_tokens_per_s(self) -> float | None:
        """Output tokens a request makes per second it holds its slot, averaged over the answers
        (queue and prefill included, so it errs slow); None before any answer."""
        if not self.life_s or self._tokens <= 0:
            return None
        return self._tokens / self.life_s

    @property
    def tokens_per_s(self) -> float | None:
        """The decode rate per request the outlook projects with: the server's now (``DecodeClock``),
        else the answers' average; None before any answer."""
        answered = self.answered_tokens_per_s
        if answered is None:
            return None
        return self.clock.server_rate or answered

    def admit(self, footprint: Footprint, now: float) -> None:
        """Count a request admitted now in the token budget (again: a request asked again from its
        start, after an outage, is as young as a newcomer)."""
        model = footprint.model
        rows = self.footprints.setdefault(id(model), (model, {}))[1]
        rows[footprint] = (footprint.prompt_chars, now, self.clock.reading(now))

    def forget(self, footprint: Footprint) -> None:
        """Stop counting a request that ended."""
        rows = self.footprints.get(id(footprint.model))
        if rows is not None:
            rows[1].pop(footprint, None)

    def read_server(self, now: float, sample: ServerSample | None) -> None:
        """Advance the decode clock to ``now`` with the server's reading (None: unread)."""
        throughput = sample.decode_tokens_per_s if sample is not None else None
        running = steps = None
        if sample is not None:  # the requests the rate was measured over
            running = sample.decode_running if sample.decode_running is not None else sample.running
            steps = sample.decode_steps
        self.clock.observe(now, throughput, running, self.answered_tokens_per_s, steps)

    @property
    def output_spread(self) -> float | None:
        """How much this lane's answers differ in length: the coefficient of variation of their output
        tokens (0: all alike), over about the last 20-40 answers; None before any answer. Answers of
        one length that start together end together, so a burst of admissions stays a burst."""
        if self._tokens <= 0:
            return None
        variance = max(self._tokens_squared - self._tokens**2, 0.0)
        return math.sqrt(variance) / self._tokens

    def cohorts(self, now: float) -> list[Cohort]:
        """The counted requests in flight by category, each with its age and the tokens it has made
        (the decode clock's advance since its admission), for the budget's outlook."""
        clock = self.clock.reading(now)
        cohorts = []
        for model, rows in self.footprints.values():
            if not rows:
                continue
            chars, admitted, stamps = np.array(list(rows.values()), dtype=np.float64).T
            cohorts.append(model.cohort(chars, now - admitted, np.maximum(clock - stamps, 0.0)))
        return cohorts

    @property
    def pad_tokens(self) -> float:
        """What rounding a request up to whole KV blocks wastes on average: half a block."""
        return (self.block_tokens - 1) / 2 if self.block_tokens else 0.0

    def outlook(self, now: float) -> Outlook | None:
        """What the counted requests in flight will hold over a newcomer's life (``outlook.py``)."""
        return project(self.cohorts(now), self.tokens_per_s, pad_tokens=self.pad_tokens)

    def redo_credit(self, now: float) -> None:
        """The credit again, once spent, from the requests in flight now and the last decision's
        token budget.

        A request that ends between two decisions frees room that the first could not grant: a
        newcomer admitted then would have run beside it. Left to the next decision, a batch that
        ends together waits up to a poll for its refills (measured on the real SGLang: in flight
        swinging between 30 and 60 once every two seconds, the KV cache half empty at each trough).
        """
        if self.budget_tokens is None or self.credit >= 1:
            return  # unspent: nothing waits for it (a projection is 0.1 ms at 60 in flight, 0.5 at 256)
        outlook = self.outlook(now)
        # nothing counted in flight: left spent, the last end of a batch stranded its waiters
        # (measured on the real vLLM: a run stalled with 0 in flight, a limit of 22 and a prompt waiting)
        self.set_credit(None if outlook is None else outlook.credit(self.budget_tokens), outlook)

    def set_credit(self, credit: int | None, outlook: Outlook | None = None) -> None:
        """The admissions the token budget allows now, counted in ``outlook``'s newcomers; None (no
        pool size known, or nothing counted in flight to project): no projection holds admissions
        back, only the limit does."""
        self.credit = math.inf if credit is None else credit
        self._credit_unit = None if outlook is None else outlook.newcomer_final

    def spend_credit(self, footprint: Footprint | None) -> None:
        """An admission spends its own modelled size of the credit, in the newcomers it was counted in.

        The outlook's newcomer is the average of the requests in flight, and a prompt set ordered by
        anything (a source's own order, a category after another) sends newcomers unlike them.
        Measured on the real SGLang (workload 2: prompts of 32-834 tokens in blocks whose means run
        from 150 to 720, answers of 64): a cohort ended, 102 requests of 217-token prompts on average
        were left in flight, the credit said 129 newcomers of 281 tokens, and 128 were admitted whose
        prompts averaged about 321 (the mean in flight rose to 275): the cache went 0.84, 0.89, 0.94,
        0.99 and the server retracted 9 times (7.5 per 1,000 requests in that run). A newcomer's own
        prompt is known when it is admitted; only its answer is the category's expectation. An A/B
        against counting one a newcomer (bench/README, thirty-sixth session): the simulator about half
        the retractions, workload 1 none either way at 1.05x, workload 2 within its noise.
        """
        charge = 1.0
        if footprint is not None and self._credit_unit and math.isfinite(self.credit):
            model = footprint.model
            prompt = model.prompt_tokens(float(footprint.prompt_chars)) + self.pad_tokens
            charge = (prompt + model.expected_output()) / self._credit_unit
        self.credit -= charge

    @property
    def room(self) -> int:
        """Free slots under the limit, none while the budget's credit is spent."""
        return self.limit.limit - self.in_flight if self.credit >= 1 else 0


class GateClosed(Exception):
    """The run is stopping (``Limiter.close``): no waiter is admitted any more."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
        self._waited_at = time.monotonic()
        """When an admission last had to wait for a slot (at first, the start)."""
        self._changed = asyncio.Condition()
        self._queue: deque[object] = deque()
        """One ticket per waiter, in arrival order: the head is served first."""
        self.closed = asyncio.Event()
        """Set by ``close``: every shard of every category stops, not only the one that saw why."""
        self.closed_reason: str | None = None

    @property
    def in_flight(self) -> int:
        return sum(lane.in_flight for lane in self.lanes)

    def unused_for(self) -> float:
        """Seconds since an admission last had to wait for a slot (0 while one waits): how long the
        lanes have had room that no prompt was waiting to take (the run's last prompts, a source
        slower than the servers)."""
        return 0.0 if self.waiting else time.monotonic() - self._waited_at

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
            chosen = max(ready, key=lambda candidate: candidate.room)
            for _, lane in waits:  # served elsewhere: a paced lane owes this waiter nothing
                if lane is not chosen:
                    lane.pacer.forget_waiter()
            return chosen, None
        soonest = min(wait for wait, _ in waits)
        return None, soonest if math.isfinite(soonest) else None  # paced at zero: wait for a change

    async def notify(self) -> None:
        """Wake waiters after a limit changed."""
        async with self._changed:
            self._changed.notify_all()

    async def close(self, reason: str) -> None:
        """Stop the run: every waiter, now or later, gets ``GateClosed``; releases still count.

        A run stops when no endpoint can serve it (a bad key, every server gone for good). The
        request that learns it stops its own shard; the others' dispatchers may be waiting for a slot
        that no closed lane will ever give (measured: a second category waited forever after the
        first had aborted, and the run never ended), so the gate itself closes.
        """
        async with self._changed:
            if self.closed_reason is None:
                self.closed_reason = reason
            self.closed.set()
            self._changed.notify_all()

    async def acquire(self, footprint: Footprint | None = None) -> Lane[T]:
        """A slot on the lane with the most room; ``footprint`` (if any) is counted by its budget."""
        async with self._changed:
            self.waiting += 1
            ticket = object()
            self._queue.append(ticket)
            waited = False
            try:
                while True:
                    if self.closed_reason is not None:
                        raise GateClosed(self.closed_reason)
                    now = time.monotonic()
                    lane, wait = self._best(now) if self._queue[0] is ticket else (None, None)
                    if lane is not None:
                        break
                    waited = True
                    if wait is None:
                        await self._changed.wait()
                    else:  # room, but paced: wake when the bucket allows, or earlier on a change
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), wait)
            finally:
                self.waiting -= 1
                if waited:
                    self._waited_at = time.monotonic()
                if self._queue[0] is ticket and len(self._queue) > 1:
                    self._changed.notify_all()  # served or cancelled: the next in line may have room
                self._queue.remove(ticket)
            lane.pacer.take(now)
            lane.spend_credit(footprint)
            lane.in_flight += 1
            if footprint is not None:
                lane.admit(footprint, now)
            return lane

    async def release(self, lane: Lane[T], footprint: Footprint | None = None) -> None:
        """Count the slot free at once, then wake the waiters: a release cancelled while it waits for
        the condition (a shard torn down) still frees its slot, which the lane would otherwise have
        lost for the rest of the run."""
        lane.in_flight -= 1
        if footprint is not None:
            lane.forget(footprint)
            lane.redo_credit(time.monotonic())
        async with self._changed:
            self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[T]:
        lane = await self.acquire()
        try:
            yield lane.endpoint
        finally:
            await self.release(lane)
