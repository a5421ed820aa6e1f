"""One orchestrator per run directory; a run killed with kill -9 never leaves it locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flows.store.parts import Part
from flows.store.run_lock import RunLock, RunLocked

HOLD = """
import sys, time
from pathlib import Path
from flows.store.run_lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def _holder(run_dir: Path) -> subprocess.Popen[str]:
    """Another process that takes the lock and keeps it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_holder_is_refused_with_who_holds_it_and_can_take_it_after_release(tmp_path: Path) -> None:
    first = RunLock(tmp_path / "run")
    first.acquire()
    with pytest.raises(RunLocked, match=rf"in use by another datagen run \(pid {os.getpid()} on "):
        RunLock(tmp_path / "run").acquire()
    first.release()
    with RunLock(tmp_path / "run"):
        pass


def test_a_lock_held_by_a_process_killed_with_kill_9_does_not_block(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        with pytest.raises(RunLocked, match=f"pid {holder.pid} "):
            RunLock(run_dir).acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    assert (run_dir / ".lock").exists()  # the file is left behind ...
    with RunLock(run_dir):  # ... and does not matter: the kernel released the lock
        pass


def test_a_second_run_on_a_busy_directory_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    """The reported race: the second run removed the first's temporary shard."""
    run_dir = tmp_path / "busy"
    source = tmp_path / "p.jsonl"
    source.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = tmp_path / "run.toml"
    config.write_text(
        f'[run]\nname = "busy"\noutput_dir = "{tmp_path}"\n[[endpoints]]\nurl = "http://127.0.0.1:9"\n'
        f'[[categories]]\nname = "chat"\nsource = "{source}"\nformat = "messages"\n'
    )
    holder = _holder(run_dir)
    in_progress = run_dir / "data" / "chat" / ".tmp-part-1.parquet"
    in_progress.parent.mkdir(parents=True)
    in_progress.write_bytes(b"being written")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(config), "--no-prefect"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1 and "in use by another datagen run" in errors[0] and "Traceback" not in proc.stderr
    )
    assert in_progress.exists()


def test_parts_run_side_by_side_but_not_twice_and_never_beside_a_whole_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunLock(run_dir, Part(1, 2)), RunLock(run_dir, Part(2, 2)):
        with pytest.raises(RunLocked, match=rf"\(part 1/2: pid {os.getpid()} "):
            RunLock(run_dir, Part(1, 2)).acquire()
        with pytest.raises(RunLocked, match="in use by another datagen run"):
            RunLock(run_dir).acquire()
    with RunLock(run_dir), pytest.raises(RunLocked, match="in use by another datagen run"):
        RunLock(run_dir, Part(2, 2)).acquire()
    with RunLock(run_dir, Part(1, 2)):  # all released
        pass
