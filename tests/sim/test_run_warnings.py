"""What a person running ``datagen run`` reads while it runs: warnings on the CLI's display."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import write_config, write_prompts

from flows.config import load_config
from flows.report.status import RunStatus
from flows.run.session import RunSession
from flows.runner import execute
from sglang_launch.simulator import SimConfig, SimulatorProcess


class RecordingDisplay:
    """The CLI's ``RunDisplay`` without a terminal: what it was told to warn about."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def start(self) -> None:
        pass

    def update(self, session: RunSession) -> None:
        pass

    def stop(self) -> None:
        pass

    def summary(self, summary: dict[str, Any], status: RunStatus) -> None:
        pass

    def warn(self, message: str) -> None:
        self.warnings.append(message)


async def test_a_category_nearly_all_left_out_of_training_is_a_warning_on_the_display_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every answer cut by max_tokens: the person watching reads it as a ``warning:`` line beside
    the progress bar, as the CLI's other warnings, and not a second time as a log line."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 40)
    config = write_config(tmp_path / "run.toml", name="cut", output_dir=tmp_path, url="URL", source=source)
    display = RecordingDisplay()
    sim_config = SimConfig(time_scale=0.02, stream_interval_s=0.02, log_level="warning", stop_probability=0.0)
    with SimulatorProcess(sim_config) as sim, caplog.at_level(logging.WARNING):
        config.write_text(
            config.read_text().replace("URL", sim.url).replace("max_tokens = 64", "max_tokens = 4")
        )
        await execute(load_config(config), use_prefect=False, display=display)
    said = [w for w in display.warnings if "left out of training" in w]
    assert len(said) == 1 and "category chat: 32 of its first 32 rows" in said[0]
    assert not [r for r in caplog.records if "left out of training" in r.getMessage()]
