"""Starting and stopping the simulator as a subprocess, and its command line."""

from __future__ import annotations

import os
import socket

import httpx
import pytest

from sglang_launch.simulator import SimConfig, SimulatorError, SimulatorProcess
from sglang_launch.simulator.cli import config_from_args

FAST = SimConfig(model_name="tinyllm", max_total_tokens=4096, context_length=1024, time_scale=0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def refuses(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.ConnectError:
        return True
    return False


def test_cli_flags_map_onto_the_config() -> None:
    cfg = config_from_args(
        [
            "--port", "31000",
            "--max-total-tokens", "4096",
            "--max-queued-requests", "8",
            "--time-scale", "0.05",
            "--reasoning",
            "--log-level", "warning",
            "--error-503-rate", "0.2",
        ]
    )  # fmt: skip
    assert (cfg.port, cfg.max_total_tokens, cfg.max_queued_requests, cfg.time_scale) == (31000, 4096, 8, 0.05)
    assert (cfg.reasoning, cfg.tool_calls, cfg.log_level, cfg.faults.error_503_rate) == (
        True,
        False,
        "warning",
        0.2,
    )
    assert config_from_args(["--max-queued-requests", "none"]).max_queued_requests is None
    assert config_from_args(["--stop-length-mean", "1500"]).stop_length_mean == 1500.0
    assert config_from_args([]) == SimConfig()


def test_cli_flags_override_a_json_config() -> None:
    base = SimConfig(max_total_tokens=5000, context_length=2000, faults={"cut_stream_rate": 0.5}, seed=7)
    cfg = config_from_args(
        ["--config-json", base.model_dump_json(), "--context-length", "1000", "--no-reasoning"]
    )
    assert (cfg.max_total_tokens, cfg.context_length, cfg.seed, cfg.faults.cut_stream_rate) == (
        5000,
        1000,
        7,
        0.5,
    )


def test_cli_rejects_invalid_values() -> None:
    with pytest.raises(ValueError):
        config_from_args(["--context-length", "200000"])  # larger than the KV pool
    with pytest.raises(SystemExit):
        config_from_args(["--log-level", "loud"])


def test_subprocess_serves_restarts_and_always_stops() -> None:
    # no bound on how long the start took: 1 s alone, 5-12 s beside eight busy processes (it failed
    # a bound of 5 s there); a start that never comes up raises (test_a_simulator_that_cannot_start_*)
    with SimulatorProcess(FAST) as sim:
        assert sim.url == f"http://127.0.0.1:{sim.config.port}" and alive(sim.pid)
        pid = sim.pid
        answer = httpx.post(
            sim.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        )
        assert answer.json()["usage"]["completion_tokens"] == 5 and answer.json()["model"] == "default"
        assert sim.set_faults(extra_latency_s=0.01)["extra_latency_s"] == 0.01
        sim.restart(downtime_s=0.3)
        assert httpx.get(sim.url + "/health").status_code == 503
        sim.wait_healthy(5)
        assert sim.stats()["restarts"] == 1
        log_path = sim.log_path
    assert not alive(pid) and refuses(sim.url) and not log_path.exists()


def test_kill_is_a_crash_and_start_brings_it_back_on_the_same_port() -> None:
    sim = SimulatorProcess(FAST).start()
    try:
        first = sim.pid
        sim.kill()
        assert refuses(sim.url)
        sim.start()
        assert sim.pid != first and httpx.get(sim.url + "/health").status_code == 200
    finally:
        sim.stop()
    assert refuses(sim.url)


def test_a_simulator_that_cannot_start_raises_with_its_log() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))  # bound, not listening: the child's bind fails, probes are refused
        sim = SimulatorProcess(FAST)
        sim.config = sim.config.model_copy(update={"port": busy.getsockname()[1]})
        with pytest.raises(SimulatorError, match="exited"):
            sim.start()


def test_a_simulator_that_wants_the_key_on_health_starts_with_its_own_key() -> None:
    """Its start waits on /health with the simulator's key: without it, a 401 until the timeout."""
    with SimulatorProcess(FAST.model_copy(update={"api_key": "sim-key", "key_on_health": True})) as sim:
        assert httpx.get(sim.url + "/health").status_code == 401
