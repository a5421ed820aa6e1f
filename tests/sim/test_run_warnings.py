"""What a person running ``datagen run`` reads while it runs: warnings on the CLI's display."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline_support import write_config, write_prompts

from sglang_launch.ports import free_port
from sglang_launch.simulator import SimConfig, SimulatorProcess
from sglang_launch.simulator.config import FaultConfig


def test_the_cli_shows_the_runs_warnings_as_warning_lines_once_not_as_log_lines(tmp_path: Path) -> None:
    """`datagen run` with no OOM guard (its DCGM exporter does not answer) and every answer cut by
    max_tokens: each is one ``warning:`` line on the terminal. The OOM guard's was a structured log
    line (``level=WARNING logger=flows.control.vram msg=...``) written past the progress bar, which
    its redraws bury; none of them may come twice (a ``warning:`` line and a log line)."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 40)
    config = write_config(tmp_path / "run.toml", name="cut", output_dir=tmp_path, url="URL", source=source)
    exporter = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    sim_config = SimConfig(  # answers slow enough (5 rounds of 1 s) for the controller to read the exporter
        time_scale=0.1,
        stream_interval_s=0.02,
        log_level="warning",
        stop_probability=0.0,
        faults=FaultConfig(first_token_delay_s=1.0),
    )
    with SimulatorProcess(sim_config) as sim:
        config.write_text(
            config.read_text()
            .replace("URL", sim.url)
            .replace("max_tokens = 64", "max_tokens = 4")
            .replace("limit = 64", f'vram = "{exporter}"\npoll_s = 0.2')  # adaptive: a controller reads it
        )
        result = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", "--no-prefect", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "300"},
        )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    guard = [line for line in lines if "no OOM guard" in line]
    assert len(guard) == 1 and guard[0].startswith(
        f"warning: free GPU memory cannot be read from {exporter} ("
    ), result.stderr
    quality = [line for line in lines if "left out of training" in line]
    assert len(quality) == 1 and quality[0].startswith("warning: category chat: 32 of its first 32 rows"), (
        result.stderr
    )
