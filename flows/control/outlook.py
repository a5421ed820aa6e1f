"""What the requests in flight will hold in the KV cache over the next request life, by their ages.

A request's KV footprint grows a token a decode step, from its prompt to prompt + output, and is
freed when it ends. Counting every request at its final size (what surely fits) keeps the cache
about half full on average when ages are spread; counting every request at the average size lets a
cohort admitted together outgrow the cache at the end of its life. Measured on the simulator's long
phase (every answer runs to 4,096 tokens): requests came in bursts, the cache swung from 0.55 to 1.0
once per request life, and every peak was a back-off.

So the budget looks ahead: from each request's age and the per-request decode rate it projects the
KV the requests in flight will hold over one newcomer's life, and admits as many newcomers as keep
that projection under the budget at every moment of it. A newcomer admitted next to a young cohort
grows with it and must fit beside the cohort's peak; one admitted next to old requests uses the room
they are about to free.

Pure: the projection (``project``) is computed by the controller from the lane's requests; the law
reads only the ``Outlook`` (a few numbers a tick, kept in the run's timeline, so a replay sees what
the law saw).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

SLICES = 32
"""The newcomer's life is cut into this many slices; each keeps the largest projection within it."""


@dataclass(frozen=True)
class Flight:
    """One request in flight, as the projection sees it."""

    prompt_tokens: float
    output_tokens: float
    """Its category's expected output (learned online, ``demand.py``)."""
    max_output: int
    age_s: float


@dataclass(frozen=True)
class Outlook:
    now_tokens: float
    """KV the requests in flight are modelled to hold now (what the server's usage is compared with)."""
    peaks: tuple[float, ...]
    """The largest projected KV of the requests in flight in each slice of a newcomer's life."""
    newcomer_prompt: float
    newcomer_output: float
    tokens_per_s: float | None = None
    """Per-request decode rate the projection used; None before any answer: every request is then
    counted at its final size from the start (one slice)."""

    def growth_share(self) -> float:
        """The share of a newcomer's final KV that its answer makes (0: all prompt, 1: all answer):
        how far a cohort of such requests swings the cache between its admission and its end."""
        final = self.newcomer_prompt + self.newcomer_output
        return self.newcomer_output / final if final > 0 else 0.0

    def room(self, budget_tokens: float) -> float:
        """How many newcomers fit now with the projection under ``budget_tokens`` all their life
        (negative: the requests in flight already overrun the budget by that many newcomers)."""
        slices = len(self.peaks)
        return min(
            (budget_tokens - peak) / (self.newcomer_prompt + self.newcomer_output * (j + 1) / slices)
            for j, peak in enumerate(self.peaks)
        )

    def credit(self, budget_tokens: float) -> int:
        """The newcomers that may be admitted now: ``room``, whole, never negative."""
        return max(math.floor(self.room(budget_tokens)), 0)

    def steady_count(self, budget_tokens: float) -> float:
        """How many newcomers hold ``budget_tokens`` on average with their ages spread evenly over
        their life: each holds its prompt and, on average, half its answer."""
        return budget_tokens / max(self.newcomer_prompt + self.newcomer_output / 2, 1e-9)

    def stream_rate(self, budget_tokens: float) -> float | None:
        """Admissions per second that, kept up for a newcomer's whole life, keep the projection under
        ``budget_tokens`` all the while (None before any answer: no decode rate, no life).

        Newcomers admitted as a steady stream have spread ages: at ``rate`` a second, those admitted
        by ``t`` hold ``rate x (prompt x t + decode rate x t**2 / 2)``. Where the requests in flight
        are spread too, the stream replaces them as they end and the sum stays level; where they
        form a cohort, its end is the constraint and the rate is about zero until it ends, then the
        stream refills the cache over one life instead of forming the next cohort at once (the
        credit alone re-formed a cohort every life: bench/README, eighth session). Each slice's
        peak is set against the stream at the slice's middle: against its end the rate erred low by
        what the requests in flight free within a slice (a thirty-second of their final sizes, 6 %
        of the budget with ages spread), and this is a pace, not the credit's bound on the peak.
        """
        if not self.tokens_per_s or self.tokens_per_s <= 0:
            return None
        slices = len(self.peaks)
        width = self.newcomer_output / self.tokens_per_s / slices
        rates = []
        for j, peak in enumerate(self.peaks):
            t = (j + 0.5) * width
            stream_tokens = self.newcomer_prompt * t + self.tokens_per_s * t * t / 2
            rates.append((budget_tokens - peak) / max(stream_tokens, 1e-9))
        return max(min(rates), 0.0)


def expected_final_output(flight: Flight, done: float) -> float:
    """Past its category's expected output, a request is expected halfway between what it made and
    its ``max_tokens`` (the only bound known); a request at its cap ends now."""
    if done < flight.output_tokens:
        return flight.output_tokens
    return max(done, (done + flight.max_output) / 2)


def project(flights: Iterable[Flight], tokens_per_s: float | None, pad_tokens: float = 0.0) -> Outlook | None:
    """The outlook of these requests (None when there are none).

    The projection rises as every request grows and drops where one ends, so its largest value in
    a slice is at one of the ends within it or at the slice's end: each is evaluated exactly (a
    request counted at its largest size within the slice over-counted by the requests ending in
    it: a sixteenth of them at their final size was 7 % of the pool on the simulator's long
    phase).

    ``pad_tokens``: what each request holds beyond its own tokens, newcomers too: half a block
    where the pool hands out whole blocks (vLLM's are 128 tokens on CPU: about 64 a request, a
    fifth of the bench's pool at 55 requests, which the learned occupancy caught only after the
    first preemptions).
    """
    items = list(flights)
    if not items:
        return None
    newcomer_prompt = sum(f.prompt_tokens for f in items) / len(items) + pad_tokens
    newcomer_output = sum(f.output_tokens for f in items) / len(items)
    if not tokens_per_s or tokens_per_s <= 0:
        total = sum(f.prompt_tokens + pad_tokens + f.output_tokens for f in items)
        return Outlook(total, (total,), newcomer_prompt, newcomer_output)
    ends: list[tuple[float, float]] = []  # (seconds until it ends, tokens it holds now)
    for flight in items:
        done = min(tokens_per_s * flight.age_s, flight.max_output)
        final = expected_final_output(flight, done)
        ends.append(((final - done) / tokens_per_s, flight.prompt_tokens + pad_tokens + done))
    ends.sort()
    times = [end for end, _ in ends]
    held_after = list(itertools.accumulate((held for _, held in reversed(ends)), initial=0.0))[::-1]

    def at(t: float) -> float:
        """The projection at ``t``: the requests that end at ``t`` or later, each grown since now."""
        first = bisect.bisect_left(times, t)
        return held_after[first] + tokens_per_s * t * (len(times) - first)

    width = max(newcomer_output / tokens_per_s / SLICES, 1e-9)
    peaks = [at((j + 1) * width) for j in range(SLICES)]
    peaks[0] = max(peaks[0], at(0.0))
    for end in times:
        j = max(math.ceil(end / width) - 1, 0)
        if j < SLICES:
            peaks[j] = max(peaks[j], at(end))
    return Outlook(held_after[0], tuple(peaks), newcomer_prompt, newcomer_output, tokens_per_s)
