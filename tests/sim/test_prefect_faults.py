"""Prefect failing never costs a row: a temporary server that will not start, an API down or gone;
and Prefect's temporary server never outlives the run that started it, however the run ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from forked_runs import alive
from pipeline_support import (
    check_run,
    children,
    datagen,
    kill_group,
    rows_on_disk,
    wait_for_rows,
    write_config,
    write_prompts,
)

from sglang_launch.ports import free_port
from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
NOT_UPDATED = "the Prefect UI is not"
TEMPORARY_SERVER = b"prefect.server.api.server:create_app"
STOP_BOUND_S = 20.0  # measured: about 2 s on the 2 shared cores; generous for a loaded CI box
UVICORN_ARGS = ("--host", "127.0.0.1", "--log-level", "error")
ORPHAN_BOUND_S = 10.0  # how long the temporary server may outlive a run killed with SIGKILL


def _without_prefect_api(home: Path, **extra: str) -> dict[str, str]:
    """The test's own Prefect home, and no PREFECT_API_URL inherited from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(home), **extra}


def _config(tmp_path: Path, name: str, url: str, prompts: int, extra: str = "") -> Path:
    write_prompts(tmp_path / "p.jsonl", prompts)
    return write_config(
        tmp_path / "run.toml",
        name=name,
        output_dir=tmp_path,
        url=url,
        source=tmp_path / "p.jsonl",
        extra=extra,
    )


def test_a_temporary_server_that_will_not_start_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """Its database cannot be opened, so it never answers: retried once, then a line, no traceback."""
    config = _config(tmp_path, "nop", "http://127.0.0.1:9", 5)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = _without_prefect_api(
        tmp_path / "prefect-home",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="2",
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{blocker}/prefect.db",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(config)], env=env, capture_output=True, timeout=180
    )
    err = proc.stderr.decode()
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "temporary API server did not start (2 tries" in lines[0]
    assert "--no-prefect" in lines[0] and "PREFECT_API_URL" in lines[0]
    server_log = tmp_path / "prefect-home" / "temporary-server.log"  # the second try's output
    assert f"its output: {server_log})" in lines[0] and server_log.is_file()
    assert server_log.with_name(f"{server_log.name}.1").is_file()  # the first try's, kept beside it
    assert not (tmp_path / "nop" / "manifest.json").exists()  # nothing was started or written


def test_a_configured_api_that_is_down_says_so_once_and_the_run_completes(tmp_path: Path) -> None:
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = _config(tmp_path, "down", sim.url, 60)
        env = _without_prefect_api(tmp_path / "home", PREFECT_API_URL=f"http://127.0.0.1:{free_port()}/api")
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(config)], env=env, capture_output=True, timeout=180
        )
    text = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, text[-3000:]
    assert text.count(NOT_UPDATED) == 1 and "Traceback" not in text
    check = check_run(tmp_path / "down")
    assert len(check.row_ids) == 60 and check.duplicates == 0


def test_ctrl_c_in_a_terminal_stops_the_run_and_then_the_temporary_server_with_one_line(
    tmp_path: Path,
) -> None:
    """A terminal's Ctrl-C is SIGINT to its whole foreground process group. Before, that group held
    Prefect's temporary server too: it died under the run, whose task runs then failed to report,
    and the terminal got a screen of "Crash detected!" and EventsWorker lines, the resume line after
    7 s and the exit after 15 s to 2 minutes (Prefect draining its logs into a dead API)."""
    with SimulatorProcess(SimConfig(**{**FAST, "time_scale": 0.3})) as sim:
        config = _config(tmp_path, "ctrlc", sim.url, 2000)
        run = datagen("run", str(config), env=_without_prefect_api(tmp_path / "home"))
        try:
            wait_for_rows(tmp_path / "ctrlc", 1, run, timeout_s=180)
            (server,) = children(run.pid, TEMPORARY_SERVER)
            sent = time.monotonic()
            os.killpg(run.pid, signal.SIGINT)  # what the terminal does: the run's whole group
            out, _ = run.communicate(timeout=60)
            stopped_s = time.monotonic() - sent
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    text = out.decode()
    assert run.returncode == 130, text[-3000:]
    assert stopped_s < STOP_BOUND_S, f"took {stopped_s:.1f} s to stop:\n{text[-3000:]}"
    lines = [line for line in text.splitlines() if "level=" in line or line.startswith("error:")]
    assert lines == ["error: interrupted: finished rows are saved; run the same command again to resume."]
    assert "Traceback" not in text and "Crash detected" not in text
    assert not Path(f"/proc/{server}").exists(), "the temporary server outlived the run"
    check = check_run(tmp_path / "ctrlc")
    assert check.duplicates == 0 and check.corrupt_files == [] and 0 < len(check.row_ids) < 2000
    print(f"Ctrl-C with the temporary server: exit 130 {stopped_s:.2f} s after the signal")


