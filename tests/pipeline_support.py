"""Helpers shared by the pipeline tests of the simulator and real-engine tiers.

Makes prompt files, writes run configs, and checks a finished run directory for the exactly-once
contract: every prompt is one row or one reject, no id twice, every shard readable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq

from prompts.synthetic import write_synthetic_prompts

write_prompts = write_synthetic_prompts


def write_config(path: Path, *, name: str, output_dir: Path, url: str, source: Path, extra: str = "") -> Path:
    path.write_text(
        f"""
[run]
name = "{name}"
output_dir = "{output_dir}"

[[endpoints]]
url = "{url}"
stream = true

[concurrency]
limit = 64

[retry]
max_attempts = 6
initial_wait_s = 0.05
max_wait_s = 0.5

[store]
flush_rows = 50
flush_seconds = 1
shard_prompts = 250

[generation]
max_tokens = 64

[[categories]]
name = "chat"
source = "{source}"
format = "messages"
{extra}
""",
        encoding="utf-8",
    )
    return path


def empty_summary(local_dir: str, *, rejects: int = 0) -> dict[str, Any]:
    """The summary `datagen run` prints at its end for a run that made no row (its fields, zeroed)."""
    return {
        "categories": [],
        "rows": 0,
        "rejects": rejects,
        "completion_tokens": 0,
        "seconds": 1.0,
        "output_tokens_per_s": 0.0,
        "rows_per_s": 0.0,
        "server_restarts": 0,
        "resumed": False,
        "part": None,
        "local_dir": local_dir,
    }


def never_flush(config: Path) -> None:
    """Shards only at the end: nothing reaches disk on its own, only a stop's final flush saves rows."""
    config.write_text(
        config.read_text()
        .replace("flush_rows = 50", "flush_rows = 100000")
        .replace("flush_seconds = 1", "flush_seconds = 3600")
    )


@dataclass
class RunCheck:
    row_ids: list[str]
    reject_ids: list[str]
    reject_reasons: Counter[str]
    corrupt_files: list[Path]
    retryable_ids: set[str] = field(default_factory=set)
    """Rejects marked retryable: a later start asks them again, and may answer them with a row."""

    @property
    def duplicates(self) -> int:
        everything = self.row_ids + self.reject_ids
        return len(everything) - len(set(everything))

    @property
    def standing_reject_ids(self) -> set[str]:
        """The rejects a run ended with: a retryable one that a later start answered is a row."""
        return set(self.reject_ids) - (self.retryable_ids & set(self.row_ids))


def check_run(run_dir: Path) -> RunCheck:
    """Read every shard of a run directly (not through the project's store) and collect ids."""
    rows: list[str] = []
    rejects: list[str] = []
    reasons: Counter[str] = Counter()
    retryable: set[str] = set()
    corrupt: list[Path] = []
    for kind, target in (("data", rows), ("rejects", rejects)):
        for path in sorted((run_dir / kind).rglob("*.parquet")):
            if path.name.startswith(".tmp-"):
                continue
            try:
                table = pq.read_table(path)
            except Exception:
                corrupt.append(path)
                continue
            target.extend(table.column("id").to_pylist())
            if kind == "rejects":
                reasons.update(table.column("reason").to_pylist())
                marked = zip(
                    table.column("id").to_pylist(), table.column("retryable").to_pylist(), strict=True
                )
                retryable.update(rid for rid, again in marked if again)
    return RunCheck(rows, rejects, reasons, corrupt, retryable)


def datagen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `datagen ARGS` in its own process group (so a kill -9 takes its children too), taking
    Ctrl-C as from a terminal however the tests were started: a shell without job control starts its
    background commands with SIGINT ignored (`nohup pytest ... &` in a script), a child inherits
    that, and the tests' Ctrl-C then hung the run they stop. A handled signal is reset at exec."""
    with _sigint_handled():
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


@contextlib.contextmanager
def _sigint_handled() -> Iterator[None]:
    """SIGINT handled (not ignored) in this process meanwhile, where it can be set (the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the run and everything it started (e.g. Prefect's temporary server)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


class _Stats(Protocol):
    def stats(self) -> dict[str, Any]: ...


def every_request_hung(sim: _Stats) -> bool:
    """Nothing running or queued and no answer for 1 s: the run's requests all sit in the simulator's
    added latency (``set_faults(extra_latency_s=...)``), so what it answered so far is all it will."""
    before = sim.stats()
    time.sleep(1.0)
    after = sim.stats()
    return (
        after["requests_completed"] == before["requests_completed"]
        and after["running"] + after["queued"] == 0
    )


def rows_on_disk(run_dir: Path) -> int:
    total = 0
    for path in (run_dir / "data").rglob("part-*.parquet"):
        try:
            total += pq.read_metadata(path).num_rows
        except Exception:
            continue
    return total


def wait_for_rows(run_dir: Path, minimum: int, proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = rows_on_disk(run_dir)
        if n >= minimum:
            return n
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"run ended before {minimum} rows were on disk:\n{out[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"fewer than {minimum} rows after {timeout_s} s")


def children(pid: int, needle: bytes) -> list[int]:
    """Live child processes of ``pid`` whose command line contains ``needle`` (others' are ignored)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and needle in cmdline:
            found.append(int(proc.name))
    return found
