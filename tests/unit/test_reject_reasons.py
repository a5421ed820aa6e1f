"""Reject reasons worded with each prompt's numbers stay a short list: in the live tally (memory,
the Prefect card, the summary) and in `datagen status`, while the rejects table keeps every one."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli.main import app
from flows.run.pump import MAX_REJECT_REASONS, OTHER_REASONS, Tally
from flows.run.rows import reject_row
from flows.store.run_store import RunStore


def _over_context(tokens: int) -> str:
    return f"maximum context length of 8192 tokens. You requested a total of {tokens} tokens"


def test_the_tally_keeps_the_first_reasons_apart_and_counts_the_rest_as_one() -> None:
    tally = Tally()
    for tokens in range(9000, 9000 + 10 * MAX_REJECT_REASONS):
        tally.count_reject(_over_context(tokens))
    tally.count_reject(_over_context(9000))  # a reason already kept is still counted as itself

    assert tally.rejects == 10 * MAX_REJECT_REASONS + 1
    assert len(tally.reject_reasons) == MAX_REJECT_REASONS + 1
    assert tally.reject_reasons[_over_context(9000)] == 2
    assert tally.reject_reasons[OTHER_REASONS] == 9 * MAX_REJECT_REASONS
    assert sum(tally.reject_reasons.values()) == tally.rejects


def test_status_shows_the_commonest_reasons_and_sums_the_rest(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.open_run("fp1", {"categories": [{"name": "c", "limit": 100}]})
    rejects = store.reject_writer("c", flush_rows=1000, flush_seconds=60)
    source = {"dataset": "d", "split": "train", "row": 0}
    reasons = ["server unavailable (503)"] * 5 + [_over_context(9000 + i) for i in range(40)]
    for i, reason in enumerate(reasons):
        row = reject_row(record_id=f"x{i}", category="c", source=source, stage="request", reason=reason)
        rejects.add(row)
    rejects.flush()

    result = CliRunner().invoke(app, ["status", str(tmp_path / "run")], env={"COLUMNS": "300"})

    assert result.exit_code == 0, repr(result.exception)
    assert "request: server unavailable (503)" in result.stdout
    shown = [line for line in result.stdout.splitlines() if "You requested a total of" in line]
    assert len(shown) == 19  # 20 rows: the 503s and 19 of the one-off reasons
    (rest,) = [line for line in result.stdout.splitlines() if "other reasons" in line]
    cells = [cell.strip() for cell in rest.split("│") if cell.strip()]
    assert cells == ["c", "21 other reasons (each in the rejects table)", "21"]
