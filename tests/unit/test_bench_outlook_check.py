"""bench/outlook_check: a bound tick's projected peak against the largest reading of its next life."""

from __future__ import annotations

import numpy as np
import pytest

from bench.clock_count import Life
from bench.outlook_check import Tick, check, check_rows, held_by_rows


def test_each_tick_is_set_against_the_largest_reading_within_its_next_life() -> None:
    at = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    kv = np.array([0.80, 0.85, 0.90, 0.70, 0.95, 0.60])
    ticks = [Tick(0.0, 0.94, 2.0), Tick(2.0, 0.92, 1.5), Tick(3.0, 0.96, 10.0)]
    result = check(ticks, at, kv)
    assert result is not None
    # (0, 2]: 0.90; (2, 3.5]: 0.70 (the reading at 2.0 itself is the tick's own); (3, 13]: 0.95
    assert result.ticks == 3
    assert result.projected == pytest.approx(0.94)
    assert result.came == pytest.approx(0.90)
    assert result.came_max == pytest.approx(0.95)
    assert result.mean_kv == pytest.approx(kv.mean())


def test_a_tick_with_no_reading_after_it_is_left_out() -> None:
    at = np.array([0.0, 1.0])
    kv = np.array([0.5, 0.6])
    assert check([Tick(1.0, 0.9, 3.0)], at, kv) is None
    result = check([Tick(0.0, 0.9, 3.0), Tick(1.0, 0.99, 3.0)], at, kv)
    assert result is not None and result.ticks == 1 and result.projected == pytest.approx(0.9)


def test_the_rows_say_each_request_held_its_prompt_and_its_answer_so_far_while_it_lived() -> None:
    lives = [Life(0.0, 4.0, 40, 100), Life(2.0, 3.0, 10, 50)]
    held = held_by_rows(lives, np.array([-1.0, 0.0, 1.0, 2.5, 3.0, 4.0]))
    # before any; the first at its admission (its prompt); a quarter of its answer; at 2.5 the first
    # 100 + 25 and the second 50 + 5; the second gone at its answer, the first at 100 + 30; none at 4
    assert held.tolist() == pytest.approx([0.0, 100.0, 110.0, 180.0, 130.0, 0.0])
    assert held_by_rows([], np.array([1.0])).tolist() == [0.0]


def test_came_by_the_rows_is_scaled_to_the_readings_and_the_outlook_set_against_its_own_requests() -> None:
    # One request of 100 + 100 from 0 to 10 s, another of 100 + 0 admitted at 5 s: the cache holds
    # half of what the rows count (the readings at 1 and 2 s: 110 and 120 tokens counted, 55 and 60
    # held); a pool of 1,000 tokens.
    lives = [Life(0.0, 10.0, 100, 100), Life(5.0, 10.0, 0, 100)]
    at = np.array([1.0, 2.0])
    kv = np.array([0.055, 0.060])
    # bound at 1 s: the next 5 s hold at most 100 + 60 (just before 6 s) + 100 = 260 counted, 0.13 of
    # the pool held; its own request (the first) reaches 100 + 100 by its end, projected at 250
    tick = Tick(1.0, 0.5, 5.0, peak_tokens=250.0, horizon_s=20.0)
    result = check_rows([tick], lives, at, kv, capacity=1000.0)
    assert result is not None
    assert result.scale == pytest.approx(0.5)
    assert result.came == pytest.approx(0.13, abs=0.001)  # read on a 0.02 s grid
    assert result.projected_over_held == pytest.approx(250.0 / 200.0, rel=0.002)
    assert check_rows([], lives, at, kv, capacity=1000.0) is None
    assert check_rows([tick], lives, np.array([20.0]), np.array([0.5]), capacity=1000.0) is None
