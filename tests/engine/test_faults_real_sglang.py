"""Faults against the REAL SGLang 0.5.23 (CPU, tiny model): a full queue, and the server killed mid-run.

One server with `--max-queued-requests 2` (16 may run, 2 may wait): a run that keeps 48 requests
in flight is refused again and again with SGLang's own 503 "The request queue is full." (and its
in-stream error event). Every prompt must still end exactly once, the 503s retried, not rejected.
Then the same server is killed with kill -9 mid-run and restarted on its port by someone else
(as a supervisor would): the run waits for it and completes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets import load_dataset
from engine_support import CPU_ARGS, needs_sglang, tiny_sglang
from pipeline_support import check_run, datagen, kill_group, wait_for_rows, write_config, write_prompts

from sglang_launch.engine import LaunchedEngine

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900), needs_sglang]


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedEngine]:
    logs = tmp_path_factory.mktemp("sglang-logs")
    engine = LaunchedEngine(tiny_sglang(logs, extra_args=[*CPU_ARGS, "--max-queued-requests", "2"]))
    with engine:
        engine.ensure_running()
        yield engine


def _config(tmp_path: Path, url: str, name: str, count: int) -> Path:
    source = tmp_path / f"{name}.jsonl"
    write_prompts(source, count)
    config = write_config(tmp_path / f"{name}.toml", name=name, output_dir=tmp_path, url=url, source=source)
    config.write_text(
        config.read_text()
        .replace("limit = 64", "limit = 48")
        .replace("max_tokens = 64", "max_tokens = 48")
        .replace("max_attempts = 6", "max_attempts = 30\noutage_patience_s = 300")
    )
    return config


def test_a_flooded_queue_of_2_is_retried_until_every_prompt_is_one_row(
    tmp_path: Path, small_queue: LaunchedEngine
) -> None:
    config = _config(tmp_path, small_queue.url, "flood", 150)
    proc = datagen("run", str(config), "--no-prefect")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "flood")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) == 150 and check.reject_ids == []
    ds = load_dataset("parquet", data_dir=str(tmp_path / "flood" / "data"), split="train")
    retried = sum(ds["attempts"]) - 150
    assert retried > 0  # the real server's 503s (the queue holds 2) were retried
    handle = small_queue.handle
    assert handle is not None
    log = handle.log_path.read_text(errors="replace")
    print(f"150 prompts, 48 in flight against a queue of 2: {retried} retried attempts")
    assert "Traceback" not in log


def test_the_server_killed_and_restarted_mid_run_costs_no_prompt(
    tmp_path: Path, small_queue: LaunchedEngine
) -> None:
    config = _config(tmp_path, small_queue.url, "restarted", 150)
    proc = datagen("run", str(config), "--no-prefect")
    try:
        wait_for_rows(tmp_path / "restarted", 30, proc, timeout_s=300)
        handle = small_queue.handle
        assert handle is not None
        os.killpg(handle.pid, signal.SIGKILL)  # the server and its scheduler die mid-run
        while handle.alive():  # dead before the supervisor looks, or it would see it still up
            time.sleep(0.05)
        restarting = threading.Thread(target=small_queue.ensure_running)  # a supervisor brings it back
        restarting.start()
        out, _ = proc.communicate(timeout=600)
        restarting.join(timeout=300)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out.decode()[-4000:]
    assert len(small_queue.attempts) == 2  # the first start and the supervisor's restart
    check = check_run(tmp_path / "restarted")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) == 150 and check.reject_ids == []
