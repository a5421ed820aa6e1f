"""Text from prompts, servers and paths is printed as it is, never read as rich markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_support import empty_summary
from typer.testing import CliRunner

from flows.cli.console import print_summary
from flows.cli.main import app
from flows.report.status import run_status
from flows.run.rows import reject_row
from flows.store.run_store import RunStore

REASONS = [
    "cannot convert: unexpected turn [/INST]",  # a closing tag: rich raised MarkupError
    "Input should be a valid string [type=string_type, input_value=1, input_type=int]",  # silently dropped
]


def _run_dir_with_reason(tmp_path: Path, reason: str) -> Path:
    store = RunStore(tmp_path / "run [v2]")
    store.open_run("fp1", {"categories": [{"name": "c", "limit": 10}]})
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    source = {"dataset": "d", "split": "train", "row": 0}
    rejects.add(reject_row(record_id="x", category="c", source=source, stage="request", reason=reason))
    rejects.flush()
    return tmp_path / "run [v2]"


@pytest.mark.parametrize("reason", REASONS)
def test_status_prints_a_reason_with_square_brackets_as_it_is(tmp_path: Path, reason: str) -> None:
    result = CliRunner().invoke(
        app, ["status", str(_run_dir_with_reason(tmp_path, reason))], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 0, repr(result.exception)
    assert reason[reason.index("[") :] in result.stdout and "run [v2]" in result.stdout


def test_the_end_of_run_summary_prints_them_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the end of `datagen run` the same error came after the report was written, outside every
    handler: a finished run exited 1 with a traceback, its summary unseen."""
    run_dir = _run_dir_with_reason(tmp_path, REASONS[0])
    summary = empty_summary(str(run_dir), rejects=1)
    print_summary(summary, run_status(run_dir))
    printed = capsys.readouterr()
    assert "[/INST]" in printed.out + printed.err and "run [v2]/data" in printed.out + printed.err