@pytest.mark.parametrize("prefect", [True, False], ids=["prefect", "no-prefect"])
def test_a_source_that_cannot_be_read_is_one_line_with_and_without_prefect(
    tmp_path: Path, prefect: bool
) -> None:
    """A Hub category offline (the README's example config without internet) beside a local one.
    Before, under Prefect the terminal got each flow run's copy of the ``SourceError`` traceback
    (``prefect.flow_runs`` at ERROR, 36-53 lines) above the one line; they stay in the flow run's
    logs in the API, which is where the UI shows them."""
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        hub = '[[categories]]\nname = "hub"\nsource = "some-org/some-dataset"\nformat = "messages"\n'
        config = _config(tmp_path, "src", sim.url, 5, extra=hub)
        offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(config), *([] if prefect else ["--no-prefect"])],
            env=_without_prefect_api(tmp_path / "home", **offline),
            capture_output=True,
            timeout=180,
        )
    text = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 2, text[-3000:]
    lines = [line for line in text.splitlines() if "level=" in line or line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: category hub: cannot read some-org/some-dataset")
    assert "Traceback" not in text
    assert len(check_run(tmp_path / "src").row_ids) == 5  # the local category still ran


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real Prefect API server (no UI) on a free loopback port, with its own database."""
    port = free_port()
    env = _without_prefect_api(home, PREFECT_UI_ENABLED="0", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    argv = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"]
    server = subprocess.Popen(
        [*argv, *UVICORN_ARGS, "--port", str(port)],
        env=env,
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            assert server.poll() is None, "the Prefect server exited while starting"
            time.sleep(0.2)
        yield api, server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


@pytest.mark.slow
def test_the_api_going_away_mid_run_costs_no_row_and_is_said_once(tmp_path: Path) -> None:
    with SimulatorProcess(SimConfig(**FAST)) as sim, prefect_api(tmp_path / "home") as (api, server):
        config = _config(tmp_path, "gone", sim.url, 1500)
        run = datagen(
            "run", str(config), env={"PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "home")}
        )
        try:
            before = wait_for_rows(tmp_path / "gone", 100, run, timeout_s=180)
            os.killpg(server.pid, signal.SIGKILL)
            out, _ = run.communicate(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    text = out.decode()
    assert run.returncode == 0, text[-3000:]
    assert text.count(NOT_UPDATED) == 1 and "Traceback" not in text
    check = check_run(tmp_path / "gone")
    assert before < 1500 and len(check.row_ids) == 1500 and check.duplicates == 0


def _kill_process(pid: int) -> None:
    """``kill -9 PID``: the run's process alone."""
    os.kill(pid, signal.SIGKILL)


def _kill_process_group(pid: int) -> None:
    """SIGKILL to the run's whole process group, as a closing terminal does (SIGHUP, then nothing)."""
    os.killpg(pid, signal.SIGKILL)


def _port_of(server: int) -> int:
    """The port in the temporary server's command line (Prefect picks one at random, 8000-8999)."""
    argv = Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--port") + 1])


def _listened_on(port: int) -> bool:
    """Whether a socket listens on ``port``: a new server (uvicorn binds with SO_REUSEADDR, which a
    closed server's lingering connections do not block) could not take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _temporary_servers(home: Path) -> list[int]:
    """The live temporary servers of Prefect home ``home``, whoever their parent is now (a killed
    run's server is adopted by init)."""
    mine = b"\0PREFECT_HOME=" + bytes(home) + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ours = TEMPORARY_SERVER in (proc / "cmdline").read_bytes()
            ours = ours and mine in b"\0" + (proc / "environ").read_bytes()
        except OSError:
            continue
        if ours and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def _killed_mid_run(
    args: list[str], env: dict[str, str], run_dir: Path, kill: Callable[[int], None]
) -> float:
    """One life of `datagen ARGS` under the temporary server, killed by ``kill(pid)`` once its rows
    reach disk; returns the seconds its server lived on."""
    before = rows_on_disk(run_dir)
    run = datagen(*args, env=env)
    try:
        wait_for_rows(run_dir, before + 50, run, timeout_s=180)
        (server,) = children(run.pid, TEMPORARY_SERVER)
        port = _port_of(server)
        assert _listened_on(port)
        kill(run.pid)
        killed = time.monotonic()
        while alive(server) and time.monotonic() - killed < ORPHAN_BOUND_S:
            time.sleep(0.05)
        lived_s = time.monotonic() - killed
    finally:
        kill_group(run)
    assert not alive(server), (
        f"the temporary server (pid {server}) outlived the killed run by {lived_s:.0f} s"
    )
    assert not _listened_on(port), f"port {port} still taken after the temporary server exited"
    return lived_s


@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaves_no_temporary_server_and_the_same_command_finishes(
    tmp_path: Path,
) -> None:
    """The temporary server runs in its own session (for Ctrl-C, above), out of reach of a SIGKILL to
    the run's process group: an orphan would hold its port and Prefect's database for ever, one more
    per killed scheduled run. Linux sends it SIGTERM when the run dies (its death signal). A first
    life is killed alone (``kill -9 PID``), a second with its whole group (a terminal closing); each
    time the server must exit within seconds and free its port, and the same command start a new
    server (no port in use, no lock left) and finish with every prompt once."""
    home = tmp_path / "home"
    try:
        with SimulatorProcess(SimConfig(**{**FAST, "time_scale": 0.1})) as sim:
            config = _config(tmp_path, "killed", sim.url, 1500)
            env = _without_prefect_api(home)
            run_dir = tmp_path / "killed"
            alone_s, group_s = (
                _killed_mid_run(["run", str(config)], env, run_dir, kill)
                for kill in (_kill_process, _kill_process_group)
            )
            partial = check_run(run_dir)
            last = datagen("run", str(config), env=env)
            try:
                out, _ = last.communicate(timeout=300)
            finally:
                kill_group(last)
    finally:  # a failure leaves no server behind either
        for server in _temporary_servers(home):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server, signal.SIGKILL)  # the leader of a session of its own
    text = out.decode()
    assert last.returncode == 0, text[-3000:]
    assert 0 < len(partial.row_ids) < 1500 and partial.duplicates == 0
    final = check_run(run_dir)
    assert len(final.row_ids) == 1500 and final.duplicates == 0 and final.corrupt_files == []
    assert "were already done" in text and "Traceback" not in text
    server_output = (home / "temporary-server.log").read_text()
    assert "address already in use" not in server_output and "database is locked" not in server_output
    print(
        f"temporary server gone {alone_s:.2f} s after kill -9 PID, {group_s:.2f} s after kill -9 of the group"
    )
