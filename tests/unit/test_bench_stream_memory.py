"""The streaming-memory bench: a tiny run produces its table (timings and memory are not asserted)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.stream_memory import (
    CHILDREN,
    Case,
    Measurement,
    growth_lines,
    run_bench,
    run_child,
    synthetic_rows,
    write_sources,
)
from flows.config import CategoryConfig
from flows.run.prompt_stream import StreamCounts, category_items
from flows.store.run_store import CategoryState

MIB = 1024 * 1024


def _in_process(case: Case) -> dict[str, Any]:
    """The child's own function without the subprocess (the subprocess path has its own test)."""
    return CHILDREN[case.child](case.path, case.rows)


def test_a_small_run_prints_every_case_with_its_baseline() -> None:
    out = io.StringIO()
    results = run_bench(300, Console(file=out, width=200), spawn=_in_process)
    assert [(base.case.name, base.rows, full.rows) for base, full in results] == [
        ("stream jsonl", 3, 300),
        ("stream parquet", 3, 300),
        ("naive list", 3, 300),
    ]
    assert all(m.peak_rss > 0 for pair in results for m in pair)
    text = out.getvalue()
    assert "peak RSS MiB" in text and "× base excl. ids" in text
    assert text.count("stream jsonl") == 3  # two table rows and the growth line
    assert "reproduce: uv run python -m bench.stream_memory --rows 300" in text


def test_the_synthetic_file_streams_without_rejects_or_duplicates(tmp_path: Path) -> None:
    jsonl, parquet = write_sources(tmp_path, 50)
    first = json.loads(jsonl.read_text(encoding="utf-8").splitlines()[0])
    assert first == next(synthetic_rows(1))
    assert set(first) == {"prompt", "prompt_id", "messages"}
    for path in (jsonl, parquet):
        counts = StreamCounts()
        category = CategoryConfig(name="bench", source=str(path), format="messages")
        assert len(list(category_items(category, CategoryState(), counts))) == 50
        assert (counts.read, counts.taken, counts.duplicates, counts.rejected.total()) == (50, 50, 0, 0)


def test_a_case_runs_in_a_fresh_process(tmp_path: Path) -> None:
    jsonl, _ = write_sources(tmp_path, 20)
    result = run_child(Case("naive list", "naive", jsonl, 10))
    assert result["rows"] == 10 and result["id_bytes"] == 0
    assert result["peak_rss"] > MIB


def _measurement(name: str, rows: int, peak_mib: float, ids_mib: float) -> Measurement:
    case = Case(name, "stream", Path("x"), rows)
    return Measurement(case, rows, 1.0, int(peak_mib * MIB), int(ids_mib * MIB))


def test_growth_lines_say_how_much_the_id_sets_explain() -> None:
    stream = (_measurement("stream jsonl", 10, 100, 1), _measurement("stream jsonl", 1010, 110, 6))
    naive = (_measurement("naive list", 10, 20, 0), _measurement("naive list", 1010, 900, 0))
    assert growth_lines([stream, naive]) == [
        "stream jsonl: +10.0 MiB from 10 to 1,010 rows; the seen-id set and dedup index account for "
        "5.0 MiB of it (50%), 5243 bytes per prompt"
    ]
