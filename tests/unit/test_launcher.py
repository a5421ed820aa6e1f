"""The launcher against a fake SGLang (a small script playing the server), and the ladder rule.

The fake stands in for `python -m sglang.launch_server`: it reads --mem-fraction-static, prints
SGLang's own failure messages (from its 0.5.23 source) and exits 1 when told the fraction is too
high or too low, otherwise serves /health (503 first, like SGLang warming up) and /get_server_info.
It also starts a child in its process group and holds a load-snapshot file open, as SGLang does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from flows.cli.launch import app
from sglang_launch import launcher
from sglang_launch.engine import LaunchedEngine
from sglang_launch.launcher import (
    StartupFailed,
    launch_with_ladder,
    next_fraction,
    retry_direction,
    server_url,
)
from sglang_launch.placement import Placement
from sglang_launch.ports import free_port
from sglang_launch.probe import is_healthy_async, kv_capacity, server_info
from sglang_launch.server_config import ServerConfig
from sglang_launch.server_record import ProcessId, ServerRecord, read_records

pytestmark = pytest.mark.timeout(60)


def is_healthy(url: str) -> bool:
    return asyncio.run(is_healthy_async(url))


FAKE_SERVER = textwrap.dedent(
    """
    import http.server, json, mmap, os, signal, subprocess, sys, time

    args = sys.argv[1:]
    def arg(name, default=None):
        return args[args.index(name) + 1] if name in args else default

    fraction = float(arg("--mem-fraction-static", os.environ.get("FAKE_AUTO_FRACTION", "0.9")))
    print(f"[2026-11-29 14:06:36] server_args={{'api_key': {arg('--api-key')!r}, "
          f"'mem_fraction_static': {fraction}, 'tp_size': 1}}", flush=True)
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(os.environ["FAKE_CHILD_PID_FILE"], "w").write(str(child.pid))
    shm = open(os.path.join(os.environ["FAKE_SHM_DIR"], f"sglang_loads_fake_{os.getpid()}.shm"), "w")
    with open(os.path.join(os.environ["FAKE_SHM_DIR"], f"sem.mp-fake{os.getpid()}"), "w+b") as sem:
        sem.write(bytes(32))
        sem.flush()
        semaphore = mmap.mmap(sem.fileno(), 32)  # only mapped, like a named semaphore
    if os.environ.get("FAKE_OOM_LOADING"):
        print("[2026-11-29 14:06:40 TP0] Load weight begin. avail mem=79.00 GB", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", flush=True)
        sys.exit(1)
    if fraction > float(os.environ.get("FAKE_OOM_ABOVE", "1")):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", flush=True)
        sys.exit(1)
    if fraction < float(os.environ.get("FAKE_KV_BELOW", "0")):
        print("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
              f"Current value: mem_fraction_static={fraction}", flush=True)
        sys.exit(1)
    if os.environ.get("FAKE_EXIT"):
        print("something unexpected", flush=True)
        sys.exit(3)
    # dies once it serves: after the launcher, its start judged "ready", read its server info (a
    # death on a timer could come before that on a loaded machine, and read as a failed start)
    serving_oom = fraction > float(os.environ.get("FAKE_SERVING_OOM_ABOVE", "1"))
    def oom():
        time.sleep(0.1)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.", flush=True)
        os._exit(1)
    kv = int(os.environ.get("FAKE_KV", "4096"))
    print(f"[2026-11-29 14:06:50] max_total_num_tokens={kv}, chunked_prefill_size=4096, "
          "max_running_requests=16, context_len=1024", flush=True)
    started = time.monotonic()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, body=b""):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            warm = time.monotonic() - started > float(os.environ.get("FAKE_WARMUP_S", "0.2"))
            key = arg("--api-key")
            keyed = key and self.headers.get("Authorization") == f"Bearer {key}"
            if self.path == "/health" and os.environ.get("FAKE_KEY_ON_HEALTH") and not keyed:
                self._send(401)  # a gateway in front of the engine checks the key on every path
            elif self.path == "/health":
                self._send(200 if warm and not os.environ.get("FAKE_HANG") else 503)
            elif self.path == "/get_server_info" and not os.environ.get("FAKE_NO_INFO"):
                if key and not keyed:
                    self._send(401)
                else:
                    self._send(200, json.dumps({"max_total_num_tokens": kv}).encode())
                    if serving_oom:
                        import threading
                        threading.Thread(target=oom, daemon=True).start()
            else:
                self._send(404)

    http.server.ThreadingHTTPServer((arg("--host"), int(arg("--port"))), Handler).serve_forever()
    """
)


@pytest.fixture
def shm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The launcher's /dev/shm, pointed at a temporary folder."""
    path = tmp_path / "shm"
    path.mkdir()
    monkeypatch.setattr(launcher, "_SHM_DIR", path)
    return path


