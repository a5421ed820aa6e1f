"""Under a real `prefect server start` (marker `prefect`): an API key from a Secret block.

The key saved in a Secret block reaches the server that checks it and nothing else: no terminal
output (at INFO), no file of the run directory, no artifact, log, flow-run or task-run parameter
the API holds (without Prefect such a config is one line: tests/sim/test_secrets.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.orchestration.server import PrefectServer
from sglang_launch.simulator import SimConfig, SimulatorProcess

pytestmark = pytest.mark.prefect

FAST = {"time_scale": 0.05, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
KEY = "sk-datagen-BLOCKLEAK-4c1d8e2b97"
BLOCK = "sim-api-key"


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
