"""A run that launches its own server says so on its live line while the server starts."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from test_launcher import fake_cfg, shm_dir, with_env

from flows.cli.console import live_line
from flows.config import parse_config
from flows.run.session import RunSession
from flows.runner import execute
from sglang_launch.launcher import StartupFailed
from sglang_launch.server_config import ServerConfig

__all__ = ["fake_cfg", "shm_dir"]  # the launcher tests' fake SGLang, as fixtures

pytestmark = pytest.mark.timeout(60)


class Recorded:
    """A ``RunDisplay`` keeping the live line of each update."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def update(self, session: RunSession) -> None:
        self.lines.append(live_line(session).detail)

    def summary(self, summary: dict[str, Any], status: Any) -> None: ...


def test_the_live_line_says_the_server_is_launching_its_log_and_the_wait(
    fake_cfg: ServerConfig, tmp_path: Path
) -> None:
    """``[server] launch = true``: the server's start (minutes for a large model) read "prompts 0/?
    starting" all along; the attempt and its log were INFO lines only. The fake server never turns
    healthy, so the start times out after 4.5 s."""
    server = with_env(fake_cfg, FAKE_HANG="1")
    config = parse_config(
        {
            "run": {"name": "launched", "output_dir": str(tmp_path)},
            "server": {
                "launch": True,
                "python": server.python,
                "model_path": server.model_path,
                "served_model_name": "fake",
                "health_poll_s": 0.05,
                "startup_timeout_s": 4.5,
                "log_dir": str(server.log_dir),
                "env": server.env,
            },
            "categories": [{"name": "chat", "source": str(tmp_path / "p.jsonl"), "format": "messages"}],
        }
    )
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    display = Recorded()
    with pytest.raises(StartupFailed):
        asyncio.run(execute(config, use_prefect=False, display=display))
    (log,) = server.log_dir.glob("*attempt1.log")
    shown = re.compile(r"launching the server: waiting 0:00:0(\d), log (\S+) · ")
    said = [shown.match(line) for line in display.lines]
    waits = [int(m.group(1)) for m in said if m is not None]
    assert len(waits) >= 2 and waits[-1] >= 2, display.lines
    assert {m.group(2) for m in said if m is not None} == {str(log)}