@pytest.fixture
def fake_cfg(tmp_path: Path, shm_dir: Path) -> ServerConfig:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    python = tmp_path / "fake-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    return ServerConfig(
        python=str(python),
        model_path="/models/fake",
        health_poll_s=0.05,
        startup_timeout_s=20,
        stop_grace_s=5,
        log_dir=tmp_path / "logs",
        env={"FAKE_CHILD_PID_FILE": str(tmp_path / "child.pid"), "FAKE_SHM_DIR": str(shm_dir)},
    )


def with_env(cfg: ServerConfig, **env: str) -> ServerConfig:
    return cfg.model_copy(update={"env": {**cfg.env, **env}})


def pid_alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- the ladder rule ---------------------------------------------------------------------------

LADDER = [0.88, 0.85, 0.82, 0.78]


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        ([(0.9, -1)], 0.88),  # CUDA OOM: one step down
        ([(0.9, -1), (0.88, -1)], 0.85),
        ([(0.85, -1)], 0.82),
        ([(0.78, -1)], None),  # nothing lower
        ([(0.5, 1)], 0.78),  # KV pool did not fit: one step up
        ([(0.82, 1)], 0.85),
        ([(0.88, 1)], None),  # the ladder's top is the ceiling
        ([(0.88, -1), (0.85, 1)], None),  # 0.88 too large, 0.85 too small: no value left between
        ([(0.88, -1), (0.78, 1)], 0.82),  # up, but never back to or above the 0.88 that OOMed
        ([(0.85, -1), (0.78, 1), (0.82, -1)], None),
        ([(None, -1)], 0.88),  # fraction unknown: the highest allowed value
        ([(0.9, 0)], None),  # not a memory failure: final
        ([], None),
    ],
)
def test_next_fraction(failures: list[tuple[float | None, int]], expected: float | None) -> None:
    assert next_fraction(LADDER, failures) == expected


@pytest.mark.parametrize(
    ("kind", "ratio_sized", "direction"),
    [
        ("cuda_oom", False, -1),
        ("cuda_graph", False, -1),
        ("kv_memory", False, 1),
        ("host_memory", True, -1),
        ("host_memory", False, 0),
        ("scheduler_died", False, 0),
        ("gpu_unbalanced", False, 0),
        (None, False, 0),
    ],
)
def test_retry_direction(kind: str | None, ratio_sized: bool, direction: int) -> None:
    sizing = {"hicache_ratio": 2.0} if ratio_sized else {"hicache_size_gb": 64}
    cfg = ServerConfig.model_validate({"enable_hierarchical_cache": True, **sizing})
    assert retry_direction(kind, cfg) == direction


# --- real processes ----------------------------------------------------------------------------


def test_launch_waits_for_health_reads_kv_and_stop_kills_the_group(
    fake_cfg: ServerConfig, tmp_path: Path, shm_dir: Path
) -> None:
    stale = shm_dir / "sglang_loads_other_1234.shm"
    stale.write_text("")  # existed before the launch: never ours to remove
    handle, attempts = launch_with_ladder(with_env(fake_cfg, FAKE_KV="12345", FAKE_WARMUP_S="0.3"))
    child = int((tmp_path / "child.pid").read_text())
    in_use = (shm_dir / "sem.mp-in-use").open("w")  # new, but a live process (this one) holds it
    try:
        assert [(a.number, a.fraction, a.outcome, a.failure) for a in attempts] == [(1, None, "ready", None)]
        assert handle.max_total_num_tokens == 12345
        assert httpx.get(f"{handle.url}/health").status_code == 200
        assert handle.alive() and pid_alive(child)
        assert {p.name for p in shm_dir.iterdir()} == {
            stale.name,
            "sem.mp-in-use",
            f"sglang_loads_fake_{handle.pid}.shm",
            f"sem.mp-fake{handle.pid}",
        }
        handle.stop()
        assert not handle.alive() and not pid_alive(child)
        assert sorted(p.name for p in shm_dir.iterdir()) == ["sem.mp-in-use", stale.name]
    finally:
        handle.stop()
        in_use.close()
    assert attempts[0].log_path.parent == tmp_path / "logs"
    log = attempts[0].log_path.read_text()
    assert log.startswith("# datagen launch attempt 1 at ")
    assert "max_total_num_tokens=12345" in log


