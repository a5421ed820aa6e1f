"""Prefect failing never costs a row: a temporary server that will not start, an API down or gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pipeline_support import check_run, children, datagen, wait_for_rows, write_config, write_prompts

from sglang_launch.ports import free_port
from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
NOT_UPDATED = "the Prefect UI is not"
TEMPORARY_SERVER = b"prefect.server.api.server:create_app"
STOP_BOUND_S = 20.0  # measured: about 2 s on the 2 shared cores; generous for a loaded CI box
UVICORN_ARGS = ("--host", "127.0.0.1", "--log-level", "error")


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
