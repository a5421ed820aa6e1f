"""Admission pacing: a token bucket that spreads a lane's admissions over time.

Why: when every answer runs to the same length, requests admitted together finish together, and
every freed slot refilled at once keeps a burst a burst for the rest of the run. KV usage then swings
once per request life (from about half full to full), every peak is a back-off, and the number in
flight that keeps the peaks under full leaves the cache a quarter empty on average. Admitting at
most ``rate_per_s`` (the law's steady stream: the rate requests end, averaged over a life,
``turnover.py``) with a small ``burst`` spreads a burst's refills over a life, so ages spread.

The bucket caps what a quiet spell earns, not what a waiter was owed. A waiter told to come back
at ``due`` may be woken late: an event loop busy writing a shard, or a client core shared with other
processes, wakes a 70 ms timer a second late. Capping the tokens at the bucket then would admit one
bucket per wake-up and starve the server (measured on the CPU vLLM: 2 in flight for 8 s with room
for 35, a bucket of 2 and the loop waking about once a second). So the tokens earned after ``due``
are kept until the waiter comes: the rate is held on average, and only a lane that waited for the
pacer (not for room) is owed.

Pure: time is passed in, so the bucket is tested without a clock. ``rate_per_s`` None means no
pacing (a fixed limit, the slow start, or before the first answers come back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Pacer:
    rate_per_s: float | None = None
    burst: float = 1.0
    _tokens: float = 0.0
    _at: float | None = None
    _due: float | None = None
    """When a waiter was told the next admission is allowed (None: nobody waits for this bucket)."""

    def set(self, rate_per_s: float | None, burst: float, now: float) -> None:
        """A new rate and bucket size; the tokens earned so far are kept (those owed to a late waiter
        above the bucket included: they are spent, never trimmed)."""
        self._refill(now)
        if self.rate_per_s is None and rate_per_s is not None:
            self._tokens = burst  # pacing starts with a full bucket: nothing waits at the switch
        if rate_per_s is None:
            self._due = None
        self.rate_per_s, self.burst = rate_per_s, max(burst, 1.0)

    def wait_s(self, now: float) -> float:
        """Seconds until one admission is allowed (0: now); a positive answer is a promise to the
        caller, who waits that long: what it earns once it is late is kept for it."""
        if self.rate_per_s is None:
            return 0.0
        self._refill(now)
        if self._tokens >= 1.0:
            return 0.0
        if self.rate_per_s <= 0.0:
            return math.inf  # nothing until the next rate (a cohort at the budget: wait for its end)
        wait = (1.0 - self._tokens) / self.rate_per_s
        if self._due is None:
            self._due = now + wait
        return wait

    def take(self, now: float) -> None:
        """Spend one admission (call only after ``wait_s`` said 0)."""
        if self.rate_per_s is not None:
            self._refill(now)
            self._tokens -= 1.0
        self._due = None

    def forget_waiter(self) -> None:
        """The waiter now waits for room, not for this bucket: time from here on is a quiet spell
        (after a back-off the refills must stay paced, however long the room takes to come)."""
        self._due = None

    def _refill(self, now: float) -> None:
        if self._at is not None and self.rate_per_s is not None:
            late_from = now if self._due is None else min(max(self._due, self._at), now)
            earned = self._tokens + (late_from - self._at) * self.rate_per_s
            self._tokens = max(self._tokens, min(self.burst, earned))  # owed above the bucket: stays
            self._tokens += (now - late_from) * self.rate_per_s  # owed to a late waiter: not capped
        self._at = now
