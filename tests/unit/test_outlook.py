"""The budget's outlook: what the requests in flight will hold over a newcomer's life, by their ages."""

from __future__ import annotations

import numpy as np
import pytest
from outlook_support import cohort

from flows.control.lengths import AnswerLengths
from flows.control.outlook import SLICES, Cohort, project


def flights(count: int, age_s: float, prompt: float = 100.0, output: float = 1000.0) -> list[Cohort]:
    return [cohort(prompt, output, 4096, [age_s] * count)]


def test_nothing_in_flight_has_no_outlook() -> None:
    assert project([], 100.0) is None


def test_before_any_answer_every_request_counts_at_its_final_size() -> None:
    outlook = project(flights(10, age_s=3.0), None)
    assert outlook is not None
    assert outlook.peaks == (11_000.0,) and outlook.now_tokens == 11_000.0
    assert outlook.room(22_000) == pytest.approx(10.0)  # ten more of 1,100 tokens


def test_a_pool_of_whole_blocks_counts_half_a_block_more_for_every_request_newcomers_too() -> None:
    padded = project(flights(10, age_s=3.0), None, pad_tokens=63.5)
    assert padded is not None
    assert padded.now_tokens == pytest.approx(11_635.0) and padded.newcomer_prompt == pytest.approx(163.5)
    assert padded.room(22_000) == pytest.approx((22_000 - 11_635) / 1_163.5)
    young = project(flights(10, age_s=0.0), 100.0, pad_tokens=63.5)
    assert young is not None and young.peaks[-1] == pytest.approx(11_635.0)


def test_a_young_cohort_leaves_room_only_beside_its_peak() -> None:
    """Ten requests admitted together grow together: newcomers admitted now grow with them."""
    outlook = project(flights(10, age_s=0.0), 100.0)  # 100 tokens a second: a 10 s life
    assert outlook is not None
    assert outlook.now_tokens == pytest.approx(1_000.0)  # prompts only, for now
    assert outlook.peaks[-1] == pytest.approx(11_000.0)  # all at their final size at the end
    assert outlook.room(22_000) == pytest.approx(10.0)  # as if every request were at its final size


def test_old_requests_about_to_end_free_their_room_for_newcomers() -> None:
    ending = project(flights(10, age_s=10.0 - 5.0 / SLICES), 100.0)  # half a slice left of a 10 s life
    assert ending is not None
    assert ending.peaks[0] == pytest.approx(11_000.0) and ending.peaks[1:] == (0.0,) * (SLICES - 1)
    # newcomers share only the first slice with them: 1,000 tokens of room at 100 + 1,000/SLICES each
    assert ending.room(12_000) == pytest.approx(1_000 / (100 + 1_000 / SLICES))
    young = project(flights(10, age_s=0.0), 100.0)
    assert young is not None and young.room(12_000) == pytest.approx(1_000 / 1_100)


def test_spread_ages_fit_more_than_counting_every_request_at_its_final_size() -> None:
    """Steady state: ages spread over the life, the cache holds about half of the final sizes."""
    spread = [
        cohort(100.0, 1000.0, 4096, [age + 0.5 for age in range(10) for _ in range(2)])
    ]  # 0.5-9.5 s old
    outlook = project(spread, 100.0)
    assert outlook is not None
    assert outlook.now_tokens == pytest.approx(20 * 100 + 2 * sum(100 * (a + 0.5) for a in range(10)))
    final_size_room = (22_000 - 20 * 1_100) / 1_100  # 0: the final-size count admits nobody
    assert outlook.room(22_000) > final_size_room + 5