def test_oom_is_retried_down_the_ladder(fake_cfg: ServerConfig) -> None:
    cfg = with_env(fake_cfg, FAKE_OOM_ABOVE="0.83").model_copy(update={"mem_fraction_static": 0.9})
    handle, attempts = launch_with_ladder(cfg)
    with handle:
        assert [(a.fraction, a.outcome, a.failure_kind) for a in attempts] == [
            (0.9, "failed", "cuda_oom"),
            (0.88, "failed", "cuda_oom"),
            (0.85, "failed", "cuda_oom"),
            (0.82, "ready", None),
        ]
        assert handle.fraction == 0.82
        assert "CUDA out of memory" in attempts[0].log_path.read_text()
        assert len({a.log_path for a in attempts}) == 4


def test_an_oom_while_loading_the_weights_is_not_retried_down_the_ladder(fake_cfg: ServerConfig) -> None:
    """No fraction helps before the KV cache exists; each rung reloaded the weights for nothing."""
    cfg = with_env(fake_cfg, FAKE_OOM_LOADING="1").model_copy(update={"mem_fraction_static": 0.9})
    with pytest.raises(StartupFailed) as failed:
        launch_with_ladder(cfg)
    (attempt,) = failed.value.attempts
    assert attempt.failure_kind == "weights_oom"
    assert attempt.failure is not None and "no --mem-fraction-static helps" in attempt.failure.explanation


def test_kv_pool_failure_goes_up_and_auto_fraction_is_read_from_the_log(fake_cfg: ServerConfig) -> None:
    cfg = with_env(fake_cfg, FAKE_AUTO_FRACTION="0.5", FAKE_KV_BELOW="0.8")
    handle, attempts = launch_with_ladder(cfg)
    with handle:
        assert [(a.fraction, a.outcome, a.failure_kind) for a in attempts] == [
            (0.5, "failed", "kv_memory"),  # SGLang chose 0.5 (its server_args line says so)
            (0.78, "failed", "kv_memory"),
            (0.82, "ready", None),
        ]


def test_ladder_exhausted_raises_with_every_attempt(fake_cfg: ServerConfig) -> None:
    cfg = with_env(fake_cfg, FAKE_OOM_ABOVE="0.1").model_copy(
        update={"mem_fraction_static": 0.86, "mem_fraction_ladder": [0.84, 0.8]}
    )
    with pytest.raises(StartupFailed, match="after 3 attempt") as err:
        launch_with_ladder(cfg)
    assert [(a.fraction, a.failure_kind) for a in err.value.attempts] == [
        (0.86, "cuda_oom"),
        (0.84, "cuda_oom"),
        (0.8, "cuda_oom"),
    ]
    assert "CUDA out of memory" in str(err.value)


