"""How long a category's answers run: the share of them at least as long as any length, learned online.

Why the outlook needs more than a mean: a request's KV is freed when it ends, so what a request in
flight is expected to hold ``t`` seconds from now is its size then times the chance it is still
running. With one number a request was projected to grow until the category's mean length and end
there, and one already past the mean to end halfway to its ``max_tokens``: every young request at
its full size until the mean (half of them end before it), and every old one far too long where the
cap is far above what answers run to. Answers of a long tail (an exponential length of mean 1,500
under a cap of 16,384, as reasoning chains) had the projected peak a median 0.27 of the pool above
what the cache held, the credit spent in 91 % of the ticks at a KV usage of 0.70, and the run at
0.87x the best fixed setting; with the lengths 0.93-0.96x (bench/README.md, fifteenth session).
With the lengths' distribution a request that has already run long is expected to run on as the
answers longer than it did, a young one to end anywhere; answers of one length (every answer to
``max_tokens``) keep the single step at their length, so a cohort is still projected to its peak.

``LengthExposure`` learns them from the answers that ended and the requests still running;
``AnswerLengths`` is its snapshot, shared by the requests in flight of a category. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

ATOM_SHARE = 0.1
"""A length that this share of the answers have is a step of its own: the outlook evaluates the
projection just before each request in flight reaches it (where many answers run to ``max_tokens``,
the peak of a cohort is there); lengths with less weight only thin the projection a little each."""

TAIL_WEIGHT = 1e-3
"""The prior never weighs less than this (in a new answer's units): a request that has run past
every answer seen is expected to run to its cap (nothing says where it ends), never to end at once
(the prior, faded to nothing after a few hundred answers, would leave no answer longer than it)."""

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class AnswerLengths:
    """The share of answers at least as long as a length: a step function over the lengths seen."""

    values: Floats
    """The distinct lengths, ascending."""
    shares: Floats
    """The share of answers of each length."""
    at_least_share: Floats
    """``at_least_share[k]``: the share of answers of length ``values[k]`` or more; one more entry, 0."""
    atoms: Floats
    """The lengths that at least ``ATOM_SHARE`` of the answers have."""

    @classmethod
    def of(cls, values: Floats, weights: Floats) -> AnswerLengths:
        """Answers of these lengths (distinct, ascending) in these proportions."""
        shares = weights / weights.sum()
        at_least = np.append(np.cumsum(shares[::-1])[::-1], 0.0)
        return cls(values, shares, at_least, values[shares >= ATOM_SHARE])

    @classmethod
    def single(cls, length: float) -> AnswerLengths:
        """Every answer of one length."""
        value = np.array([length], dtype=np.float64)
        return cls(value, np.array([1.0]), np.array([1.0, 0.0]), value)

    def mean(self) -> float:
        """The expected length of an answer."""
        return float(self.values @ self.shares)

    def at_least(self, tokens: Floats) -> Floats:
        """The share of answers of ``tokens`` or more (left-continuous: a request that reaches its
        length still holds its KV at that moment)."""
        return self.at_least_share[np.searchsorted(self.values, tokens, side="left")]

    def longer(self, tokens: Floats) -> Floats:
        """The share of answers longer than ``tokens``: of those, the ones still running after that many."""
        return self.at_least_share[np.searchsorted(self.values, tokens, side="right")]


MAX_BINS = 128
"""Lengths are told apart to ``max_tokens`` / this (a token where ``max_tokens`` is smaller)."""


RESCALE_ANSWERS = 64
"""The weights are kept in units of the answer this many answers ago at most (so they neither
overflow nor underflow however long the run)."""


class LengthExposure:
    """A category's answers' lengths learned from the answers that ended and from the requests still
    running: for each band of lengths, the answers that ended in it over the requests that ran into
    it (its exposure), each counted when it left the band (ended in it or ran past it) and weighing
    ``decay`` less per answer that came back since, as the answers' window did.

    Why the requests still running: the answers that come back first are the short ones (a long one
    is still running), so their lengths alone say answers are short until the long ones end a life
    later: at the start of a run, and when a category's answers turn longer (every request admitted
    after the turn was projected with the short answers' lengths for a life, grew past them, and
    the cache overflowed: the simulator's shift, bench/README.md). A request that has run past a
    length without ending there is evidence that answers run past it, as soon as it gets there.
    This is Kaplan-Meier's estimate with the requests in flight censored at what they have made,
    within one decayed window: both the answers and the steps through each band are counted when
    they happen, so in a steady stream they count the same requests. (A request counted in a band
    when it entered it, older there than its end, let an end in a band few had reached read as
    more than all of them ending, and a steady stream's lengths came out a fifth short; weighed by
    when it was admitted, the long bands, reached only by requests a life old, had no weight left.)

    A request is counted in each band as it runs through it (the decode clock says how far it ran:
    ``reach``), and in the band it ends in when its answer comes back (``end``, which also takes
    back what the clock counted beyond its real length).
    """

    def __init__(self, max_tokens: int, decay: float) -> None:
        self.max_tokens = max_tokens
        self.bins = max(min(max_tokens, MAX_BINS), 1)
        self.width = max_tokens / self.bins
        self.growth = 1.0 / decay
        self.answers = 0
        self._base = 0
        """The answer whose weight is 1: each later one weighs ``growth`` times more than the last."""
        self.exposure: Floats = np.zeros(self.bins)
        """Weight of the requests that ran through or ended in each band."""
        self.ends: Floats = np.zeros(self.bins)
        """Weight of the answers that ended in each band."""
        self.end_tokens: Floats = np.zeros(self.bins)
        """Their lengths, weighted alike: where in its band an answer ends."""

    def passed(self, tokens: float) -> int:
        """How many bands a request that has made ``tokens`` has run through (all, at the cap)."""
        return min(int(tokens // self.width), self.bins)

    def _weight(self) -> float:
        """What a step or an answer counted now weighs."""
        return float(self.growth ** (self.answers - self._base))

    def reach(self, counted: int, tokens: float) -> int:
        """A request counted in ``counted`` bands so far has made ``tokens``: count it in the bands
        it has run through since. Returns how many it is counted in now."""
        now = self.passed(tokens)
        if now > counted:
            self.exposure[counted:now] += self._weight()
        return max(now, counted)

    def end(self, counted: int, tokens: int) -> None:
        """An answer of ``tokens`` came back from a request counted in ``counted`` bands: counted in
        the band it ended in, and its end there."""
        weight = self._weight()
        band = self.passed(tokens)
        final = min(band + 1, self.bins)
        if final > counted:
            self.exposure[counted:final] += weight
        elif final < counted:  # the clock ran ahead of it (a wait in the server's queue)
            self.exposure[final:counted] = np.maximum(self.exposure[final:counted] - weight, 0.0)
        if band < self.bins:
            self.ends[band] += weight
            self.end_tokens[band] += weight * tokens
        self.answers += 1
        if self.answers - self._base >= RESCALE_ANSWERS:
            scale = 1.0 / self._weight()
            self.exposure *= scale
            self.ends *= scale
            self.end_tokens *= scale
            self._base = self.answers

    def lengths(self, prior_weight: float) -> AnswerLengths:
        """The answers' lengths: the share of the requests that ran into each band that ended
        there, after ``prior_weight`` requests (in the units of an answer counted now, never below
        ``TAIL_WEIGHT``) that ran through every band and ended in none (they run to ``max_tokens``):
        a band no request has run through ends none, so a request past everything seen runs to
        its cap."""
        prior = max(prior_weight, TAIL_WEIGHT) * self._weight()
        hazard = np.clip(self.ends / (self.exposure + prior), 0.0, 1.0)
        reaching = np.concatenate([[1.0], np.cumprod(1.0 - hazard)])
        ending = np.append(reaching[:-1] * hazard, reaching[-1])
        middles = (np.arange(self.bins) + 0.5) * self.width
        where = np.divide(self.end_tokens, self.ends, out=middles, where=self.ends > 0)
        values = np.append(where, float(self.max_tokens))
        keep = ending > 0
        return AnswerLengths.of(values[keep], ending[keep])
