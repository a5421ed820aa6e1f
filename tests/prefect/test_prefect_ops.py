"""Against a real `prefect server start` (marker `prefect`, run by `.ci/run`): what the UI's API holds.

A run killed with kill -9 leaves its flow run Running; the same command marks it Crashed and runs in
that same flow run again, exactly once. Each artifact key is one card, updated in place, and its
numbers are the files' numbers. Run-level events are Prefect logs at INFO.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import prefect_api
from pipeline_support import check_run, datagen, kill_group, wait_for_rows, write_config, write_prompts

from flows.orchestration.server import PrefectServer
from sglang_launch.simulator import SimConfig, SimulatorProcess

pytestmark = pytest.mark.prefect

FAST = {"time_scale": 0.3, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}


def test_kill_9_is_marked_crashed_and_the_same_command_retries_that_flow_run(
    tmp_path: Path, server: PrefectServer, api_post: Any
) -> None:
    api = server.api_url
    env = {"PREFECT_API_URL": api, "PREFECT_HOME": str(server.home)}
    source = tmp_path / "p.jsonl"
    write_prompts(source, 600)
    config = write_config(tmp_path / "k.toml", name="killtest", output_dir=tmp_path, url="", source=source)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config.write_text(config.read_text().replace('url = ""', f'url = "{sim.url}"'))
        first = datagen("run", str(config), env=env)
        try:
            wait_for_rows(tmp_path / "killtest", 100, first, timeout_s=180)
            time.sleep(1.0)
        finally:
            kill_group(first)
        running = [r for r in api_post("flow_runs/filter") if r["state_type"] == "RUNNING"]
        assert {r["name"] for r in running} == {"killtest", "chat"}  # what a SIGKILL leaves behind
        again = datagen("run", str(config), env=env)
        out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out.decode()[-3000:]
    check = check_run(tmp_path / "killtest")
    assert len(check.row_ids) + len(check.reject_ids) == 600 and check.duplicates == 0

    runs = api_post("flow_runs/filter")
    top = [r for r in runs if r["name"] == "killtest" and r["parent_task_run_id"] is None]
    assert len(top) == 1, "the resume is the same flow run, retried, not a stranger of the same name"
    (run,) = top
    assert run["state_type"] == "COMPLETED" and run["run_count"] == 2
    states = prefect_api("GET", f"{api}/flow_run_states/", params={"flow_run_id": run["id"]}).json()
    assert "CRASHED" in [s["type"] for s in states]
    assert not [r for r in runs if r["state_type"] in ("RUNNING", "PENDING")]
    tasks = api_post("task_runs/filter")
    assert not [t for t in tasks if t["state_type"] in ("RUNNING", "PENDING")]
    assert {t["state_type"] for t in tasks} <= {"COMPLETED", "CRASHED"}

    artifacts = [a for a in api_post("artifacts/filter") if a["flow_run_id"] == run["id"]]
    keys = Counter(a["key"] for a in artifacts)
    assert set(keys) == {"killtest-progress", "killtest-chat", "killtest-endpoints", "killtest-report"}
    assert set(keys.values()) == {1}, f"one card per key, updated in place across both starts: {keys}"
    by_key = {a["key"]: a for a in artifacts}
    assert by_key["killtest-progress"]["data"] == 100
    table = {row["metric"]: row["value"] for row in json.loads(str(by_key["killtest-chat"]["data"]))}
    assert int(table["rows on disk (all starts)"]) == len(check.row_ids)
    assert int(table["rejects on disk (standing)"]) == len(check.reject_ids)
    assert (
        int(table["done before this start"])
        + int(table["rows (this run)"])
        + int(table["rejects (this run)"])
        == 600
    )
    assert "## Plots" in str(by_key["killtest-report"]["data"])

    logs = [str(entry["message"]) for entry in api_post("logs/filter", {"logs": {"level": {"ge_": 20}}})]
    assert any("marked Crashed" in line for line in logs)
    assert any("resumed" in line and "already done are skipped" in line for line in logs)
    assert any(line.startswith("category chat finished") for line in logs)
    assert "category chat finished" not in out.decode(), "the terminal stays quiet"
    assert (tmp_path / "killtest" / "throughput.png").exists()
    # report.md names the plots the Prefect report drew (drawn once per start, not twice)
    assert "](throughput.png)" in (tmp_path / "killtest" / "report.md").read_text()


def test_a_dead_run_is_marked_crashed_by_the_heartbeat_automation_without_a_new_start(
    tmp_path: Path, server: PrefectServer, api_post: Any
) -> None:
    """Nobody starts the run again: Prefect itself finds it dead (no heartbeat for 90 s)."""
    api = server.api_url
    env = {"PREFECT_API_URL": api, "PREFECT_HOME": str(server.home)}
    source = tmp_path / "p.jsonl"
    write_prompts(source, 2000)
    config = write_config(tmp_path / "z.toml", name="zombie", output_dir=tmp_path, url="", source=source)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config.write_text(config.read_text().replace('url = ""', f'url = "{sim.url}"'))
        first = datagen("run", str(config), env=env)
        try:
            wait_for_rows(tmp_path / "zombie", 20, first, timeout_s=180)
        finally:
            kill_group(first)
        automations = prefect_api("POST", f"{api}/automations/filter", json={}).json()
        assert [a["name"] for a in automations].count("datagen: mark dead flow runs Crashed") == 1
        killed_at = time.monotonic()
        deadline = killed_at + 240
        runs: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            runs = [r for r in api_post("flow_runs/filter") if r["name"] == "zombie"]
            parents = {"flow_runs": {"parent_flow_run_id": {"any_": [r["id"] for r in runs]}}}
            runs += api_post("flow_runs/filter", parents) if runs else []
            if runs and all(r["state_type"] == "CRASHED" for r in runs):
                break
            time.sleep(3)
        crashed_after_s = time.monotonic() - killed_at
        assert {r["name"] for r in runs} == {"zombie", "chat"}
        assert all(r["state_type"] == "CRASHED" for r in runs), [(r["name"], r["state_type"]) for r in runs]
        assert crashed_after_s <= 150, f"marked Crashed {crashed_after_s:.0f} s after the kill"
        print(f"marked Crashed {crashed_after_s:.0f} s after the kill")
        again = datagen("run", str(config), env=env)
        out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out.decode()[-3000:]
    check = check_run(tmp_path / "zombie")
    assert len(check.row_ids) + len(check.reject_ids) == 2000 and check.duplicates == 0
    (top,) = [r for r in api_post("flow_runs/filter") if r["name"] == "zombie"]
    assert top["state_type"] == "COMPLETED" and top["run_count"] == 2  # the Crashed run, retried in place
    ids = {top["id"], *(r["id"] for r in runs)}
    left = [t for t in api_post("task_runs/filter") if t["flow_run_id"] in ids]
    assert left and not [t for t in left if t["state_type"] in ("RUNNING", "PENDING")]


def test_the_dead_run_automation_never_forces_crashed_and_an_older_one_is_brought_up_to_date(
    server: PrefectServer,
) -> None:
    """Forced, Crashed overwrote scheduled firings that had Completed when their final event reached
    the trigger late; unforced, Prefect's rules refuse Crashed over a final state. A server keeps the
    automation an earlier version made, so the next start updates it (once)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.orchestration.zombies import AUTOMATION_NAME, ensure_zombie_automation, zombie_automation

    def actions() -> list[dict[str, object]]:
        (found,) = [
            a
            for a in prefect_api("POST", f"{server.api_url}/automations/filter", json={}).json()
            if a["name"] == AUTOMATION_NAME
        ]
        return list(found["actions"])

    with temporary_settings({PREFECT_API_URL: server.api_url}):
        old = zombie_automation()
        old.actions[0].force = True  # type: ignore[union-attr]  # what earlier versions created
        for automation in prefect_api("POST", f"{server.api_url}/automations/filter", json={}).json():
            if automation["name"] == AUTOMATION_NAME:
                prefect_api("DELETE", f"{server.api_url}/automations/{automation['id']}")
        asyncio.run(old.acreate())
        assert actions()[0]["force"] is True
        assert asyncio.run(ensure_zombie_automation()) is True  # updated
        assert actions()[0]["force"] is False
        assert asyncio.run(ensure_zombie_automation()) is False  # up to date: left alone
