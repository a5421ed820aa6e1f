"""`datagen deploy` served from a subprocess against a real `prefect server start` (marker `prefect`).

Firings of an interval schedule resume one run (a source that grows between firings gets only its
new prompts answered, no id twice, then "nothing left to do"); a firing while the run directory is
locked ends Completed "skipped: run X is busy"; `--fresh-run-names` makes a new run per firing, one
at a time without a Prefect concurrency limit (a firing due meanwhile ends "skipped: previous firing
still running").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ApiPost, prefect_api
from pipeline_support import (
    check_run,
    datagen,
    every_request_hung,
    kill_group,
    never_flush,
    rows_on_disk,
    write_config,
    write_prompts,
)

from flows.config import load_config
from flows.orchestration.deploy import SCHEDULED_FLOW, firing_lock
from flows.orchestration.server import PrefectServer
from flows.store.run_lock import RunLock
from sglang_launch.simulator import SimConfig, SimulatorProcess

pytestmark = pytest.mark.prefect

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
INTERVAL_S = "3"
FRESH_INTERVAL_S = "15"
"""Fresh runs: each firing due while the last runs starts a process to skip; every 3 s, on 2 shared
cores, those processes slowed a 10-prompt run to 3 minutes."""
PATIENCE_S = 240
"""Per step; a firing takes ~15 s on an idle 2-core machine, 50 s when other suites share it."""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(SimConfig(**FAST)) as running:
        yield running


def _firings(api_post: ApiPost, deployment: str) -> list[dict[str, object]]:
    """Flow runs of the scheduled flow's deployment ``deployment`` (any state)."""
    body = {"flows": {"name": {"any_": [SCHEDULED_FLOW]}}, "deployments": {"name": {"any_": [deployment]}}}
    return api_post("flow_runs/filter", body)


def _deployments(api_post: ApiPost, name: str) -> list[dict[str, object]]:
    return api_post("deployments/filter", {"deployments": {"name": {"any_": [name]}}})


def _messages(api_post: ApiPost) -> list[str]:
    return [str(entry["message"]) for entry in api_post("logs/filter", {"logs": {"level": {"ge_": 20}}})]


def _until(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"`datagen deploy` exited before {what}:\n{out[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}")


@contextlib.contextmanager
def _served(
    config: Path, server: PrefectServer, *extra: str, schedule: tuple[str, str] = ("--interval", INTERVAL_S)
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        "PREFECT_API_URL": server.api_url,
        "PREFECT_HOME": str(server.home),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",  # the runner looks for due firings every second (default 10)
    }
    proc = datagen("deploy", str(config), *schedule, *extra, env=env)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_group(proc)


def _config(tmp_path: Path, name: str, url: str, prompts: int) -> Path:
    source = tmp_path / f"{name}.jsonl"
    write_prompts(source, prompts)
    return write_config(tmp_path / f"{name}.toml", name=name, output_dir=tmp_path, url=url, source=source)


