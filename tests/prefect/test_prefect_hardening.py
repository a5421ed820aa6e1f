"""Under a real `prefect server start` (marker `prefect`): an API key from a Secret block, SIGTERM and Ctrl-C.

The key saved in a Secret block reaches the server that checks it and nothing else: no terminal
output (at INFO), no file of the run directory, no artifact, log, flow-run or task-run parameter
the API holds (without Prefect such a config is one line: tests/sim/test_secrets.py). A run stopped
by SIGTERM or Ctrl-C under Prefect stops within a bounded time with its rows flushed, and the same command
completes it exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import check_run, datagen, wait_for_rows, write_config, write_prompts

from flows.orchestration.server import PrefectServer
from sglang_launch.simulator import SimConfig, SimulatorProcess

pytestmark = pytest.mark.prefect

FAST = {"time_scale": 0.05, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
KEY = "sk-datagen-BLOCKLEAK-4c1d8e2b97"
BLOCK = "sim-api-key"
STOP_BOUND_S = 20.0  # measured 10 s on the 2 shared cores under a load of 10 (the report, Prefect's states)


def _env(server: PrefectServer) -> dict[str, str]:
    return {"PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(server.home)}


def _save_secret(server: PrefectServer) -> None:
    """Save the block as a user would, the key passed on stdin (never on a command line)."""
    code = (
        "import sys\nfrom prefect.blocks.system import Secret\n"
        "Secret(value=sys.stdin.read()).save(sys.argv[1])"
    )
    subprocess.run(
        [sys.executable, "-c", code, BLOCK],
        input=KEY,
        text=True,
        check=True,
        env={**os.environ, **_env(server)},
    )


def test_an_api_key_from_a_secret_block_reaches_the_server_and_nowhere_else(
    tmp_path: Path, server: PrefectServer, api_post: Any
) -> None:
    _save_secret(server)
    source = tmp_path / "p.jsonl"
    write_prompts(source, 40)
    with SimulatorProcess(SimConfig(**FAST, api_key=KEY)) as sim:
        config = write_config(
            tmp_path / "s.toml", name="secret", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(
            config.read_text().replace(f'url = "{sim.url}"', f'url = "{sim.url}"\napi_key_secret = "{BLOCK}"')
        )
        run = datagen("run", str(config), "-v", env=_env(server))
        out, _ = run.communicate(timeout=180)
        sim_log = sim.log_path.read_bytes()
    assert run.returncode == 0, out.decode()[-3000:]
    assert len(check_run(tmp_path / "secret").row_ids) == 40  # the server accepted the key
    needle = KEY.encode()
    assert needle not in out and needle not in sim_log
    assert [p for p in (tmp_path / "secret").rglob("*") if p.is_file() and needle in p.read_bytes()] == []
    snapshot = json.loads((tmp_path / "secret" / "manifest.json").read_text())["config"]
    assert snapshot["endpoints"][0]["api_key_secret"] == BLOCK  # the name is kept, not the value
    for what in ("artifacts/filter", "logs/filter", "flow_runs/filter", "task_runs/filter"):
        held = api_post(what)
        assert held, f"{what}: nothing to check"
        assert KEY not in json.dumps(held), f"the key is in the API's {what}"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_under_prefect_takes_bounded_time_and_the_same_command_resumes_exactly_once(
    tmp_path: Path, server: PrefectServer, api_post: Any, signum: int
) -> None:
    """SIGTERM (a scheduler, `kill`) and Ctrl-C (SIGINT, which asyncio answers by cancelling the main
    task inside Prefect's flow engine) alike."""
    prompts = 1200
    source = tmp_path / "p.jsonl"
    write_prompts(source, prompts)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "t.toml", name="term", output_dir=tmp_path, url=sim.url, source=source
        )
        first = datagen("run", str(config), env=_env(server))
        wait_for_rows(tmp_path / "term", 100, first, timeout_s=180)
        answered = sim.stats()["requests_completed"]
        sent = time.monotonic()
        first.send_signal(signum)
        out, _ = first.communicate(timeout=120)
        stopped_s = time.monotonic() - sent
        text = out.decode()
        assert first.returncode == 130, text[-3000:]
        assert "run the same command again to resume" in text and "Traceback" not in text, text[-3000:]
        assert stopped_s < STOP_BOUND_S, f"took {stopped_s:.1f} s to stop"
        stopped = check_run(tmp_path / "term")
        assert stopped.duplicates == 0 and stopped.corrupt_files == []
        assert len(stopped.row_ids) >= answered - 64  # what was read before the signal was flushed
        states = {str(r["name"]): str(r["state_type"]) for r in api_post("flow_runs/filter")}
        print(
            f"{signal.Signals(signum).name} under Prefect: exit 130 {stopped_s:.2f} s after the signal, "
            f"{len(stopped.row_ids)} rows"
        )
        print(f"flow runs after the stop: {states}")
        again = datagen("run", str(config), env=_env(server))
        rest, _ = again.communicate(timeout=300)
    assert again.returncode == 0, rest.decode()[-3000:]
    done = check_run(tmp_path / "term")
    assert done.duplicates == 0 and done.corrupt_files == []
    assert len(done.row_ids) + len(done.reject_ids) == prompts
    runs = api_post("flow_runs/filter")
    assert not [r for r in runs if r["state_type"] in ("RUNNING", "PENDING")], runs
