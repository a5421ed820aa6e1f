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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from flows.control.lengths import AnswerLengths, Floats

SLICES = 32
"""The newcomer's life is cut into this many slices; each keeps the largest projection within it."""
EPSILON_TOKENS = 1e-6
"""A request is counted as still running at the very moment it reaches its length (the largest it
holds), whatever the rounding of the time at which the projection reaches it."""

Indices = npt.NDArray[np.intp]


@dataclass(frozen=True, eq=False)
class Cohort:
    """The requests in flight of one category, as the projection sees them: one column entry per
    request, what the category expects of them once. Columns, not an object per request: a
    projection runs at every release while the budget binds, and building one object per request
    in flight cost about 2.5 µs each (2.6 ms of a 3.8 ms projection at 1,024 in flight;
    ``bench/outlook_cost.py``)."""

    prompt_tokens: Floats
    age_s: Floats
    made_tokens: Floats | None
    """Output tokens each has made so far (``decode_clock.py``); None: its age at the projection's rate."""
    output_tokens: float
    """The category's expected output (learned online, ``demand.py``)."""
    max_output: int
    lengths: AnswerLengths | None = None
    """The category's answers' lengths (``lengths.py``); None: a single step, at ``output_tokens`` or
    past it halfway to ``max_output`` (``expected_final_output``)."""

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def made(self, tokens_per_s: float) -> Floats:
        """The output tokens each has made, at most ``max_output``."""
        made = self.age_s * tokens_per_s if self.made_tokens is None else self.made_tokens
        return np.minimum(made, self.max_output)


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
    newcomer_sizes: tuple[float, ...] | None = None
    """What a newcomer is expected to hold at the end of each slice: its prompt and answer so far,
    times the chance it still runs (answers of spread lengths end all along a life). None: it grows
    from its prompt to ``newcomer_output`` without ending."""

    def newcomer_size(self, j: int) -> float:
        """What a newcomer holds at the end of slice ``j`` of its life."""
        if self.newcomer_sizes is not None:
            return self.newcomer_sizes[j]
        return self.newcomer_prompt + self.newcomer_output * (j + 1) / len(self.peaks)

    @property
    def newcomer_final(self) -> float:
        """What a newcomer holds at its end: its prompt (the half block included) and its answer."""
        return self.newcomer_prompt + self.newcomer_output

    def growth_share(self) -> float:
        """The share of a newcomer's final KV that its answer makes (0: all prompt, 1: all answer):
        how far a cohort of such requests swings the cache between its admission and its end."""
        final = self.newcomer_final
        return self.newcomer_output / final if final > 0 else 0.0

    def room(self, budget_tokens: float) -> float:
        """How many newcomers fit now with the projection under ``budget_tokens`` all their life
        (negative: the requests in flight already overrun the budget by that many newcomers)."""
        return min(
            (budget_tokens - peak) / max(self.newcomer_size(j), 1e-9) for j, peak in enumerate(self.peaks)
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


def expected_final_output(output_tokens: float, max_output: int, done: float) -> float:
    """Where no lengths are known (``Cohort.lengths`` None), one step at the category's expected
    output; past it, halfway between what it made and its ``max_tokens`` (the only bound known); a
    request at its cap ends now."""
    if done < output_tokens:
        return output_tokens
    return max(done, (done + max_output) / 2)


def project(cohorts: Sequence[Cohort], tokens_per_s: float | None, pad_tokens: float = 0.0) -> Outlook | None:
    """The outlook of these requests (None when there are none).

    Each request in flight is expected to hold, ``t`` seconds from now, its size then times the
    chance that it is still running (``Survival``). Between two lengths at which answers end the
    projection only rises, so its largest value in a slice is at the slice's end or just before
    a request reaches a length that many answers have (``lengths.ATOM_SHARE``; every request's own
    end where no lengths are known): each is evaluated exactly (a request counted at its largest
    size within the slice over-counted by the requests ending in it: a sixteenth of them at their
    final size was 7 % of the pool on the simulator's long phase).

    ``pad_tokens``: what each request holds beyond its own tokens, newcomers too: half a block
    where the pool hands out whole blocks (vLLM's are 128 tokens on CPU: about 64 a request, a
    fifth of the bench's pool at 55 requests, which the learned occupancy caught only after the
    first preemptions).
    """
    count = sum(len(c) for c in cohorts)
    if not count:
        return None
    prompts = float(sum(c.prompt_tokens.sum() for c in cohorts))
    outputs = sum(c.output_tokens * len(c) for c in cohorts)
    newcomer_prompt = prompts / count + pad_tokens
    newcomer_output = outputs / count
    if not tokens_per_s or tokens_per_s <= 0:
        total = prompts + pad_tokens * count + outputs
        return Outlook(total, (total,), newcomer_prompt, newcomer_output)
    survival = Survival(cohorts, tokens_per_s, pad_tokens)
    width = max(newcomer_output / tokens_per_s / SLICES, 1e-9)
    horizon = width * SLICES
    ends: Floats = np.linspace(width, horizon, SLICES)
    steps = survival.steps()
    steps = steps[(steps > 0) & (steps <= horizon)]
    held = survival.held(np.concatenate([ends, steps]))
    peaks = held[:SLICES].copy()
    np.maximum.at(peaks, np.maximum(np.ceil(steps / width).astype(int) - 1, 0), held[SLICES:])
    now_tokens = float(survival.now.sum())
    peaks[0] = max(peaks[0], now_tokens)
    newcomer = None
    if all(c.lengths is not None for c in cohorts):
        newcomer = tuple(survival.newcomer(ends).tolist())
    return Outlook(
        now_tokens, tuple(peaks.tolist()), newcomer_prompt, newcomer_output, tokens_per_s, newcomer
    )


class Survival:
    """The requests in flight as the projection sees them: what each holds now, how far it has run,
    and the chance it is still running after any length (its category's ``AnswerLengths`` given
    that it has run this far; one step at ``expected_final_output`` where none are known)."""

    def __init__(self, cohorts: Sequence[Cohort], tokens_per_s: float, pad_tokens: float) -> None:
        self.rate = tokens_per_s
        self.prompts = np.concatenate([c.prompt_tokens for c in cohorts]) + pad_tokens
        self.done = np.concatenate([c.made(tokens_per_s) for c in cohorts])
        self.now = self.prompts + self.done
        self.groups: list[tuple[AnswerLengths, Indices]] = []
        start = 0
        for cohort in cohorts:
            index = np.arange(start, start + len(cohort))
            start += len(cohort)
            if cohort.lengths is not None:
                self.groups.append((cohort.lengths, index))
                continue
            for i in index:  # no lengths known: one step of its own, at what it is expected to make
                final = expected_final_output(cohort.output_tokens, cohort.max_output, float(self.done[i]))
                self.groups.append((AnswerLengths.single(final), np.array([i])))

    def alive(self, times: Floats) -> Floats:
        """The chance that each request (rows) still runs at each time (columns), just before it
        would end there."""
        made = self.done[:, None] + self.rate * times[None, :] - EPSILON_TOKENS
        chance = np.zeros_like(made)
        for lengths, index in self.groups:
            ran = lengths.longer(self.done[index])
            still = lengths.at_least(made[index])
            chance[index] = np.divide(still, ran[:, None], out=np.zeros_like(still), where=ran[:, None] > 0)
        return chance

    def held(self, times: Floats) -> Floats:
        """The expected KV of the requests in flight at each time."""
        size = self.now[:, None] + self.rate * times[None, :]
        return (size * self.alive(times)).sum(axis=0)

    def steps(self) -> Floats:
        """The times at which a request reaches a length many answers end at: the projection drops
        there, so its peak may be just before."""
        times = []
        for lengths, index in self.groups:
            ahead = lengths.atoms[None, :] - self.done[index][:, None]
            times.append(ahead[ahead > 0] / self.rate)
        return np.concatenate(times)

    def newcomer(self, times: Floats) -> Floats:
        """What a newcomer is expected to hold at each time: a request in flight's prompt, growing
        from nothing, still running with its category's chance (averaged over those in flight)."""
        made = self.rate * times - EPSILON_TOKENS
        total = np.zeros_like(times)
        for lengths, index in self.groups:
            still = lengths.at_least(made)
            total += ((self.prompts[index][:, None] + self.rate * times[None, :]) * still[None, :]).sum(
                axis=0
            )
        return total / len(self.done)
