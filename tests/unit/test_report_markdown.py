"""report.md: what a person reads after a run, beside the CLI's summary."""

from __future__ import annotations

from typing import Any

from flows.report.summary import STEP_NAMES, report_markdown


def _summary(total: dict[str, int] | None) -> dict[str, Any]:
    category = {
        "name": "chat",
        "steps": dict.fromkeys(STEP_NAMES, 0),
        "filtered": {},
        "conversion_rejects": {},
        "duplicates": 0,
        "this_run": {"reject_reasons": {"context too long": 1}},
        "total": total,
    }
    return {
        "run": "r",
        "model": "m",
        "fingerprint": "fp",
        "finished_at": "2026-12-07T00:00:00+00:00",
        "resumed": False,
        "rows": 5,
        "rejects": 1,
        "completion_tokens": 100,
        "seconds": 10.0,
        "output_tokens_per_s": 10.0,
        "rows_per_s": 0.5,
        "server_restarts": 0,
        "concurrency": None,
        "categories": [category],
        "run_dir": "output/r",
    }


def test_the_report_has_each_categorys_rows_on_disk_and_says_which_are_not_training_rows() -> None:
    """The CLI's summary and summary.json had rows, training rows and rejects per category; report.md
    had neither, and its "left out" list named the rejects but not the flagged rows kept out of
    training (20 truncated rows in the walkthrough's run)."""
    text = report_markdown(_summary({"rows": 5, "training_rows": 3, "rejects": 1, "completion_tokens": 100}))
    assert "## On disk (every start so far)" in text
    assert "| chat | 5 | 3 | 1 | 100 |" in text
    assert (
        "- chat: on disk: rows with flags (truncated, empty, a bad tool call), not training rows — 2" in text
    )
    assert "- chat: request: context too long — 1" in text


def test_a_summary_without_totals_has_no_table() -> None:
    text = report_markdown(_summary(None))
    assert "## On disk" not in text and "rows with flags" not in text
