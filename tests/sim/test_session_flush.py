"""A session's flush leaves on disk everything the report is drawn from."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline_support import write_config, write_prompts

from flows.config import load_config
from flows.control.timeline import TIMELINE_DIR
from flows.run.session import RunSession
from sglang_launch.simulator import SimConfig, simulator_in_thread


async def test_a_flush_writes_the_controllers_timeline_too(tmp_path: Path) -> None:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 10)
    with simulator_in_thread(SimConfig(max_total_tokens=4096, context_length=1024)) as sim:
        path = write_config(tmp_path / "c.toml", name="t", output_dir=tmp_path, url=sim.url, source=source)
        path.write_text(path.read_text().replace("limit = 64", "poll_s = 0.2"))  # adaptive
        async with RunSession(load_config(path)) as session:
            (controller,) = session.control.controllers
            while controller.last is None:  # a decision made, not yet written (every 30 s)
                await asyncio.sleep(0.05)
            assert not list((tmp_path / "t" / TIMELINE_DIR).glob("*.parquet"))
            await session.flush()
            assert list((tmp_path / "t" / TIMELINE_DIR).glob("*.parquet"))