def test_a_request_past_its_expected_output_is_expected_halfway_to_its_cap() -> None:
    overdue = project([cohort(100.0, 1000.0, 3000, [20.0])], 100.0)  # made 2,000 of an expected 1,000
    assert overdue is not None
    assert overdue.now_tokens == pytest.approx(2_100.0)
    assert max(overdue.peaks) == pytest.approx(100 + 2_500)  # halfway from 2,000 to 3,000: 5 s more
    assert overdue.peaks[SLICES // 2 :] == (0.0,) * (SLICES // 2)  # gone after 5 s of a 10 s horizon
    at_cap = project([cohort(100.0, 1000.0, 1000, [20.0])], 100.0)
    assert at_cap is not None  # at its cap it ends now: it counts in the first slice only
    assert at_cap.peaks[0] == pytest.approx(1_100.0) and at_cap.peaks[1] == 0.0


def test_a_request_ending_within_a_slice_is_not_counted_beside_what_grows_after_it() -> None:
    """The largest projection in a slice is where one request ends or at the slice's end, not the
    sum of every request's largest size within it."""
    # one ends in 0.2 s, at 1,100 tokens; one holds 100 tokens now, 162.5 at the slice's end
    outlook = project([cohort(100.0, 1000.0, 4096, [9.8, 0.0])], 100.0)
    assert outlook is not None
    width = 10.0 / SLICES
    assert outlook.peaks[0] == pytest.approx(max(1_100 + 100 + 100 * 0.2, 100 + 100 * width))


def test_a_stream_keeps_spread_ages_level_at_one_request_per_life_each() -> None:
    """200 requests with ages spread over a 10 s life hold 120,000 tokens (their ends, 0.05 s apart,
    add up to 500 more): a stream of 20 a second replaces them as they end and holds the same."""
    spread = [cohort(100.0, 1000.0, 4096, [(i + 0.5) * 0.05 for i in range(200)])]
    outlook = project(spread, 100.0)
    assert outlook is not None and outlook.now_tokens == pytest.approx(120_000.0)
    rate = outlook.stream_rate(121_000)
    assert rate is not None and 0.9 * 20 < rate < 1.05 * 20


def test_a_stream_waits_for_a_cohort_at_the_budget_then_refills_over_a_life() -> None:
    young = project(flights(10, age_s=0.0), 100.0)  # 11,000 tokens at their end, in 10 s
    assert young is not None and young.stream_rate(11_000) == 0.0
    ending = project(flights(10, age_s=10.0 - 5.0 / SLICES), 100.0)
    assert ending is not None
    # once they are gone the stream fills the budget in one life: 12,000 / (10 s x (100 + 1,000 / 2))
    rate = ending.stream_rate(12_000)
    assert rate is not None and rate == pytest.approx(12_000 / (10 * 600), rel=0.05)


def test_the_steady_count_is_what_requests_with_spread_ages_hold_on_average() -> None:
    """200 requests of 100 + 1,000 tokens, their ages spread over a life, hold 120,000 tokens: each
    its prompt and half its answer on average."""
    spread = [cohort(100.0, 1000.0, 4096, [(i + 0.5) * 0.05 for i in range(200)])]
    outlook = project(spread, 100.0)
    assert outlook is not None
    assert outlook.steady_count(outlook.now_tokens) == pytest.approx(200.0)
    assert outlook.steady_count(60_000.0) == pytest.approx(100.0)


def test_no_stream_rate_before_any_answer() -> None:
    outlook = project(flights(10, age_s=3.0), None)
    assert outlook is not None and outlook.stream_rate(22_000) is None


def uniform_lengths(max_tokens: int = 4096) -> AnswerLengths:
    """Answers that stop at a uniform point below the cap (the simulator's short phase)."""
    return AnswerLengths.learn(list(range(1, max_tokens)), 1.0, max_tokens, prior_weight=0.0)


def realized(prompts: np.ndarray, done: np.ndarray, answers: np.ndarray, rate: float, t: float) -> float:
    """The KV these requests hold ``t`` seconds on: those still running, each its prompt and answer so far."""
    made = done + rate * t
    return float(((prompts + made) * (answers >= made)).sum())


def test_answers_of_spread_lengths_are_projected_at_what_they_will_hold_on_average() -> None:
    """Forty requests in flight in a steady stream and twenty just admitted, their answers ending
    anywhere below the cap: the projection is the mean of what they hold over many draws, slice by
    slice. One number (every request grown to the mean length, then gone) counts the young ones at
    full size until then and nothing after: 8 % above at its peak, a third of it at the end."""
    rng = np.random.default_rng(7)
    rate, lengths = 500.0, uniform_lengths()
    slices, projected, single = np.zeros(SLICES), np.zeros(SLICES), np.zeros(SLICES)
    for _ in range(200):
        # in flight in a steady stream: a request's answer, given what it made, is any longer one
        answers = rng.integers(1, 4096, 480).astype(float)
        done = np.floor(rng.uniform(0, 4096, 480))
        running = answers > done
        answers = np.append(answers[running][:40], rng.integers(1, 4096, 20))
        done = np.append(done[running][:40], np.zeros(20))
        ages = done / rate
        outlook = project([cohort(300.0, 2048.0, 4096, ages, lengths)], rate)
        one_number = project([cohort(300.0, 2048.0, 4096, ages)], rate)
        assert outlook is not None and one_number is not None
        width = outlook.newcomer_output / rate / SLICES
        slices += [realized(np.full(60, 300.0), done, answers, rate, (j + 1) * width) for j in range(SLICES)]
        projected += outlook.peaks
        single += one_number.peaks
    assert projected / slices == pytest.approx(np.ones(SLICES), rel=0.03)
    assert single.max() / slices.max() > 1.06 and (single / slices).min() < 0.9


def test_answers_of_one_length_keep_the_cohorts_step() -> None:
    """Every answer to the cap: the lengths give the same projection as the single number, so a
    cohort is still projected to its peak."""
    cap = AnswerLengths.learn([4096] * 50, 0.95, 4096, prior_weight=1.0)
    ages = [0.5 * i for i in range(16)]
    with_lengths = project([cohort(100.0, 4096.0, 4096, ages, cap)], 500.0)
    one_number = project([cohort(100.0, 4096.0, 4096, ages)], 500.0)
    assert with_lengths is not None and one_number is not None
    assert with_lengths.peaks == pytest.approx(one_number.peaks)
    assert with_lengths.room(60_000) == pytest.approx(one_number.room(60_000))


def test_a_newcomer_of_spread_lengths_may_end_within_its_life_so_more_fit() -> None:
    outlook = project([cohort(300.0, 2048.0, 4096, [1.0], uniform_lengths())], 500.0)
    assert outlook is not None and outlook.newcomer_sizes is not None
    last = outlook.newcomer_size(SLICES - 1)  # at the mean length, about half have ended
    assert last == pytest.approx((300 + 2048) * (4096 - 2048) / 4095, rel=0.01)
    assert outlook.newcomer_size(0) == pytest.approx((300 + 64) * (4096 - 64) / 4095, rel=0.01)
    linear = project([cohort(300.0, 2048.0, 4096, [1.0])], 500.0)
    assert linear is not None and outlook.room(100_000) > 1.5 * linear.room(100_000)
