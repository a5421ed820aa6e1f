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

    def reading(self, at: float) -> float:
        """The clock at ``at`` (at or after the last reading): a request admitted then is stamped so."""
        if self._at is None:
            return self._tokens
        return self._tokens + self._rate * max(at - self._at, 0.0)

    def observe(
        self, at: float, throughput: float | None, running: int | None, fallback: float | None
    ) -> None:
        """One reading of the server: its output tokens per second and how many requests it runs (None
        where it does not say); ``fallback``, the rate to run at while the server's is unknown."""
        self._tokens = self.reading(at)
        self._at = at
        if throughput is not None and throughput > 0 and running:
            rate = throughput / running
            self.server_rate = (
                rate
                if self.server_rate is None
                else self.server_rate + RATE_ALPHA * (rate - self.server_rate)
            )
        runs_at = self.server_rate if self.server_rate is not None else fallback
        self._rate = runs_at if runs_at is not None and runs_at > 0 else 0.0