def test_firings_resume_one_run_and_skip_while_it_is_busy(
    tmp_path: Path, server: PrefectServer, sim: SimulatorProcess, api_post: ApiPost
) -> None:
    config = _config(tmp_path, "sched", sim.url, 40)
    run_dir = tmp_path / "sched"
    lock = RunLock(run_dir)
    lock.acquire()  # a run "in progress": the first firing must leave it alone
    with _served(config, server) as proc:
        try:

            def skipped() -> bool:
                return any(
                    r["state_type"] == "COMPLETED"
                    and str(r["state"]["message"]).startswith("skipped: run sched is busy")
                    for r in _firings(api_post, "sched")
                )

            _until("a firing skipped on the busy run", skipped, proc, PATIENCE_S)
        finally:
            lock.release()
        assert rows_on_disk(run_dir) == 0, "a skipped firing writes nothing"
        _until("the first 40 rows", lambda: rows_on_disk(run_dir) == 40, proc, PATIENCE_S)
        more = tmp_path / "more.jsonl"
        write_prompts(more, 20, tag="q")  # the source grows between firings
        with (tmp_path / "sched.jsonl").open("a", encoding="utf-8") as source:
            source.write(more.read_text(encoding="utf-8"))
        _until("the 20 new prompts answered", lambda: rows_on_disk(run_dir) == 60, proc, PATIENCE_S)
        done = "nothing left to do: run sched has 60 rows"
        _until(
            "a firing with nothing left to do",
            lambda: any(m.startswith(done) for m in _messages(api_post)),
            proc,
            PATIENCE_S,
        )
        # read before the Ctrl-C that ends the test: it stops (Crashes) a firing still running, by design
        firings = _firings(api_post, "sched")
    said = proc.stdout.read().decode() if proc.stdout else ""
    assert "stopped serving deployment datagen-scheduled/sched" in said, said[-2000:]  # was silent
    (deployment,) = _deployments(api_post, "sched")
    assert deployment["paused"], "the line says the schedule is paused: Prefect's serve pauses it"
    check = check_run(run_dir)
    assert len(check.row_ids) == 60 and check.duplicates == 0 and not check.corrupt_files

    ended = [r for r in firings if r["state_type"] not in ("SCHEDULED", "PENDING", "RUNNING")]
    assert {r["state_type"] for r in ended} <= {"COMPLETED", "CANCELLED"}, [
        (r["name"], r["state_type"], r["state"]["message"])
        for r in ended
        if r["state_type"] not in ("COMPLETED", "CANCELLED")
    ]
    messages = _messages(api_post)
    assert any(m.startswith("skipped: run sched is busy") and "in use by another" in m for m in messages)
    assert any("run sched resumed in" in m and "40 prompts already done are skipped" in m for m in messages)


def test_fresh_run_names_make_a_new_run_per_firing_and_one_at_a_time_without_a_lease(
    tmp_path: Path, server: PrefectServer, sim: SimulatorProcess, api_post: ApiPost
) -> None:
    """Each firing a new run, never two at once on the servers, and no Prefect concurrency limit: its
    lease cancelled a firing of days when the API was away minutes. A firing due while the last one
    runs ends Completed "skipped: previous firing still running" and starts no run (before: the
    server Cancelled it, "Deployment concurrency limit reached")."""
    config = _config(tmp_path, "fresh", sim.url, 10)

    def complete_runs() -> list[Path]:
        return [d for d in tmp_path.glob("fresh-*") if d.is_dir() and rows_on_disk(d) == 10]

    def skipped() -> bool:
        return any(
            r["state_type"] == "COMPLETED"
            and str(r["state"]["message"]).startswith("skipped: previous firing still running (pid ")
            for r in _firings(api_post, "fresh")
        )

    def registered() -> bool:
        return bool(_deployments(api_post, "fresh"))

    held = firing_lock(load_config(config), None)
    held.acquire()  # the previous firing, still running
    with _served(config, server, "--fresh-run-names", schedule=("--interval", FRESH_INTERVAL_S)) as proc:
        try:
            _until("the deployment registered", registered, proc, PATIENCE_S)
            (deployment,) = _deployments(api_post, "fresh")
            limit = deployment["global_concurrency_limit"]  # "concurrency_limit" is always None
            assert limit is None and deployment["concurrency_options"] is None, limit
            _until("a firing skipped while the last one runs", skipped, proc, PATIENCE_S)
            assert not list(tmp_path.glob("fresh-*")), "a skipped firing starts no run"
        finally:
            held.release()
        _until("two complete fresh runs", lambda: len(complete_runs()) >= 2, proc, PATIENCE_S)
        firings = _firings(api_post, "fresh")  # before the Ctrl-C, which stops a firing still running
    assert not (tmp_path / "fresh").exists(), "the configured name itself is never written"
    for run_dir in complete_runs():
        check = check_run(run_dir)
        assert len(check.row_ids) == 10 and check.duplicates == 0
        stamp = run_dir.name.removeprefix("fresh-")
        assert len(stamp) in (14, 16) and stamp.endswith("Z") and stamp[8] == "T", run_dir.name
    ended = [(r["name"], r["state_type"], r["state"]["message"]) for r in firings]
    assert all(state in ("COMPLETED", "SCHEDULED", "PENDING", "RUNNING") for _, state, _ in ended), ended


