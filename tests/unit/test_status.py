from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_store import _row
from typer.testing import CliRunner

from flows.cli.main import app
from flows.report.status import run_status
from flows.run.rows import reject_row
from flows.store.parts import Part
from flows.store.run_store import RunStore


def _run_dir(tmp_path: Path) -> Path:
    store = RunStore(tmp_path / "run")
    store.open_run("fp1", {"categories": [{"name": "c", "limit": 10}]})
    rows = store.row_writer("c", flush_rows=10, flush_seconds=60)
    for rid, flags in (("a", []), ("b", ["truncated"]), ("later", [])):
        rows.add(_row(rid, flags))
    rows.flush()
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    source = {"dataset": "d", "split": "train", "row": 0}
    rejects.add(reject_row(record_id="x", category="c", source=source, stage="request", reason="too long"))
    rejects.add(
        reject_row(
            record_id="later", category="c", source=source, stage="request", reason="503", retryable=True
        )
    )
    rejects.add(
        reject_row(record_id="y", category="c", source=source, stage="request", reason="503", retryable=True)
    )
    rejects.flush()
    return tmp_path / "run"


def test_status_json_counts_rows_training_rows_and_standing_rejects(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status", str(_run_dir(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (c,) = doc["categories"]
    assert (doc["rows"], doc["rejects"], doc["fingerprint"]) == (3, 2, "fp1")
    assert (c["rows"], c["training_rows"], c["truncated"], c["limit"]) == (3, 2, 1, 10)
    # "later" was answered after its retryable reject: it is a row, not a reject, any more
    assert c["reject_reasons"] == {"request: too long": 1, "request: 503": 1}
    assert c["retryable_rejects"] == 1
    assert c["completion_tokens"] == 15


def test_status_of_a_folder_that_is_no_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not a run directory" in result.output


def test_status_reads_every_part_counts_each_and_reports_a_repeated_id(tmp_path: Path) -> None:
    """The union of the parts' shards, per part; an id written by two parts is shown, never hidden."""
    for index, ids in ((1, ["a", "b"]), (2, ["c", "a"])):
        store = RunStore(tmp_path / "run", Part(index, 2))
        store.open_run("fp", {"categories": [{"name": "c"}]})
        rows = store.row_writer("c", flush_rows=10, flush_seconds=60)
        for rid in ids:
            rows.add(_row(rid))
        rows.flush()
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    source = {"dataset": "d", "split": "train", "row": 0}
    rejects.add(reject_row(record_id="x", category="c", source=source, stage="request", reason="too long"))
    rejects.flush()
    result = CliRunner().invoke(app, ["status", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["rows"], doc["rejects"], doc["repeated_rows"], doc["parts"]) == (4, 1, 1, 2)
    assert doc["categories"][0]["training_rows"] == 3  # as `datagen export` writes them: "a" once
    assert doc["by_part"] == {"1/2": {"rows": 2, "rejects": 0}, "2/2": {"rows": 2, "rejects": 1}}
    shown = CliRunner().invoke(app, ["status", str(tmp_path / "run")])
    assert "1 rows repeat an id already written" in shown.stdout and "2/2" in shown.stdout  # for a pipe


def test_status_and_export_of_an_unknown_file_system_are_one_line_and_exit_2() -> None:
    for args in (["status", "nope://bucket/run"], ["export", "nope://bucket/run", "--format", "hf"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "unknown file system 'nope'" in result.output, result.output
        assert "Traceback" not in result.output


def test_status_of_a_url_reads_it_and_report_asks_for_a_local_run(tmp_path: Path) -> None:
    url = f"memory://status-{tmp_path.name}/run"
    store = RunStore(url, Part(1, 1))
    store.open_run("fp", {"categories": [{"name": "c"}]})
    rows = store.row_writer("c", flush_rows=10, flush_seconds=60)
    rows.add(_row("a"))
    rows.flush()
    try:
        result = CliRunner().invoke(app, ["status", url, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["by_part"] == {"1/1": {"rows": 1, "rejects": 0}}
        refused = CliRunner().invoke(app, ["status", url, "--report"])
        assert refused.exit_code == 2 and "a run at a URL gets its report" in refused.output
    finally:
        store.fs.rm(store.root, recursive=True)


def test_status_of_a_live_run_reads_each_folder_once_so_a_shard_written_meanwhile_is_never_half_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run writes shards while `datagen status` reads: right after the rows are listed, the
    run answers "y" (a standing retryable reject) and rejects "z". The status is of one moment: "y"
    is a row or a reject, never both, and no finished row or reject is left out."""
    run_dir = _run_dir(tmp_path)
    live = RunStore(run_dir)
    listed = RunStore.shard_files
    written: list[str] = []

    def list_then_write(store: RunStore, folder: str) -> list[str]:
        files = listed(store, folder)
        if folder == live.data_dir("c") and not written:
            rows = live.row_writer("c", flush_rows=10, flush_seconds=60)
            rows.add(_row("y"))
            written.append(str(rows.flush()))
            rejects = live.reject_writer("c", flush_rows=10, flush_seconds=60)
            source = {"dataset": "d", "split": "train", "row": 0}
            rejects.add(
                reject_row(record_id="z", category="c", source=source, stage="validate", reason="empty")
            )
            written.append(str(rejects.flush()))
        return files

    monkeypatch.setattr(RunStore, "shard_files", list_then_write)
    (during,) = run_status(run_dir).categories
    assert written, "the hook wrote between the status's reads"
    # rows a, b, later and the rejects x, y, z; or the rows with y and the rejects x, z
    assert (during.rows, during.rejects) in {(3, 3), (4, 2)}, (during.rows, during.rejects)
    assert sum(during.reject_reasons.values()) == during.rejects
    (after,) = run_status(run_dir).categories
    assert (after.rows, after.rejects, after.training_rows) == (4, 2, 3)
    assert after.reject_reasons == {"request: too long": 1, "validate: empty": 1}


def test_status_goes_on_when_a_shard_it_listed_is_moved_aside_by_another_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part starting beside `datagen status` finds a shard unreadable and quarantines it after the
    status listed it: the status counts what is still data, and says nothing moved twice."""
    run_dir = _run_dir(tmp_path)
    other_reader = RunStore(run_dir)
    listed = RunStore.shard_files

    def list_then_quarantine(store: RunStore, folder: str) -> list[str]:
        files = listed(store, folder)
        if folder == other_reader.data_dir("c"):
            other_reader.quarantine(files[0], ValueError("a page's checksum"))
        return files

    monkeypatch.setattr(RunStore, "shard_files", list_then_quarantine)
    (c,) = run_status(run_dir).categories
    assert c.rows == 0 and c.rejects == 3  # x, and "later" and "y" no longer answered by a row
    assert [p.parent.name for p in (run_dir / "quarantine").rglob("*.parquet")] == ["c"]
