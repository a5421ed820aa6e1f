"""The controller's timeline over a long run: bounded in memory, every decision kept on disk in order,
the report's numbers counted as the decisions come, and the plot drawn from bins of a long run."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.config import ConcurrencyConfig
from flows.control.adaptive import AdaptiveLimit, Decision
from flows.control.outlook import Outlook
from flows.control.signals import ServerSample
from flows.control.timeline import (
    TIMELINE_DIR,
    DecisionTally,
    Timeline,
    count_decisions,
    iter_timeline,
    observation_from_row,
    read_timeline,
    timeline_files,
)
from flows.control.wiring import law_settings
from flows.report.plots import CONTROLLER_COLUMNS, controller_series, plot_controller

RECORDED = (
    Path(__file__).resolve().parents[1] / "fixtures" / "timelines" / "sglang_0.5.23_outlook_300.parquet"
)
"""A real SGLang run's decisions, replayed: the law's limits, reasons, retractions and queues as they
came."""


def _replayed() -> list[tuple[Decision, ServerSample | None, Outlook | None]]:
    law = AdaptiveLimit(law_settings(ConcurrencyConfig()))
    decisions = []
    for row in pq.read_table(RECORDED).to_pylist():
        observation = observation_from_row(row)
        decisions.append((law.observe(observation), observation.server, observation.outlook))
    return decisions


def test_a_long_timeline_holds_one_segment_in_memory_and_reads_back_whole_and_in_order(
    tmp_path: Path,
) -> None:
    decisions = _replayed() * 10  # the recorded run's 20 decisions, ten times over
    timeline = Timeline(tmp_path, segment_rows=50)
    most_held = 0
    for i, (decision, sample, outlook) in enumerate(decisions):
        timeline.add("http://a", decision, sample, outlook)
        most_held = max(most_held, timeline.held)
        if i % 7 == 6:  # the periodic write
            timeline.write()
    timeline.write()

    assert most_held <= 50 + 7
    rows = read_timeline(tmp_path)
    assert [(r["at"], r["limit"], r["reason"]) for r in rows] == [
        (d.at, d.limit, d.reason) for d, _, _ in decisions
    ]
    sizes = [pq.ParquetFile(path).metadata.num_rows for path in timeline_files(tmp_path)]
    assert all(50 <= size <= 56 for size in sizes[:-1]) and 0 < sizes[-1] <= 56
    assert count_decisions(tmp_path) == len(decisions)


def test_a_write_with_nothing_new_leaves_the_files_alone(tmp_path: Path) -> None:
    timeline = Timeline(tmp_path, segment_rows=2)
    decision, sample, outlook = _replayed()[0]
    timeline.add("http://a", decision, sample, outlook)
    timeline.add("http://a", decision, sample, outlook)
    timeline.write()  # the segment is full: the next write begins another
    timeline.write()
    assert len(timeline_files(tmp_path)) == 1 and timeline.held == 0
    timeline.add("http://a", decision, sample, outlook)
    timeline.write()
    assert [pq.ParquetFile(p).metadata.num_rows for p in timeline_files(tmp_path)] == [2, 1]


def test_the_tally_counts_what_the_written_rows_say(tmp_path: Path) -> None:
    timeline = Timeline(tmp_path, segment_rows=40)
    for decision, sample, outlook in _replayed():
        timeline.add("http://a", decision, sample, outlook)
        timeline.write()
    rows = read_timeline(tmp_path)
    tally = timeline.tallies["http://a"]
    assert tally == DecisionTally(
        decisions=len(rows),
        changes=sum(r["limit"] != r["previous"] for r in rows),
        back_offs=sum(r["reason"].startswith("back off") for r in rows),
        retractions=sum(r["retractions"] for r in rows),
        max_queued=max(r["queued"] or 0 for r in rows),
        min_limit=min(r["limit"] for r in rows),
        max_limit=max(r["limit"] for r in rows),
    )
    assert tally.back_offs == 1 and tally.retractions >= 1 and tally.changes >= 3


def test_a_resumed_run_reads_the_earlier_starts_first_including_a_file_of_an_earlier_release(
    tmp_path: Path,
) -> None:
    (tmp_path / TIMELINE_DIR).mkdir()
    old = tmp_path / TIMELINE_DIR / "part-20200101T000000000000Z.parquet"  # one file per start, as before
    pq.write_table(pa.Table.from_pylist([{"endpoint": "http://a", "at": 1.0, "limit": 3}]), old)
    decisions = _replayed()[:5]
    for _ in range(2):  # two starts of the run
        timeline = Timeline(tmp_path, segment_rows=2)
        for decision, sample, outlook in decisions:
            timeline.add("http://a", decision, sample, outlook)
            timeline.write()
    rows = read_timeline(tmp_path)
    assert [r["limit"] for r in rows] == [3] + [d.limit for d, _, _ in decisions] * 2


def _row(at: float, limit: int, queued: int | None, kv: float | None, endpoint: str = "a") -> dict:
    return {
        "endpoint": endpoint,
        "at": at,
        "limit": limit,
        "in_flight": limit - 1,
        "queued": queued,
        "kv_usage": kv,
    }


def _in_start(start: str, rows: list[dict]) -> list[dict]:
    """The rows as ``iter_timeline`` gives them: each with the start of the run it came from."""
    return [{**row, "start": start} for row in rows]


def test_the_plot_draws_a_long_timeline_in_bins_with_mean_limits_and_peak_queues_and_usage() -> None:
    rows = _in_start(
        "1",
        [
            _row(1, 10, 0, 0.5),
            _row(2, 20, 4, None),
            _row(3, 30, None, 0.9),
            _row(4, 40, 1, 0.2),
            _row(5, 50, None, None),
        ],
    )
    rows += _in_start("2", [_row(1, 60, 2, 0.4), _row(2, 70, 0, 0.3, endpoint="b")])  # resumed
    series = controller_series(rows, bin_rows=3)
    a = series["a"]
    assert a["t"] == [1, 4, 5, 6] and a["limit"][:2] == [20, 45] and a["in_flight"][:2] == [19, 44]
    assert a["queued"][:2] == [4, 1] and a["kv"][:2] == [0.9, 0.2]  # the first start's last bin: 2 rows
    assert all(math.isnan(a[key][2]) for key in ("limit", "in_flight", "queued", "kv"))  # its end
    assert a["limit"][3] == 60
    assert series["b"]["t"] == [7] and series["b"]["limit"] == [70]  # 5 + 2 on the run's one axis

    unbinned = controller_series(rows[:5])
    assert unbinned["a"]["limit"] == [10, 20, 30, 40, 50]
    assert math.isnan(unbinned["a"]["queued"][2]) and math.isnan(unbinned["a"]["kv"][1])


def test_endpoints_whose_times_interleave_share_one_axis_across_a_restart() -> None:
    # each controller counts from its own start: b's times run 0.3 s behind a's, rows alternate
    first = [row for t in (1.0, 2.0, 3.0) for row in (_row(t, 10, 0, 0.5), _row(t - 0.3, 20, 0, 0.5, "b"))]
    second = [row for t in (0.5, 1.5) for row in (_row(t, 30, 0, 0.5), _row(t - 0.3, 40, 0, 0.5, "b"))]
    series = controller_series(_in_start("1", first) + _in_start("2", second))
    assert series["a"]["t"] == [1.0, 2.0, 3.0, 3.0, 3.5, 4.5]  # the second start follows the first's 3.0
    assert series["b"]["t"] == pytest.approx([0.7, 1.7, 2.7, 3.0, 3.2, 4.2])


def test_a_binned_plot_is_written_and_a_run_without_decisions_has_none(tmp_path: Path) -> None:
    rows = _in_start("1", [_row(float(t), 10 + t % 7, t % 3, 0.5) for t in range(1, 1000)])
    rows += _in_start("2", [_row(float(t), 10 + t % 5, t % 3, 0.5) for t in range(1, 1000)])
    assert plot_controller(iter(rows), tmp_path / "c.png", bin_rows=100)
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert not plot_controller(iter([]), tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_two_starts_are_told_apart_by_their_files_even_when_the_second_starts_later_than_the_first_ended(
    tmp_path: Path,
) -> None:
    """A first start killed after two decisions (its last at 2 s), a second start polling every 5 s
    (its first at 5 s, so time does not go back) and an endpoint only the second start knew: the
    second start follows the first on the run's axis, no bin and no line spans the two."""
    folder = tmp_path / TIMELINE_DIR
    folder.mkdir()
    first = [_row(1.0, 10, 0, 0.5), _row(2.0, 20, 1, 0.6)]
    second = [_row(5.0, 30, 2, 0.7), _row(10.0, 40, 3, 0.8), _row(5.5, 50, 0, 0.1, endpoint="b")]
    pq.write_table(pa.Table.from_pylist(first), folder / "part-20260101T000000000000Z-00000.parquet")
    pq.write_table(pa.Table.from_pylist(second), folder / "part-20260101T010000000000Z-00000.parquet")

    series = controller_series(iter_timeline(tmp_path, CONTROLLER_COLUMNS), bin_rows=3)
    a, b = series["a"], series["b"]
    assert a["t"] == [1.0, 2.0, 7.0]  # the first start's bin, its end, the second's bin from 2 + 5
    assert a["limit"][0] == 15 and math.isnan(a["limit"][1]) and a["limit"][2] == 35  # the line breaks
    assert a["queued"][::2] == [1, 3]
    assert b["t"] == [7.5] and b["limit"] == [50]  # on the second start's axis, not the first's
