"""The pace for answers of one length: admit as fast as requests end, averaged over a request's life.

Why: answers of one length admitted together end together, and a freed slot refilled at once keeps
such a cohort for the whole run. Paced by the room the outlook showed (its stream rate: zero while
a cohort at the budget has yet to end), the refills still came in bunches: the room opens when a
cohort ends, and it was filled within a second or two, the next cohort. On the simulator's long
phase (every answer 4,096 tokens) the requests in flight swung between 27 and 50 once a life, the
KV cache between half and 0.94 full, 0.77 on average (bench/README.md, fourteenth session).

A steady stream spreads ages by itself: admitted at a constant rate, the requests in flight are
spread evenly over their lives after one life, and a gap in admissions (a back-off, a full budget)
leaves a gap in the ends one life later that the stream fills again without overshooting. So the
pace is the rate at which requests end, averaged over a life (each tick's rate has the cohort's
bursts in it), plus a share of the way to the aim each life: a gap of requests in flight (averaged
alike, so the dip that a burst of ends leaves is not refilled at once) below the number the budget
holds with ages spread.

Pure: time is passed in, so the averages are tested and replayed without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Turnover:
    """Completions per second and requests in flight, each a moving average over about one life."""

    ends_per_s: float | None = None
    in_flight: float | None = None
    _at: float | None = None

    def add(self, at: float, ends_per_s: float, in_flight: int, life_s: float | None) -> None:
        """One tick's readings; ``life_s``: how long requests hold their slot (None before any answer:
        nothing is averaged yet, there is no life to average over)."""
        last, self._at = self._at, at
        if not life_s or life_s <= 0 or last is None:
            return
        if self.ends_per_s is None or self.in_flight is None:
            self.ends_per_s, self.in_flight = ends_per_s, float(in_flight)
            return
        weight = min(max(at - last, 0.0) / life_s, 1.0)
        self.ends_per_s += weight * (ends_per_s - self.ends_per_s)
        self.in_flight += weight * (in_flight - self.in_flight)

    def pace(self, aim: float, life_s: float, gain: float) -> float:
        """Admissions per second: the averaged rate of ends, which keeps what is in flight level, and
        ``gain`` of the gap to ``aim`` per ``life_s`` (negative above the aim, never below zero in
        all); ``aim / life_s`` until the averages are known."""
        if self.ends_per_s is None or self.in_flight is None:
            return max(aim, 1.0) / life_s
        return max(self.ends_per_s + gain * (aim - self.in_flight) / life_s, 0.0)
