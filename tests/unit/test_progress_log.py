"""The progress log of a long run: read in bounded memory, drawn with a bounded number of points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.report.progress_log import PROGRESS_DIR, read_progress
from flows.report.run_plots import PLOTTED_POINTS, throughput_series


def _log(run_dir: Path, name: str, samples: int, start: float, cut: bool = False) -> None:
    folder = run_dir / PROGRESS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    endpoint = {"endpoint": "http://e", "limit": 64, "in_flight": 60, "kv_usage": 0.9, "queued": 2}
    lines = [
        json.dumps(
            {
                "at": start + 2 * i,
                "rows": i,
                "rejects": 0,
                "completion_tokens": 1000 * i,
                "in_flight": 60,
                "endpoints": [endpoint] * 8,
            }
        )
        for i in range(samples)
    ]
    (folder / name).write_text("\n".join(lines) + ('\n{"at": 1' if cut else "\n"))


def test_a_week_of_progress_is_read_with_its_plotted_fields_and_drawn_in_bounded_points(
    tmp_path: Path,
) -> None:
    _log(tmp_path, "part-b.jsonl", 30_000, start=1_000_000.0, cut=True)  # a second start, cut by kill -9
    _log(tmp_path, "part-a.jsonl", 20_000, start=0.0)
    starts = read_progress(tmp_path)
    assert [len(samples) for samples in starts] == [20_000, 30_000]  # in time order, the cut line skipped
    assert set(starts[0][0]) == {"at", "completion_tokens", "in_flight"}  # not the endpoints of each line
    series = throughput_series(starts)
    assert len(series["t"]) <= PLOTTED_POINTS
    assert series["tok_s"] == pytest.approx([500.0] * len(series["t"]))  # 1,000 tokens every 2 s
    assert series["t"][-1] == pytest.approx(1_000_000.0 + 2 * 29_999)
