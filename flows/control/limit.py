"""Control laws: how many requests one endpoint may have in flight right now.

A ``Limit`` turns what it has been told into a number and does no I/O, so it can be replayed on a
recorded timeline. The fixed limit is what every other tool in the field does; the adaptive law
implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Limit(Protocol):
    """A control law: the number of requests allowed in flight right now."""

    @property
    def limit(self) -> int: ...


class FixedLimit:
    """A constant limit: what every other tool in the field does, and the baseline to beat."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit


class GuardedLimit:
    """An endpoint's limit, or 0 while it is down: no new requests to a dead server."""

    def __init__(self, inner: Limit, is_up: Callable[[], bool]) -> None:
        self.inner = inner
        self.is_up = is_up

    @property
    def limit(self) -> int:
        return self.inner.limit if self.is_up() else 0


class Hold(Protocol):
    """Whether a lane is held to ``floor`` right now (``OomHold``: its server short of GPU memory)."""

    holding: bool
    floor: int


class HeldLimit:
    """A limit lowered to its hold's ``floor`` while the hold says so: a fixed limit under the OOM
    guard, held while its server's GPUs have less free memory than the guard's minimum
    (``oom_hold.py``).

    Lowered, not closed: free memory that stays low (another job's, or the allocator's cache, which
    SGLang does not give back when requests end) would stop the lane for good, as the adaptive law
    never goes below ``min_limit`` either."""

    def __init__(self, inner: Limit, hold: Hold) -> None:
        self.inner = inner
        self.hold = hold

    @property
    def limit(self) -> int:
        return min(self.inner.limit, self.hold.floor) if self.hold.holding else self.inner.limit
