"""Endpoints that do not answer when a run starts, and the model each one serves."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pipeline_support import check_run, write_config, write_prompts

from flows.config import load_config
from flows.report.status import RunStatus
from flows.runner import execute
from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
SLOW = {**FAST, "time_scale": 0.3}
"""A run of a few hundred prompts that lasts long enough for the pool's probe (every 5 s) to see a
server that starts during it."""


def _two_endpoints(tmp_path: Path, first: str, second: str, prompts: int, extra: str = "") -> Path:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, prompts)
    config = write_config(tmp_path / "run.toml", name="ends", output_dir=tmp_path, url=first, source=source)
    text = config.read_text().replace(
        f'url = "{first}"\n', f'url = "{first}"\n\n[[endpoints]]\nurl = "{second}"\n'
    )
    text = text.replace("limit = 64", "limit = 8").replace("max_wait_s = 0.5", f"max_wait_s = 0.5\n{extra}")
    config.write_text(text)
    return config


def _row_column(run_dir: Path, column: str) -> list[str]:
    return [
        value
        for shard in run_dir.rglob("part-*.parquet")
        for value in pq.read_table(shard)[column].to_pylist()
    ]


def _warnings(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    return [line for line in said if all(word in line for word in words)]


async def _start_during_run(
    config: Path, up: SimulatorProcess, late: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> tuple[RunStatus, int]:
    """Run ``config``; once ``up`` has answered some prompts (the run started without ``late``, and
    said once that ``late`` does not answer), start ``late``. The run's status, and how many requests
    ``late`` answered."""
    run = asyncio.create_task(execute(load_config(config), use_prefect=False))
    try:
        deadline = time.monotonic() + 20
        while (await asyncio.to_thread(up.stats))["requests_completed"] < 10:
            assert time.monotonic() < deadline and not run.done(), "the run did not start on the endpoint up"
            await asyncio.sleep(0.1)
        assert len(_warnings(caplog, late.url, "does not answer")) == 1
        late.start()
        status = await asyncio.wait_for(run, 120)
        return status, (await asyncio.to_thread(late.stats))["requests_completed"]
    finally:
        run.cancel()
        late.stop()


async def test_an_endpoint_down_at_start_is_left_out_then_joins_once_it_serves_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its model unknown (not in the config), one endpoint that did not answer stopped the whole run
    after a minute of retries, the healthy one never used. The run starts on the one that answers,
    says once which one is down, and the other joins when it answers, once seen to list the model."""
    with SimulatorProcess(SimConfig(**SLOW)) as up:
        later = SimulatorProcess(SimConfig(**SLOW))  # its port: nothing listens there yet
        config = _two_endpoints(tmp_path, up.url, later.url, 300)
        status, joined = await _start_during_run(config, up, later, caplog)
    assert status.rows == 300 and joined > 0
    check = check_run(tmp_path / "ends")
    assert len(check.row_ids) == 300 and check.reject_ids == [] and check.duplicates == 0
    assert set(_row_column(tmp_path / "ends", "model")) == {"sim-model"}
    assert later.url in set(_row_column(tmp_path / "ends", "endpoint"))


async def test_an_endpoint_back_with_another_model_gets_no_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Down at start, its model was taken to be the others': one that comes back serving another
    model stays out of the run (its rows would be another model's answers under this run's name)."""
    with SimulatorProcess(SimConfig(**SLOW)) as up:
        other = SimulatorProcess(SimConfig(**SLOW, model_name="other-model"))
        config = _two_endpoints(tmp_path, up.url, other.url, 150)
        status, served = await _start_during_run(config, up, other, caplog)
    assert status.rows == 150 and served == 0
    assert _warnings(caplog, other.url, "other-model", "sim-model")  # seen back during the run, and kept out
    assert set(_row_column(tmp_path / "ends", "model")) == {"sim-model"}


async def test_a_configured_model_the_server_does_not_list_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``model = "Qwen/Qwen3-8B"`` against a server serving ``sim-model`` ran silently, every row
    saying Qwen/Qwen3-8B (SGLang answers under whatever name it is asked)."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 10)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="named", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(
            config.read_text().replace("stream = true", 'stream = true\nmodel = "Qwen/Qwen3-8B"')
        )
        status = await execute(load_config(config), use_prefect=False)
    assert status.rows == 10
    assert len(_warnings(caplog, sim.url, "Qwen/Qwen3-8B", "sim-model")) == 1


async def test_a_configured_model_the_server_lists_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 10)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="named", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(config.read_text().replace("stream = true", 'stream = true\nmodel = "sim-model"'))
        status = await execute(load_config(config), use_prefect=False)
    assert status.rows == 10
    assert not _warnings(caplog, "sim-model")
