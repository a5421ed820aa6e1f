"""bench/outlook_check: a bound tick's projected peak against the largest reading of its next life."""

from __future__ import annotations

import numpy as np
import pytest

from bench.outlook_check import Tick, check


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
