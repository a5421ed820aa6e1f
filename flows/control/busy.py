"""How much of the time a server computed, from its own cumulative busy counter.

SGLang (0.5.2x) counts the microseconds its scheduler spends in decode and prefill steps
(``/v1/loads``). Between two readings their difference over the wall time between them is the
share of that time the server was busy: the direct answer to "is it starved?", which an empty queue
with a cache below full only suggests (a server bound by compute is busy with its cache half empty:
bench/README.md, workload 2). Pure: readings in, shares out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BusyMeter:
    """The busy share between the last two readings, and over every reading of the run."""

    recent: float | None = None
    _last: tuple[float, float] | None = None
    _busy_s: float = 0.0
    _span_s: float = 0.0

    def add(self, at: float, busy_us: float) -> None:
        """A reading at ``at`` (monotonic seconds). A counter that went backwards is a restarted
        server: its new count starts a new span; the time between is not counted."""
        last, self._last = self._last, (at, busy_us)
        if last is None or at <= last[0]:
            return
        if busy_us < last[1]:
            self.recent = None
            return
        busy_s, span_s = (busy_us - last[1]) / 1e6, at - last[0]
        self._busy_s += busy_s
        self._span_s += span_s
        self.recent = min(busy_s / span_s, 1.0)

    def overall(self) -> float | None:
        """The share over every pair of readings so far; None before two."""
        return min(self._busy_s / self._span_s, 1.0) if self._span_s > 0 else None
