"""Reject reasons worded with each prompt's numbers stay a short list: in the live tally (memory,
the Prefect card, the summary) and in `datagen status`, while the rejects table keeps every one."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli.main import app
from flows.run.pump import MAX_REJECT_REASONS, Tally
from flows.run.reasons import OTHER_REASONS
from flows.run.rows import reject_row
from flows.store.run_store import RunStore


def _over_context(tokens: int) -> str:
    return f"maximum context length of 8192 tokens. You requested a total of {tokens} tokens"


def test_the_tally_stays_bounded_sums_exactly_and_still_sees_a_reason_that_starts_late() -> None:
    tally = Tally()
    tally.count_reject("server unavailable (503)")
    for tokens in range(9000, 9000 + 10 * MAX_REJECT_REASONS):
        tally.count_reject(_over_context(tokens))
        assert len(tally.reject_reasons) <= MAX_REJECT_REASONS
        if tokens % 7 == 0:
            tally.count_reject("server unavailable (503)")
    for _ in range(5):
        tally.count_reject("no user turn")  # late: after thousands of one-off reasons

    assert sum(tally.reject_reasons.values()) == tally.rejects
    assert tally.reject_reasons["server unavailable (503)"] == 1 + sum(
        1 for t in range(9000, 9000 + 10 * MAX_REJECT_REASONS) if t % 7 == 0
    )
    assert tally.reject_reasons["no user turn"] == 5
    assert tally.reject_reasons[OTHER_REASONS] > 0


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
    assert cells == ["c", "other reasons (each in the rejects table)", "21"]
