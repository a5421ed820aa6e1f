"""The answers' lengths: the share of answers at least as long as any length."""

from __future__ import annotations

import numpy as np
import pytest

from flows.control.lengths import AnswerLengths


def shares(lengths: AnswerLengths, *tokens: float) -> list[float]:
    return lengths.at_least(np.array(tokens)).tolist()


def test_the_share_at_least_as_long_steps_down_at_each_length() -> None:
    lengths = AnswerLengths.of(np.array([100.0, 200.0, 300.0]), np.array([1.0, 2.0, 1.0]))
    assert shares(lengths, 0, 100, 101, 200, 201, 300, 301) == pytest.approx(
        [1, 1, 0.75, 0.75, 0.25, 0.25, 0]
    )
    # longer than: a request that made 200 tokens is running on only if its answer is longer
    assert lengths.longer(np.array([100.0, 200.0])).tolist() == pytest.approx([0.75, 0.25])
    assert lengths.mean() == pytest.approx(200.0)
    assert lengths.atoms.tolist() == [100.0, 200.0, 300.0]  # each at least a tenth of the answers


def test_lengths_of_few_answers_are_no_atoms() -> None:
    lengths = AnswerLengths.of(np.arange(1.0, 32.0), np.ones(31))
    assert lengths.atoms.size == 0  # 1/31 each: the projection only thins at them


def test_one_length_is_a_single_step() -> None:
    lengths = AnswerLengths.single(512.0)
    assert shares(lengths, 511, 512, 513) == [1.0, 1.0, 0.0] and lengths.mean() == 512.0
