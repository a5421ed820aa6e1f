"""What the server can do to a request, one fault at a time, through the whole pipeline.

Stalled streams (no bytes for longer than the read timeout), a slow first token, connection
refused mid-run (the server stopped, then back on the same port), and HTTP 500s whose body is not
JSON. Each run must end with every prompt exactly one row or one reject, in a bounded time.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from datasets import load_dataset
from pipeline_support import check_run, rows_on_disk, write_config, write_prompts

from flows.config import load_config
from flows.runner import execute
from sglang_launch.simulator import FaultConfig, SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
STALL_S = 3600.0
"""How long a stalled stream stays silent: far beyond ``HANG_S``, so a run that waited out even one
stall fails however slow the machine."""
HANG_S = 300.0
"""The bound on a stalled run's duration, a hang's only: 7 s alone on the 2 shared cores, 41 s beside
eight busy processes (the old bound of 25 s, under a 30 s stall, failed there)."""


def _config(tmp_path: Path, url: str, name: str, count: int, retry: str = "") -> Path:
    source = tmp_path / f"{name}.jsonl"
    write_prompts(source, count)
    config = write_config(tmp_path / f"{name}.toml", name=name, output_dir=tmp_path, url=url, source=source)
    if retry:
        config.write_text(config.read_text().replace("max_wait_s = 0.5\n", f"max_wait_s = 0.5\n{retry}\n"))
    return config


async def test_stalled_streams_are_timed_out_and_retried(tmp_path: Path) -> None:
    """A stream silent for an hour meets a 1 s read timeout: cut, asked again, answered."""
    faults = FaultConfig(stall_stream_rate=0.2, stall_s=STALL_S)
    with SimulatorProcess(SimConfig(**FAST, faults=faults)) as sim:
        config = _config(tmp_path, sim.url, "stall", 200, "read_timeout_s = 1")
        started = time.monotonic()
        status = await execute(load_config(config), use_prefect=False)
        took = time.monotonic() - started
        stats = sim.stats()
    check = check_run(tmp_path / "stall")
    assert check.duplicates == 0 and check.reject_ids == [] and len(check.row_ids) == 200
    assert status.rows == 200
    assert stats["streams_stalled"] >= 20  # about 1 in 5 of 200+ streams
    ds = load_dataset("parquet", data_dir=str(tmp_path / "stall" / "data"), split="train")
    assert sum(a > 1 for a in ds["attempts"]) >= 20
    assert took < HANG_S, f"{took:.1f} s"  # never waits out a stall


async def test_streams_that_always_stall_become_retryable_rejects_then_rows(tmp_path: Path) -> None:
    """Every stream stalls: each prompt gives up after its attempts (a retryable reject, no hang);
    the same command on a healthy server turns them into rows."""
    faults = FaultConfig(stall_stream_rate=1.0, stall_s=STALL_S)
    with SimulatorProcess(SimConfig(**FAST, faults=faults)) as sim:
        config = _config(tmp_path, sim.url, "stuck", 10, "read_timeout_s = 0.5")
        config.write_text(config.read_text().replace("max_attempts = 6", "max_attempts = 2"))
        started = time.monotonic()
        await execute(load_config(config), use_prefect=False)
        took = time.monotonic() - started
        stuck = check_run(tmp_path / "stuck")
        sim.set_faults(stall_stream_rate=0.0)
        await execute(load_config(config), use_prefect=False)
    assert stuck.row_ids == [] and len(stuck.reject_ids) == 10 and stuck.duplicates == 0
    assert {reason.split(":")[0] for reason in stuck.reject_reasons} == {"request timed out"}
    assert took < HANG_S, f"{took:.1f} s"
    final = check_run(tmp_path / "stuck")
    assert len(final.row_ids) == 10  # the retryable rejects were asked again
    assert len(set(final.row_ids)) == 10


async def test_a_slow_first_token_is_waited_for_and_measured(tmp_path: Path) -> None:
    faults = FaultConfig(first_token_delay_s=1.5)
    with SimulatorProcess(SimConfig(**FAST, faults=faults)) as sim:
        config = _config(tmp_path, sim.url, "slowfirst", 80, "read_timeout_s = 5")
        status = await execute(load_config(config), use_prefect=False)
    assert status.rows == 80 and status.rejects == 0
    ds = load_dataset("parquet", data_dir=str(tmp_path / "slowfirst" / "data"), split="train")
    assert min(ds["ttft_s"]) >= 1.5 and set(ds["attempts"]) == {1}  # slow is not a failure


async def test_connection_refused_mid_run_is_waited_out(tmp_path: Path) -> None:
    """The server process stops (connections refused) and comes back 3 s later on the same port."""
    # slow enough that the kill lands mid-run: at FAST's speed the client can finish 400 rows first
    with SimulatorProcess(SimConfig(**{**FAST, "time_scale": 0.3})) as sim:
        config = _config(tmp_path, sim.url, "refused", 400, "outage_patience_s = 60")
        run = asyncio.create_task(execute(load_config(config), use_prefect=False))
        while rows_on_disk(tmp_path / "refused") < 100:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(sim.kill)
        down_at = rows_on_disk(tmp_path / "refused")
        await asyncio.sleep(3.0)
        await asyncio.to_thread(sim.start)
        status = await run
    check = check_run(tmp_path / "refused")
    assert down_at < 400
    assert check.duplicates == 0 and check.reject_ids == [] and len(check.row_ids) == 400
    assert status.rows == 400


async def test_http_500_with_a_body_that_is_not_json_is_retried(tmp_path: Path) -> None:
    faults = FaultConfig(error_500_rate=0.1)
    with SimulatorProcess(SimConfig(**FAST, faults=faults)) as sim:
        config = _config(tmp_path, sim.url, "five", 200)
        status = await execute(load_config(config), use_prefect=False)
        stats = sim.stats()
    check = check_run(tmp_path / "five")
    assert check.duplicates == 0 and check.reject_ids == [] and len(check.row_ids) == 200
    assert status.rows == 200
    assert stats["injected_500"] >= 5
    ds = load_dataset("parquet", data_dir=str(tmp_path / "five" / "data"), split="train")
    assert sum(ds["attempts"]) == 200 + stats["injected_500"]  # each 500 cost exactly one more attempt
