"""A disk that fills up mid-run: one clear stop, nothing corrupt, and the same command resumes exactly once.

The full-disk test mounts a small tmpfs (needs root; skipped with the reason otherwise) under the
run's output directory, leaves a little room on it, and lets a run fill it. The second test makes the
shard writes fail in-process (no mount): the pipeline must stop sending at once.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.config import load_config
from flows.runner import execute
from flows.store.run_store import StoreWriteFailed
from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.1, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
PROMPTS = 1000
ROOM_BYTES = 200_000  # left free on the 2 MB disk: a few shards fit, then the disk is full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted at ``tmp_path/disk``, unmounted at teardown."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Take all the disk's space but ``leave`` bytes."""
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(free - leave, 0))


def test_a_full_disk_stops_the_run_with_one_line_and_the_same_command_resumes(
    tmp_path: Path, small_disk: Path
) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, PROMPTS)
    run_dir = small_disk / "full"
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="full", output_dir=small_disk, url=sim.url, source=source
        )
        _fill(small_disk, ROOM_BYTES)
        started = time.monotonic()
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=180)
        took = time.monotonic() - started
        text = out.decode()
        answered = sim.stats()["requests_completed"]
        assert proc.returncode == 5, text[-3000:]
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
        assert errors[0].startswith(f"error: the disk is full: cannot write {run_dir}/"), errors[0]
        assert "No space left on device" in errors[0] and " free" in errors[0]
        assert errors[0].endswith("free some space and run the same command again to resume."), errors[0]
        stopped = check_run(run_dir)
        assert stopped.corrupt_files == [] and stopped.duplicates == 0
        assert not list(run_dir.rglob(".tmp-*"))  # nothing partial a resume could read
        kept = len(stopped.row_ids)
        # stopped at once: the answers not on disk are at most what was in flight and buffered
        assert 0 < kept < answered < kept + 64 + 2 * 50 + 50, (kept, answered)
        print(f"disk full: exit 5 after {took:.1f} s, {kept} rows kept, {answered} answered, of {PROMPTS}")

        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
        again = datagen("run", str(config), "--no-prefect")
        assert again.wait(timeout=300) == 0, again.stdout.read().decode()[-3000:] if again.stdout else ""
    done = check_run(run_dir)
    assert done.corrupt_files == [] and done.duplicates == 0
    assert len(done.row_ids) + len(set(done.reject_ids)) == PROMPTS


def _fail_after(shards: int) -> Any:
    """``pq.write_table`` that writes ``shards`` row shards, then fails like a full disk."""
    real = pq.write_table
    written: list[Path] = []

    def write_table(table: Any, where: Any, **kwargs: Any) -> None:
        if len(written) >= shards:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(table, where, **kwargs)
        written.append(Path(where.name))

    return write_table


async def test_a_failed_shard_write_stops_sending_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, PROMPTS)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="fail", output_dir=tmp_path, url=sim.url, source=source
        )
        cfg = load_config(config)
        monkeypatch.setattr(pq, "write_table", _fail_after(3))
        started = time.monotonic()
        with pytest.raises(StoreWriteFailed, match="the disk is full"):
            await execute(cfg, use_prefect=False)
        took = time.monotonic() - started
        received = sim.stats()["requests_received"]
        time.sleep(1.0)
        assert sim.stats()["requests_received"] == received  # nothing sent after the stop
        assert received < PROMPTS / 2, received
        monkeypatch.undo()
        print(f"a failed write: stopped {took:.1f} s after the start, {received} requests sent of {PROMPTS}")
        await execute(cfg, use_prefect=False)
    done = check_run(tmp_path / "fail")
    assert done.corrupt_files == [] and done.duplicates == 0
    assert len(done.row_ids) + len(set(done.reject_ids)) == PROMPTS
