"""The bench that sets the server's counted decode steps against each answer's tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.clock_count import Life, count_category, counted_steps, run_dirs

AT = np.array([0.0, 1.0, 2.0, 3.0])
STEPS = np.array([100.0, 110.0, 120.0, 130.0])  # ten steps a second counted


def test_a_lives_steps_are_the_readings_interpolated_at_its_ends() -> None:
    counted = counted_steps([Life(0.5, 2.5, 20), Life(1.0, 1.2, 2)], AT, STEPS)
    assert counted.tolist() == pytest.approx([20.0, 2.0])


def test_only_answers_at_the_cap_are_set_against_their_steps() -> None:
    """An answer cut short by an end-of-sequence token says nothing of steps per token that the
    full ones do not, and its few tokens weigh its ends' error more."""
    lives = [Life(0.5, 2.5, 20), Life(0.5, 2.3, 20), Life(0.0, 0.3, 1)]
    count = count_category("c", lives, AT, STEPS)
    assert count is not None
    assert (count.answers, count.at_cap, count.cap) == (3, 2, 20)
    assert count.steps_per_token == pytest.approx((1.0 + 0.9) / 2)
    assert count_category("empty", [Life(0.0, 1.0, 0)], AT, STEPS) is None


def test_runs_are_found_given_or_one_level_down(tmp_path: Path) -> None:
    for name in ("r1", "r2"):
        (tmp_path / "kept" / name / "timeline").mkdir(parents=True)
        (tmp_path / "kept" / name / "timeline" / "part-20261207T120000000000Z-00000.parquet").touch()
    (tmp_path / "kept" / "r3-fixed-64" / "timeline").mkdir(parents=True)  # a fixed setting: none
    (tmp_path / "kept" / "notes.txt").touch()
    alone = tmp_path / "kept" / "r2"
    assert run_dirs([tmp_path / "kept", alone]) == [tmp_path / "kept" / "r1", alone, alone]
