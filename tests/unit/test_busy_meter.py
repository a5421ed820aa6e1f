"""The server's busy share from its cumulative counter, across a restart."""

from __future__ import annotations

import pytest

from flows.control.busy import BusyMeter


def test_the_share_between_readings_and_over_the_run() -> None:
    meter = BusyMeter()
    assert meter.recent is None and meter.overall() is None
    meter.add(10.0, 5_000_000.0)  # 5 s busy before the run began: not the run's
    assert meter.recent is None and meter.overall() is None
    meter.add(20.0, 14_000_000.0)  # 9 s busy of 10
    assert meter.recent == pytest.approx(0.9)
    meter.add(30.0, 17_000_000.0)  # 3 s of 10
    assert meter.recent == pytest.approx(0.3) and meter.overall() == pytest.approx(12 / 20)


def test_a_restart_starts_a_new_span_and_the_gap_is_not_counted() -> None:
    meter = BusyMeter()
    meter.add(0.0, 1_000_000.0)
    meter.add(10.0, 9_000_000.0)  # 8 of 10
    meter.add(20.0, 500_000.0)  # restarted: its counter began again
    assert meter.recent is None and meter.overall() == pytest.approx(0.8)
    meter.add(30.0, 2_500_000.0)  # 2 of 10
    assert meter.recent == pytest.approx(0.2) and meter.overall() == pytest.approx(10 / 20)


def test_a_counter_read_twice_at_one_instant_changes_nothing_and_shares_stay_within_one() -> None:
    meter = BusyMeter()
    meter.add(5.0, 0.0)
    meter.add(5.0, 1_000.0)
    assert meter.overall() is None
    meter.add(6.0, 1_200_000.0)  # rounding in the server's clock: 1.2 s in 1 s
    assert meter.recent == 1.0 and meter.overall() == 1.0
