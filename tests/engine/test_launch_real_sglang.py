"""The launcher against the real SGLang 0.5.23 on CPU (../shared/engines), tiny random-weight model.

Run with `uv run pytest -m engine tests/engine/test_launch_real_sglang.py` (~80 s on 2 cores: one
start, then one failed start plus its retry). Skipped when the engine venv or the model is absent.
The flags are those of the shared `serve.sh sglang`, copied here so nothing reads ../shared at run
time. Only one engine at a time on a 2-core machine: do not run this beside another engine test.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from engine_support import CPU_ARGS, CPU_ENV, needs_sglang, tiny_sglang
from rich.console import Console
from typer.testing import CliRunner

from flows.cli import launch as launch_cli
from sglang_launch import launcher
from sglang_launch.engine import LaunchedEngine

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300), needs_sglang]


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def shm_files() -> set[Path]:
    """What SGLang leaves in /dev/shm unless cleaned: load-snapshot slots and a named semaphore."""
    return {*Path("/dev/shm").glob("sglang_loads_*.shm"), *Path("/dev/shm").glob("sem.mp-*")}


def leftovers(before: set[Path]) -> set[Path]:
    """New /dev/shm files no live process uses (a concurrent server's own files are in use)."""
    return shm_files() - before - launcher._shm_files_in_use()


def test_real_sglang_starts_serves_reports_kv_and_stops_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAGEN_TEST_SGLANG_KEY", "sk-engine-test-secret")
    shm_before = shm_files()
    engine = LaunchedEngine(tiny_sglang(tmp_path, api_key_env="DATAGEN_TEST_SGLANG_KEY"))
    with engine:
        attempts = engine.ensure_running()
        assert [(a.outcome, a.failure) for a in attempts] == [("ready", None)]
        assert engine.max_total_num_tokens == 4096
        assert httpx.get(f"{engine.url}/health", timeout=10).status_code == 200
        assert "sglang:max_total_num_tokens" in httpx.get(f"{engine.url}/metrics", timeout=10).text
        chat = {"model": "tinyllm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        assert httpx.post(f"{engine.url}/v1/chat/completions", json=chat, timeout=60).status_code == 401
        answer = httpx.post(
            f"{engine.url}/v1/chat/completions",
            json=chat,
            headers={"Authorization": "Bearer sk-engine-test-secret"},
            timeout=60,
        )
        assert answer.status_code == 200
        body = answer.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= body["usage"]["completion_tokens"] <= 8
        handle = engine.handle
        assert handle is not None
    assert not handle.alive() and not group_alive(handle.pid)
    assert leftovers(shm_before) == set()
    log = attempts[0].log_path.read_text()
    assert "max_total_num_tokens=4096" in log  # SGLang's own startup output reached the log
    assert "'api_key': '***'" in log
    assert "sk-engine-test-secret" not in log


def test_real_sglang_failed_start_is_classified_and_retried_by_datagen_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.0001 leaves no room for the KV pool once the weights are counted: SGLang 0.5.23 stops with
    # "Loaded weights leave no GPU memory for the KV cache ... Raise --mem-fraction-static", a
    # kv_memory failure, so the ladder goes UP one step (0.78, the default ladder's bottom).
    monkeypatch.setattr(launch_cli, "console", Console(width=250))
    shm_before = shm_files()
    config = tmp_path / "run.toml"
    cfg = tiny_sglang(tmp_path / "logs")
    config.write_text(
        "[server]\n"
        + f'python = "{cfg.python}"\nmodel_path = "{cfg.model_path}"\nserved_model_name = "tinyllm"\n'
        + "context_length = 1024\nmax_total_tokens = 4096\nmax_running_requests = 16\n"
        + f'log_dir = "{cfg.log_dir}"\nstartup_timeout_s = 180\n'
    )
    env_flags = [f"--env={name}={value}" for name, value in CPU_ENV.items()]
    args = [
        "--config",
        str(config),
        "--mem-fraction-static",
        "0.0001",
        "--check",
        *env_flags,
        "--",
        *CPU_ARGS,
    ]
    result = CliRunner().invoke(launch_cli.app, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"│ 1\s+│ 0\.0001\s+│ failed\s+│ kv_memory\s+│", result.output), result.output
    assert re.search(r"│ 2\s+│ 0\.78\s+│ ready\s+│\s+│", result.output), result.output
    assert "KV capacity 4096 tokens" in result.output
    logs = sorted((tmp_path / "logs").iterdir())
    assert len(logs) == 2
    assert "leave no GPU memory for the KV cache" in logs[0].read_text()
    assert leftovers(shm_before) == set()
