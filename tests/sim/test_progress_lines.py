"""`datagen run` whose output is a file (`nohup datagen run cfg > run.log 2>&1 &`): progress as it runs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline_support import write_config, write_prompts

from sglang_launch.simulator import SimConfig, SimulatorProcess

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d prompts (\d+)/(\d+|\?) · (\d+) rows · (\d+) rejects · ")


def test_a_run_writing_to_a_file_says_its_progress_while_it_runs(tmp_path: Path) -> None:
    """The rich bar draws nothing when stderr is not a terminal: the log stayed empty until the run
    ended, then got one bar line; a week-long run said nothing for a week. Now a plain line every
    ``--progress-every`` seconds, flushed, with no terminal escapes."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 40)
    config = write_config(tmp_path / "run.toml", name="logged", output_dir=tmp_path, url="URL", source=source)
    log = tmp_path / "run.log"
    sim_config = SimConfig(time_scale=0.3, stream_interval_s=0.05, log_level="warning", stop_probability=0.0)
    with SimulatorProcess(sim_config) as sim, log.open("wb") as out:
        config.write_text(config.read_text().replace("URL", sim.url).replace("limit = 64", "limit = 4"))
        run = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "--no-prefect", "--progress-every", "1", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        seen: list[str] = []
        while run.poll() is None and not seen:
            seen = [line for line in log.read_text().splitlines() if LINE.match(line)]
            time.sleep(0.1)
        still_running = run.poll() is None
        assert run.wait(timeout=120) == 0, log.read_text()
    text = log.read_text()
    assert still_running, f"no progress line before the run ended:\n{text}"
    assert "\x1b" not in text
    lines = [LINE.match(line) for line in text.splitlines()]
    rows = [int(m.group(3)) for m in lines if m is not None]
    assert len(rows) >= 3 and rows == sorted(rows) and rows[-1] == 40, text
    assert any(re.search(r" · \d+/4 in flight", line) for line in text.splitlines()), text
