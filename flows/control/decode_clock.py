"""How many tokens a request in flight has made: a clock in tokens, run at the server's decode rate.

The outlook needs each request's progress (its KV now, how far it is from its end). Counted as its
age times a decode rate averaged over the answers (tokens per second a request held its slot), it
lagged whenever the batch changed: a decode step costs more the more requests it carries, so each
request decodes faster when few run and slower when many do, and the average spans about the last
20-40 answers (several request lives). Measured on the simulator at its shift from short to long
answers (bench/README.md, sixteenth session): after the back-off 16-22 requests ran, each far
faster than the 60 before them, the outlook counted them a third short, the learned occupancy
(measured KV per modelled token) rose to 1.38, and the budget it divides fell from 127k to 79k
tokens while the cache stood a fifth full.

The server says how fast it decodes now: SGLang's ``gen_throughput`` gauge (output tokens per
second over its last ~40 decode steps, the prefills between them included) over the requests it
runs is what each of them makes a second. Integrated over time that is a clock in tokens; a
request's progress is the clock now minus the clock at its admission, at whatever rate it ran
meanwhile. (Not the generated-token counter: SGLang's tokenizer counts an answer's tokens only when
it ends, so its steps follow the ends, not the decoding.)

Where the server counts its decode steps (SGLang 0.5.2x's ``/v1/loads``), the clock is that count:
each running request makes one token a step, so between two readings every request running all the
while made the difference, whatever the rate did, and the rate the clock runs at until the next
reading is that difference over the time between. The gauge's rate is a mean over the last ~40 decode
steps, refreshed only then, with the requests that ran then: at the start of a run on the CPU SGLang
it said 130-170 tokens a second per request (8 ran) for 2-3 s while 64 ran at about 27, the clock
counted the first cohort at its ``max_tokens`` within a second, the outlook held 1.3-2x what the
cache did for the first 20 s, the occupancy learned fell to 0.80, and the budget rose past the pool
(bench/README, nineteenth session). The count is SGLang's, not every step: 0.5.23 leaves out the
first decode step after each prefill (its moments are for a regression of step time on batch size),
so the clock runs 3-12 % slow and counts a request younger than it is, on the safe side
(``bench/clock_count.py``; a scale learned from the answers to correct it moved nothing measurable
and swung by half in a run's first lives: bench/README, thirty-seventh session).

Where the server says no rate (vLLM, whose metrics have no such gauge; a server without metrics)
the clock runs at the rate averaged over the answers (``Lane``'s); before either is known it stands
still (the outlook then counts every request at its final size anyway). Time spent in the server's
queue is counted as progress: the ready queue is short (``adaptive._queue_allowance``), and the
averaged rate counted that time as slow decoding instead.

Pure: fed readings and timestamps, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_ALPHA = 0.3
"""Weight of one reading of the server's rate (about a second apart; the gauge itself spans ~40
decode steps): a few seconds count, against several request lives for the average over the answers."""


@dataclass
class DecodeClock:
    """Tokens each running request has made since the clock started, advanced at every reading."""

    server_rate: float | None = None
    """Output tokens per second per running request, as the server says (None: it does not)."""
    _tokens: float = 0.0
    _at: float | None = None
    _rate: float = 0.0
    """The rate the clock runs at since ``_at``: the server's, else the fallback given at the reading."""
    _steps: tuple[float, float, float] | None = None
    """At the last reading of the server's decode steps: when, the count, and the clock then."""

    def reading(self, at: float) -> float:
        """The clock at ``at`` (at or after the last reading): a request admitted then is stamped so."""
        if self._at is None:
            return self._tokens
        return self._tokens + self._rate * max(at - self._at, 0.0)

    def observe(
        self,
        at: float,
        throughput: float | None,
        running: int | None,
        fallback: float | None,
        steps: float | None = None,
    ) -> None:
        """One reading of the server: its output tokens per second and how many requests it ran then
        (None where it does not say), its decode steps so far (None: not counted; where they are, the
        gauge is not read: it is the stale one); ``fallback``, the rate to run at while the server's
        is unknown."""
        self._tokens = self.reading(at)
        self._at = at
        last, self._steps = self._steps, None
        if steps is not None and last is not None and steps >= last[1] and at > last[0]:
            # counted since the last reading (steps going back: a restarted server)
            self._tokens = last[2] + steps - last[1]
            self.server_rate = (steps - last[1]) / (at - last[0])
        elif steps is None and throughput is not None and throughput > 0 and running:
            rate = throughput / running
            self.server_rate = (
                rate
                if self.server_rate is None
                else self.server_rate + RATE_ALPHA * (rate - self.server_rate)
            )
        if steps is not None:
            self._steps = (at, steps, self._tokens)
        runs_at = self.server_rate if self.server_rate is not None else fallback
        self._rate = runs_at if runs_at is not None and runs_at > 0 else 0.0