def test_unclassified_exit_is_not_retried(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    with pytest.raises(StartupFailed) as err:
        launch_with_ladder(with_env(fake_cfg, FAKE_EXIT="1"))
    assert [(a.outcome, a.failure) for a in err.value.attempts] == [("failed", None)]
    assert not pid_alive(int((tmp_path / "child.pid").read_text()))


def test_a_server_that_writes_nothing_is_not_quoted_as_the_launchers_header(
    fake_cfg: ServerConfig, tmp_path: Path
) -> None:
    """`python = "/bin/false"`: the failure quoted "its log ends with: # env overrides: (none)", the
    launcher's own header line, as if the server had said it."""
    python = tmp_path / "silent-python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    with pytest.raises(StartupFailed) as err:
        launch_with_ladder(fake_cfg.model_copy(update={"python": str(python)}))
    assert "env overrides" not in str(err.value) and "the server wrote no line" in str(err.value)


def test_never_healthy_times_out_and_is_stopped(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    cfg = with_env(fake_cfg, FAKE_HANG="1").model_copy(update={"startup_timeout_s": 0.5})
    with pytest.raises(StartupFailed) as err:
        launch_with_ladder(cfg)
    assert [a.outcome for a in err.value.attempts] == ["timeout"]
    assert not pid_alive(int((tmp_path / "child.pid").read_text()))


def test_sigterm_ignored_escalates_to_sigkill(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    cfg = with_env(fake_cfg, FAKE_IGNORE_TERM="1").model_copy(update={"stop_grace_s": 0.3})
    handle, _ = launch_with_ladder(cfg)
    child = int((tmp_path / "child.pid").read_text())
    began = time.monotonic()
    handle.stop()
    assert not handle.alive() and not pid_alive(child)
    assert time.monotonic() - began < 3
    handle.stop()  # idempotent


def test_api_key_reaches_the_server_but_never_the_log(
    fake_cfg: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SGLANG_KEY", "sk-very-secret")
    handle, attempts = launch_with_ladder(fake_cfg.model_copy(update={"api_key_env": "FAKE_SGLANG_KEY"}))
    with handle:
        # /get_server_info answers only with the key: the KV capacity proves it was sent
        assert handle.max_total_num_tokens == 4096
        ((record, _),) = read_records(fake_cfg.log_dir)  # nor the record of the running server
        assert "--api-key" in record.read_text() and "sk-very-secret" not in record.read_text()
    log = attempts[0].log_path.read_text()
    assert "--api-key '***'" in log or "--api-key ***" in log
    assert "'api_key': '***'" in log
    assert "sk-very-secret" not in log


def test_the_wait_for_a_started_server_sends_its_key_where_health_checks_it(
    fake_cfg: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang leaves /health open, but a server started through a wrapper that checks the key on
    every path (as a gateway's /health does) must still be seen to come up, not time out."""
    monkeypatch.setenv("FAKE_SGLANG_KEY", "sk-very-secret")
    cfg = with_env(fake_cfg, FAKE_KEY_ON_HEALTH="1").model_copy(
        update={"api_key_env": "FAKE_SGLANG_KEY", "startup_timeout_s": 3}
    )
    handle, attempts = launch_with_ladder(cfg)
    with handle:
        assert [a.outcome for a in attempts] == ["ready"]
    assert "sk-very-secret" not in attempts[0].log_path.read_text()


def test_missing_api_key_variable_is_named(fake_cfg: ServerConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(RuntimeError, match="NO_SUCH_KEY_VAR"):
        launch_with_ladder(fake_cfg.model_copy(update={"api_key_env": "NO_SUCH_KEY_VAR"}))


def test_kv_capacity_falls_back_to_the_log(fake_cfg: ServerConfig) -> None:
    handle, _ = launch_with_ladder(with_env(fake_cfg, FAKE_NO_INFO="1", FAKE_KV="777"))
    with handle:
        assert handle.max_total_num_tokens == 777


def test_busy_port_is_refused(fake_cfg: ServerConfig) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match="already in use"):
            launch_with_ladder(fake_cfg.model_copy(update={"port": port}))


def test_engine_restarts_a_dead_server_on_the_same_port(fake_cfg: ServerConfig) -> None:
    cfg = with_env(fake_cfg, FAKE_OOM_ABOVE="0.86").model_copy(
        update={"launch": True, "mem_fraction_static": 0.9}
    )
    with LaunchedEngine(cfg) as engine:
        first = engine.ensure_running()
        assert [a.fraction for a in first] == [0.9, 0.88, 0.85]
        url, handle = engine.url, engine.handle
        assert handle is not None
        starts: list[bool] = []  # whether a start was under way when it was said to begin

        def on_start() -> None:
            starts.append(engine.starting is not None)

        assert engine.ensure_running(on_start) == [] and starts == []  # alive: nothing to do
        os.killpg(handle.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while handle.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        again = engine.ensure_running(on_start)
        assert starts == [False]  # said once, as it began
        assert [(a.number, a.fraction, a.outcome) for a in again] == [(4, 0.85, "ready")]
        assert engine.url == url
        assert httpx.get(f"{url}/health").status_code == 200
        assert [a.number for a in engine.attempts] == [1, 2, 3, 4]
    assert not handle.alive()


def test_a_launched_servers_placement_is_read_from_its_env_and_its_logged_server_args(
    fake_cfg: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For the OOM guard in a container: [server] env over this process's, and the devices of the
    server_args the server logged (tp 1: its CUDA device 0)."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cfg = with_env(fake_cfg, CUDA_VISIBLE_DEVICES="5,6").model_copy(update={"launch": True})
    with LaunchedEngine(cfg) as engine:
        engine.ensure_running()
        assert engine.placement() == Placement((0,), "5,6", pci_order=True)


def test_a_server_out_of_memory_while_serving_restarts_below_the_fraction_sglang_chose(
    fake_cfg: ServerConfig,
) -> None:
    """No fraction given: SGLang chose 0.874 (its server_args line says so) and ran out of memory while
    serving; restarting it at its own choice again would only run out of memory again."""
    cfg = with_env(fake_cfg, FAKE_AUTO_FRACTION="0.874", FAKE_SERVING_OOM_ABOVE="0.86")
    with LaunchedEngine(cfg.model_copy(update={"launch": True})) as engine:
        assert [(a.fraction, a.outcome) for a in engine.ensure_running()] == [(None, "ready")]
        handle = engine.handle
        assert handle is not None
        deadline = time.monotonic() + 10
        while handle.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(a.fraction, a.outcome) for a in engine.ensure_running()] == [(0.85, "ready")]
        assert handle.fraction == 0.85


def test_a_server_out_of_memory_while_serving_with_no_rung_below_is_not_restarted_to_fail_again(
    fake_cfg: ServerConfig,
) -> None:
    cfg = with_env(fake_cfg, FAKE_AUTO_FRACTION="0.874", FAKE_SERVING_OOM_ABOVE="0.86")
    with LaunchedEngine(cfg.model_copy(update={"launch": True, "mem_fraction_ladder": [0.9]})) as engine:
        engine.ensure_running()
        handle = engine.handle
        assert handle is not None
        deadline = time.monotonic() + 10
        while handle.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(StartupFailed, match="CUDA out of memory") as failed:
            engine.ensure_running()
        assert [(a.fraction, a.failure_kind) for a in failed.value.attempts] == [(0.874, "cuda_oom")]


def test_probe_reads_health_and_kv_capacity_of_a_running_server(fake_cfg: ServerConfig) -> None:
    with launch_with_ladder(with_env(fake_cfg, FAKE_KV="2048"))[0] as handle:
        assert is_healthy(handle.url)
        assert kv_capacity(server_info(handle.url, None)) == 2048
    assert not is_healthy(handle.url)
    assert server_info(handle.url, None) is None
    assert kv_capacity(None) is None


def test_cli_check_starts_reports_and_stops(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        f'[server]\npython = "{fake_cfg.python}"\nmodel_path = "/models/fake"\nhealth_poll_s = 0.05\n'
        f'log_dir = "{tmp_path / "logs"}"\n'
    )
    env_flags = [f"--env={k}={v}" for k, v in with_env(fake_cfg, FAKE_OOM_ABOVE="0.86").env.items()]
    sigterm_before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(
        app, ["--config", str(config), "--mem-fraction-static", "0.9", "--check", *env_flags]
    )
    assert result.exit_code == 0, result.output
    assert "cuda_oom" in result.output and "serving at http://127.0.0.1:" in result.output
    assert "KV capacity 4096 tokens" in result.output
    assert not pid_alive(int((tmp_path / "child.pid").read_text()))
    assert signal.getsignal(signal.SIGTERM) is sigterm_before


def test_cli_says_the_launchers_warnings_as_warning_lines(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    """`datagen launch` shows what the launcher tells the person (here a server that ignored
    SIGTERM when stopped) as the CLI's other warnings: a `warning:` line, not a bare log message."""
    env = with_env(fake_cfg, FAKE_IGNORE_TERM="1").env
    config = tmp_path / "run.toml"
    config.write_text(
        f'[server]\npython = "{fake_cfg.python}"\nmodel_path = "/models/fake"\nhealth_poll_s = 0.05\n'
        f'stop_grace_s = 1\nlog_dir = "{fake_cfg.log_dir}"\n[server.env]\n'
        + "".join(f'{name} = "{value}"\n' for name, value in env.items())
    )
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "launch", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (pid,) = [
        int(line.split("(pid ")[1].split(",")[0]) for line in done.stdout.splitlines() if "(pid " in line
    ]
    said = f"warning: server pid {pid} ignored SIGTERM for 1s; sending SIGKILL"
    assert said in done.stderr.splitlines(), done.stderr


def test_cli_refuses_invalid_settings(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--hicache-size-gb", "8", "--log-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "need enable_hierarchical_cache" in result.output


def test_cli_reports_a_failed_start(fake_cfg: ServerConfig, tmp_path: Path) -> None:
    env_flags = [f"--env={k}={v}" for k, v in with_env(fake_cfg, FAKE_EXIT="1").env.items()]
    args = ["--python", str(fake_cfg.python), "--model-path", "m", "--log-dir", str(tmp_path), *env_flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "server did not start after 1 attempt(s); last failed" in result.output


def test_simulator_runs_behind_the_same_engine_interface(tmp_path: Path) -> None:
    cfg = ServerConfig(
        launch=True,
        engine="simulator",
        served_model_name="sim",
        max_total_tokens=4096,
        context_length=1024,
        max_running_requests=8,
        extra_args=["--startup-delay-s", "0.2", "--time-scale", "0.01"],
        health_poll_s=0.05,
        startup_timeout_s=30,
        log_dir=tmp_path,
    )
    with LaunchedEngine(cfg) as engine:
        assert [a.outcome for a in engine.ensure_running()] == ["ready"]
        assert engine.max_total_num_tokens == 4096
        chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = httpx.post(f"{engine.url}/v1/chat/completions", json=chat, timeout=10).json()
        assert answer["model"] == "sim" and 1 <= answer["usage"]["completion_tokens"] <= 4
        handle = engine.handle
        assert handle is not None
    assert not handle.alive()


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:30000"),
        ("0.0.0.0", "http://127.0.0.1:30000"),
        ("gpu-7", "http://gpu-7:30000"),
        ("::", "http://[::1]:30000"),
        ("fd00::7", "http://[fd00::7]:30000"),
    ],
)
def test_server_url_reaches_a_wildcard_bind_over_loopback(host: str, url: str) -> None:
    assert server_url(host, 30000) == url


def test_a_free_ipv6_port_is_free_and_a_taken_one_refused() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match="already in use"):
            launcher._check_port_free("::1", taken.getsockname()[1])
    launcher._check_port_free("::1", free_port())


def test_launch_config_logs_go_to_the_run_directory_unless_told(tmp_path: Path) -> None:
    from flows.cli.launch import load_server_section

    config = tmp_path / "run.toml"
    config.write_text('[run]\nname = "r1"\noutput_dir = "out"\n[server]\nmodel_path = "m"\n')
    assert load_server_section(config)["log_dir"] == Path("out") / "r1" / "server-logs"
    config.write_text('[run]\nname = "r1"\n[server]\nmodel_path = "m"\nlog_dir = "/var/log/x"\n')
    assert load_server_section(config)["log_dir"] == "/var/log/x"


def test_stop_returns_when_the_server_cannot_be_killed(
    tmp_path: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader stuck in the kernel (a driver, NFS) outlives SIGKILL: waiting for it without a bound
    froze Ctrl-C of the run that launched it."""
    monkeypatch.setattr(launcher, "_KILL_WAIT_S", 0.2)
    process = launcher.ServerProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "l.log", "", 30000
    )
    monkeypatch.setattr(launcher, "_signal_group", lambda pgid, sig: None)  # the signals do not take
    try:
        started = time.monotonic()
        process.stop(0.1)
        assert time.monotonic() - started < 5
        assert "did not exit even after SIGKILL" in caplog.text
    finally:
        process.popen.kill()
        process.popen.wait()


# --- a server that a killed run left behind -------------------------------------------------------

ORCHESTRATOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sglang_launch import launcher
    from sglang_launch.server_config import ServerConfig

    launcher._SHM_DIR = Path(sys.argv[2])
    handle, _ = launcher.launch_with_ladder(ServerConfig.model_validate_json(Path(sys.argv[1]).read_text()))
    print(handle.pid, handle.port, flush=True)
    time.sleep(600)
    """
)


def _killed_run(cfg: ServerConfig, tmp_path: Path, shm_dir: Path) -> tuple[int, int]:
    """Launch `cfg` from another process and kill -9 that process once the server serves: the
    server's (pid, port), which outlives it in its own session."""
    (tmp_path / "server.json").write_text(cfg.model_dump_json())
    (tmp_path / "orchestrator.py").write_text(ORCHESTRATOR)
    run = subprocess.Popen(
        [sys.executable, str(tmp_path / "orchestrator.py"), str(tmp_path / "server.json"), str(shm_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None
        pid, port = map(int, run.stdout.readline().split())
    finally:
        run.kill()  # kill -9: none of the run's own clean-up runs
        run.wait()
        assert run.stdout is not None
        run.stdout.close()
    return pid, port


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def test_a_server_that_a_killed_run_left_is_stopped_before_the_next_start(
    fake_cfg: ServerConfig, tmp_path: Path, shm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The orphan held ~88 % of every GPU: a second server beside it fails for memory or starts with
    a tiny KV cache. The next start of the same run stops it first, its whole group."""
    orphan, port = _killed_run(fake_cfg, tmp_path, shm_dir)
    try:
        orphan_child = int((tmp_path / "child.pid").read_text())
        assert pid_alive(orphan) and pid_alive(orphan_child)  # the kill -9 left the server running
        with caplog.at_level(logging.INFO, logger="sglang_launch.launcher"):
            handle, _ = launch_with_ladder(fake_cfg)
        with handle:
            assert not pid_alive(orphan) and not pid_alive(orphan_child)
            assert handle.pid != orphan and is_healthy(handle.url)
        assert f"stopping the SGLang server pid {orphan} that a killed run left on port {port}" in caplog.text
        assert not any(name.startswith(f"sglang_loads_fake_{orphan}") for name in os.listdir(shm_dir))
    finally:
        _kill_group(orphan)


def test_a_server_is_recorded_while_it_runs_and_the_record_goes_when_it_is_stopped(
    fake_cfg: ServerConfig,
) -> None:
    handle, _ = launch_with_ladder(fake_cfg)
    with handle:
        ((_, record),) = read_records(fake_cfg.log_dir)
        assert (record.server.pid, record.pgid, record.port) == (handle.pid, handle.pid, handle.port)
        assert record.server == ProcessId.of(handle.pid) and record.owner == ProcessId.of(os.getpid())
    assert read_records(fake_cfg.log_dir) == []


def test_a_server_whose_launcher_lives_is_not_taken_for_an_orphan(fake_cfg: ServerConfig) -> None:
    """Another part of the run, or a `datagen launch` in another terminal, still serves with it."""
    first, _ = launch_with_ladder(fake_cfg)
    with first:
        second, _ = launch_with_ladder(fake_cfg)
        with second:
            assert first.alive() and is_healthy(first.url)
            assert len(read_records(fake_cfg.log_dir)) == 2


def _record(victim: int, log_dir: Path, **changes: object) -> Path:
    """A record naming the process `victim` (as its launcher would), launched by a dead process."""
    launcher_pid = subprocess.Popen([sys.executable, "-c", ""])
    owner = ProcessId.of(launcher_pid.pid)
    launcher_pid.wait()
    server = ProcessId.of(victim)
    assert owner is not None and server is not None
    fields: dict[str, object] = {"server": server, "pgid": victim, "port": 1, "argv": [], "owner": owner}
    record = ServerRecord.model_validate({**fields, "shm_before": [], **changes})
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"launched-server-{victim}.json"
    path.write_text(record.model_dump_json())
    return path


@pytest.mark.parametrize(
    ("change", "record_stays"),
    [
        ("start_ticks", False),  # the pid was reused by another process: the record is stale
        ("machine", True),  # another node or container: nothing about it can be proved here
    ],
)
def test_a_process_that_is_not_provably_the_recorded_server_is_never_signalled(
    fake_cfg: ServerConfig, change: str, record_stays: bool
) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        server = ProcessId.of(victim.pid)
        assert server is not None
        other = {"start_ticks": server.start_ticks - 1, "machine": "another-boot pid:[1]"}[change]
        path = _record(victim.pid, fake_cfg.log_dir, server=server.model_copy(update={change: other}))
        with launch_with_ladder(fake_cfg)[0]:
            assert victim.poll() is None
        assert path.exists() == record_stays
    finally:
        victim.kill()
        victim.wait()
