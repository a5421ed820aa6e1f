"""Many machines: parts of one run as separate processes, into one output location (a URL)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.config import load_config
from flows.report.export import Selection, export_specforge
from flows.report.progress_log import read_progress
from flows.report.status import run_status
from flows.report.summary import report_name, summary_name
from flows.runner import execute
from flows.store.parts import Part, part_index, part_of_file
from flows.store.run_store import RunStore
from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.5, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
PROMPTS = 300


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(SimConfig(**FAST)) as server:
        yield server


def _ids_by_part(store: RunStore) -> dict[str | None, list[str]]:
    """Every id on disk (rows and rejects), by the part its shard's name says wrote it."""
    found: dict[str | None, list[str]] = {}
    for folder in (store.data_dir("chat"), store.rejects_dir("chat")):
        for path, table in store.shard_tables(folder, ["id"]):
            found.setdefault(part_of_file(path.rsplit("/", 1)[1]), []).extend(table.column("id").to_pylist())
    return found


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_two_parts_as_two_processes_write_the_union_once(tmp_path: Path, sim: SimulatorProcess) -> None:
    """Two `datagen run --part i/2` at once into one file:// URL: every prompt once, no id in both."""
    source = tmp_path / "prompts.jsonl"
    good = write_prompts(source, PROMPTS, bad_every=37)
    url = f"file://{tmp_path}/shared"
    config = write_config(
        tmp_path / "run.toml", name="split", output_dir=Path("unused"), url=sim.url, source=source
    )
    config.write_text(config.read_text().replace('output_dir = "unused"', f'output_dir = "{url}"'))
    procs = [datagen("run", str(config), "--no-prefect", "--part", f"{i}/2") for i in (1, 2)]
    outputs = [proc.communicate(timeout=240)[0].decode() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs

    run_dir = tmp_path / "shared" / "split"
    lives = [(life[0]["at"], life[-1]["at"]) for life in read_progress(run_dir)]
    assert len(lives) == 2 and max(start for start, _ in lives) < min(end for _, end in lives)  # at once
    check = check_run(run_dir)
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) + len(check.reject_ids) == PROMPTS
    assert len(check.row_ids) == good
    by_part = _ids_by_part(RunStore(f"{url}/split"))
    assert set(by_part) == {"1/2", "2/2"}
    assert not set(by_part["1/2"]) & set(by_part["2/2"])
    assert all(part_index(rid, 2) == int(part[0]) for part, ids in by_part.items() for rid in ids if part)

    for part in ("1/2", "2/2"):  # one shared folder: each part keeps its own report of its start
        summary = json.loads((run_dir / summary_name(part)).read_text())
        assert summary["part"] == part and summary["rows"] + summary["rejects"] == len(by_part[part])
        (run_dir / report_name(part)).unlink()
    assert not (run_dir / "summary.json").exists() and not (run_dir / "report.md").exists()
    redrawn = _cli("status", str(run_dir), "--report")
    assert redrawn.returncode == 0, redrawn.stdout + redrawn.stderr
    assert "part 2/2" in (run_dir / report_name("2/2")).read_text()
    assert "part 1/2" in (run_dir / report_name("1/2")).read_text()

    status = run_status(f"{url}/split")
    assert (status.rows, status.rejects, status.repeated_rows, status.parts) == (good, PROMPTS - good, 0, 2)
    counts = status.by_part()
    assert {part: n["rows"] + n["rejects"] for part, n in counts.items()} == {
        part: len(ids) for part, ids in by_part.items()
    }
    out = tmp_path / "all.jsonl"
    exported = _cli("export", f"{url}/split", "--format", "specforge", "--include-flagged", "--out", str(out))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    rows = {part: n["rows"] for part, n in counts.items()}
    assert f"Rows per part: 1/2 {rows['1/2']}, 2/2 {rows['2/2']}" in exported.stdout + exported.stderr
    lines = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(lines) == sorted(check.row_ids)


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://runs-{uuid.uuid4().hex}"
    yield url
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm(root, recursive=True)


async def test_parts_into_the_memory_file_system_then_status_export_and_resume(
    tmp_path: Path, sim: SimulatorProcess, memory_url: str
) -> None:
    """fsspec's memory file system is per process: the parts run here, one after the other."""
    source = tmp_path / "prompts.jsonl"
    good = write_prompts(source, 200, bad_every=23)
    path = write_config(
        tmp_path / "run.toml", name="mem", output_dir=Path("unused"), url=sim.url, source=source
    )
    path.write_text(
        path.read_text().replace(
            'output_dir = "unused"', f'output_dir = "{memory_url}"\nlocal_dir = "{tmp_path}"'
        )
    )
    config = load_config(path)
    for index in (1, 2):
        await execute(config, use_prefect=False, part=Part(index, 2))
    status = run_status(config.run_location)
    assert (status.rows, status.rejects, status.repeated_rows) == (good, 200 - good, 0)
    assert sum(n["rows"] + n["rejects"] for n in status.by_part().values()) == 200
    assert not (tmp_path / "mem" / "data").exists()  # the data went to the URL; local files stayed local
    assert (tmp_path / "mem" / summary_name("2/2")).exists() and (
        tmp_path / "mem" / ".lock-part-2-of-2"
    ).exists()

    result = export_specforge(config.run_location, tmp_path / "mem.jsonl", Selection(include_flagged=True))
    assert result.tally.rows == good and result.tally.duplicates == 0
    assert set(result.tally.rows_by_part) == {"1/2", "2/2"} and result.tally.rows_by_part.total() == good

    again = await execute(config, use_prefect=False, part=Part(1, 2))  # resume: nothing left to ask
    summary = json.loads((tmp_path / "mem" / summary_name("1/2")).read_text())
    assert summary["rows"] == summary["rejects"] == 0 and summary["part"] == "1/2"
    assert (again.rows, again.rejects) == (good, 200 - good)