def test_a_firing_cancelled_from_the_ui_flushes_every_answer_it_read(
    tmp_path: Path, server: PrefectServer, api_post: ApiPost
) -> None:
    """Cancel in the UI: the flow run goes Cancelling, the serving process sends the firing SIGTERM
    and SIGKILL after a grace. The firing must stop in order within the grace: every answer read on
    disk (rows reach it here only through the final flush), its line logged, the firing Cancelled."""
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = _config(tmp_path, "cancelled", sim.url, 1000)
        never_flush(config)
        with _served(config, server, schedule=("--cron", "0 0 1 1 *")) as proc:
            _until("the deployment registered", lambda: bool(_deployments(api_post, "cancelled")), proc, 60)
            (deployment,) = _deployments(api_post, "cancelled")
            url = f"{server.api_url}/deployments/{deployment['id']}/create_flow_run"
            created = prefect_api("POST", url, json={})
            created.raise_for_status()
            firing = f"{server.api_url}/flow_runs/{created.json()['id']}"
            _until("60 answers", lambda: sim.stats()["requests_completed"] >= 60, proc, PATIENCE_S)
            sim.set_faults(extra_latency_s=60.0)  # from now on every request hangs for a minute
            _until("every request of the run hung", lambda: every_request_hung(sim), proc, 60)
            answered = sim.stats()["requests_completed"]
            cancelling = {"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True}
            prefect_api("POST", f"{firing}/set_state", json=cancelling).raise_for_status()

            def cancelled() -> bool:
                return prefect_api("GET", firing).json()["state_type"] == "CANCELLED"

            _until("the firing Cancelled", cancelled, proc, PATIENCE_S)
    saved = check_run(tmp_path / "cancelled")
    assert saved.duplicates == 0 and saved.corrupt_files == []
    assert len(saved.row_ids) + len(saved.reject_ids) == answered, "every answer read is on disk"
    assert (tmp_path / "cancelled" / "report.md").exists()
    stopped = "stopped by SIGTERM: run cancelled's finished rows are saved"
    assert any(m.startswith(stopped) for m in _messages(api_post))


def test_a_deployment_on_a_work_pool_is_run_by_a_worker_started_elsewhere(
    tmp_path: Path, server: PrefectServer, sim: SimulatorProcess, api_post: ApiPost
) -> None:
    api = server.api_url
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(server.home)}
    source = tmp_path / "pooled.jsonl"
    write_prompts(source, 10)
    here = tmp_path / "deployed-from"
    here.mkdir()
    config = write_config(
        here / "pooled.toml", name="pooled", output_dir=Path("out"), url=sim.url, source=source
    )
    registered = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "deploy",
            "pooled.toml",
            "--cron",
            "0 0 1 1 *",
            "--pool",
            "datagen-pool",
        ],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        check=False,
    )
    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert "prefect worker start --pool datagen-pool" in registered.stderr  # the console writes to stderr

    (pool,) = api_post("work_pools/filter", {"work_pools": {"name": {"any_": ["datagen-pool"]}}})
    assert pool["type"] == "process"
    (deployment,) = api_post("deployments/filter", {"deployments": {"name": {"any_": ["pooled"]}}})
    assert deployment["entrypoint"] == "flows.orchestration.deploy.scheduled_run"
    assert deployment["parameters"] == {
        "config_path": str(config.resolve()),
        "fresh_run_names": False,
        "part": None,
    }
    started = prefect_api("POST", f"{api}/deployments/{deployment['id']}/create_flow_run", json={})
    started.raise_for_status()

    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    worker = subprocess.run(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "datagen-pool", "--run-once"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        check=False,
    )
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]
    check = check_run(here / "out" / "pooled")  # the relative output_dir is where `deploy` ran
    assert len(check.row_ids) == 10 and check.duplicates == 0
    run = prefect_api("GET", f"{api}/flow_runs/{started.json()['id']}").json()
    assert run["state_type"] == "COMPLETED"
    assert run["state"]["message"] == "run pooled now has 10 rows and 0 rejects (+10 rows in this firing)"
