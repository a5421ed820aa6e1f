"""Requests in flight for the outlook's tests, written as one would say them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flows.control.lengths import AnswerLengths
from flows.control.outlook import Cohort


def cohort(
    prompt: float | Sequence[float],
    output: float,
    max_output: int,
    ages: Sequence[float],
    lengths: AnswerLengths | None = None,
    made: Sequence[float] | None = None,
) -> Cohort:
    """Requests of one category of these ages (and, if given, tokens made), each with ``prompt``
    tokens (one for all, or one each)."""
    prompts = np.broadcast_to(np.asarray(prompt, dtype=np.float64), (len(ages),)).copy()
    return Cohort(
        prompts,
        np.asarray(ages, dtype=np.float64),
        None if made is None else np.asarray(made, dtype=np.float64),
        output,
        max_output,
        lengths,
    )
