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

Pure: a snapshot built from the recent answers; ``demand.py`` learns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

ATOM_SHARE = 0.1
"""A length that this share of the answers have is a step of its own: the outlook evaluates the
projection just before each request in flight reaches it (where many answers run to ``max_tokens``,
the peak of a cohort is there); lengths with less weight only thin the projection a little each."""

PRIOR_CLIP = 4096
"""The prior's answers run to ``max_tokens`` or this many tokens, the fewer. A cap far above what
answers run to (16,384 for reasoning chains that average 1,500) held the first requests to the
cap: 109k tokens of budget made room for 7 of them, the cache stayed a fifth full for the first 5 s,
and a 900-prompt run of a long tail on the simulator ran at 0.92x the best fixed setting, 0.98x
with the clip, no retraction either way (bench/README.md, seventeenth session). SGLang's own
admission clips its estimate of an answer here (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``); past it
a request is still expected to run to its cap (``TAIL_WEIGHT``)."""

TAIL_WEIGHT = 1e-3
"""The prior never weighs less than this (in the newest answer's units): a request that has run past
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
    def learn(
        cls, recent: Sequence[int], decay: float, max_tokens: int, prior_weight: float
    ) -> AnswerLengths:
        """From the recent answers' output tokens (oldest first), each weighing ``decay`` less per
        newer answer, and ``prior_weight`` (in the newest answer's units) at ``max_tokens`` or
        ``PRIOR_CLIP``, the fewer: the first answers to come back are the shortest ones, so until
        enough have come back the category is held to its cap (the caller fades it:
        ``demand.PRIOR_DECAY``)."""
        lengths = np.minimum(np.asarray(recent, dtype=np.float64), max_tokens)
        weights = decay ** np.arange(len(lengths) - 1, -1, -1, dtype=np.float64)
        prior = float(min(max_tokens, PRIOR_CLIP))
        prior_weight = prior_weight if len(recent) else 1.0
        if prior < max_tokens:  # past the clip the tail runs to the cap, never fading
            lengths, weights = np.append(lengths, float(max_tokens)), np.append(weights, TAIL_WEIGHT)
        else:
            prior_weight = max(prior_weight, TAIL_WEIGHT)
        lengths, weights = np.append(lengths, prior), np.append(weights, prior_weight)
        values, where = np.unique(lengths, return_inverse=True)
        shares = np.bincount(where, weights=weights) / weights.sum()
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
