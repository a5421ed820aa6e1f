"""The answers' lengths: the share of answers at least as long as any length, learned online."""

from __future__ import annotations

import numpy as np
import pytest

from flows.control.lengths import AnswerLengths


def shares(lengths: AnswerLengths, *tokens: float) -> list[float]:
    return lengths.at_least(np.array(tokens)).tolist()


def test_the_share_at_least_as_long_steps_down_at_each_length_seen() -> None:
    lengths = AnswerLengths.learn([100, 200, 200, 300], 1.0, 400, prior_weight=0.0)
    # (beside the least a prior at the cap weighs: TAIL_WEIGHT)
    expected = [1, 1, 0.75, 0.75, 0.25, 0.25, 0]
    assert shares(lengths, 0, 100, 101, 200, 201, 300, 301) == pytest.approx(expected, abs=1e-3)
    # longer than: a request that made 200 tokens is running on only if its answer is longer
    assert lengths.longer(np.array([100.0, 200.0])).tolist() == pytest.approx([0.75, 0.25], abs=1e-3)
    assert lengths.mean() == pytest.approx(200.0, abs=1)
    assert lengths.atoms.tolist() == [100.0, 200.0, 300.0]  # each at least a tenth of the answers


def test_before_any_answer_every_answer_runs_to_the_cap() -> None:
    lengths = AnswerLengths.learn([], 0.95, 4096, prior_weight=20.0)
    assert shares(lengths, 1, 4096, 4097) == [1.0, 1.0, 0.0]
    assert lengths.mean() == 4096.0 and lengths.atoms.tolist() == [4096.0]


def test_newer_answers_weigh_more_and_the_prior_counts_in_the_newest_answers_units() -> None:
    lengths = AnswerLengths.learn([1000, 100], 0.5, 4096, prior_weight=1.0)
    # weights: 1000 -> 0.5, 100 -> 1, the prior at 4,096 -> 1 (of 2.5)
    assert shares(lengths, 101, 1001) == pytest.approx([0.6, 0.4])
    assert lengths.mean() == pytest.approx((0.5 * 1000 + 100 + 4096) / 2.5)


def test_answers_are_capped_and_lengths_of_few_answers_are_no_atoms() -> None:
    lengths = AnswerLengths.learn([5000, *range(1, 31)], 1.0, 4096, prior_weight=0.0)
    assert shares(lengths, 4096, 4097) == pytest.approx([1 / 31, 0.0], abs=1e-3)
    assert lengths.atoms.size == 0  # 1/31 each: the projection only thins at them


def test_one_length_is_a_single_step() -> None:
    lengths = AnswerLengths.single(512.0)
    assert shares(lengths, 511, 512, 513) == [1.0, 1.0, 0.0] and lengths.mean() == 512.0


def test_a_request_past_every_answer_seen_runs_to_the_cap_however_faded_the_prior() -> None:
    lengths = AnswerLengths.learn([100] * 50, 0.95, 4096, prior_weight=0.0)
    running_on = lengths.at_least(np.array([200.0, 4096.0])) / lengths.longer(np.array([150.0]))
    assert running_on.tolist() == pytest.approx([1.0, 1.0])
    assert shares(lengths, 101)[0] < 1e-4  # and weighs nothing beside the answers seen


def test_the_prior_of_a_far_cap_runs_to_the_clip_and_past_it_to_the_cap() -> None:
    lengths = AnswerLengths.learn([], 0.95, 16384, prior_weight=20.0)
    # before any answer: every answer to 4,096 (SGLang's clip), a thousandth of one to the cap
    assert lengths.mean() == pytest.approx(4096 + (16384 - 4096) / 1001)
    assert shares(lengths, 4096, 4097) == pytest.approx([1.0, 1 / 1001])
    # a request past the clip is still expected to run to its cap
    answered = AnswerLengths.learn([500, 1500], 0.95, 16384, prior_weight=5.0)
    running_on = answered.at_least(np.array([10000.0, 16384.0])) / answered.longer(np.array([5000.0]))
    assert running_on.tolist() == pytest.approx([1.0, 1.0])
    assert answered.mean() == pytest.approx(
        (0.95 * 500 + 1500 + 5 * 4096 + 1e-3 * 16384) / (0.95 + 1 + 5 + 1e-3)
    )
