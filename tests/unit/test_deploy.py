"""`datagen deploy` without a server: fresh run names, schedules, and a firing on a busy run."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from pipeline_support import write_config, write_prompts
from test_store import _row
from typer.testing import CliRunner

from flows.cli.main import app
from flows.config import RunConfig
from flows.orchestration import deploy
from flows.orchestration.deploy import Schedule, _deployment, fire, fresh_run_name
from flows.orchestration.zombies import HEARTBEAT_ENV, MISSED_HEARTBEATS, zombie_automation
from flows.report.status import RunStatus, run_status
from flows.store.parts import Part
from flows.store.run_lock import RunLock
from flows.store.run_store import RunStore
from sglang_launch.ports import free_port


def test_fresh_run_names_are_the_scheduled_time_in_utc_and_safe_for_paths() -> None:
    assert fresh_run_name("regen", datetime(2026, 12, 1, 12, 0, tzinfo=UTC)) == "regen-20261201T1200Z"
    assert fresh_run_name("regen", datetime(2026, 12, 1, 12, 0, 5, tzinfo=UTC)) == "regen-20261201T120005Z"
    paris = timezone(timedelta(hours=1))
    assert fresh_run_name("regen", datetime(2026, 12, 1, 13, 0, tzinfo=paris)) == "regen-20261201T1200Z"


@pytest.mark.parametrize(("cron", "interval"), [(None, None), ("0 * * * *", 60.0), (None, 0.0), (None, -5.0)])
def test_a_schedule_is_a_cron_or_a_positive_interval(cron: str | None, interval: float | None) -> None:
    with pytest.raises(ValueError):
        Schedule(cron=cron, interval_s=interval)


def _config(tmp_path: Path) -> Path:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 3)
    return write_config(
        tmp_path / "c.toml", name="d", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )


def test_a_cron_that_is_no_cron_is_refused_before_anything_is_served(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cron expression: five fields"):
        Schedule(cron="every six hours")
    assert Schedule(cron="0 */6 * * *").describe() == "cron '0 */6 * * *' (UTC)"
    config = _config(tmp_path)
    result = CliRunner().invoke(app, ["deploy", str(config), "--cron", "every six hours"])
    assert result.exit_code == 2 and "not a cron expression" in result.output
    assert "serving" not in result.output


@pytest.mark.parametrize("where", [["--pool", "p"], []], ids=["on a pool", "served"])
def test_deploying_with_the_api_down_is_one_line(tmp_path: Path, where: list[str]) -> None:
    """Registering on a pool and serving (Prefect's serve registers first) both need the API."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    config = _config(tmp_path)
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        result = CliRunner().invoke(app, ["deploy", str(config), "--interval", "60", *where])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 3 and "cannot be reached" in result.output
    assert "serving" not in result.output and "UI:" not in result.output  # said only once it is true


async def test_a_firing_on_a_busy_run_is_skipped_with_a_line_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 5)
    config = write_config(
        tmp_path / "c.toml", name="busy", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )
    said: list[str] = []
    with RunLock(tmp_path / "busy"):  # another firing (or a `datagen run`) holds the run
        line = await fire(config, fresh_run_names=False, scheduled=datetime.now(UTC), say=said.append)
    assert line.startswith("skipped: run busy is busy (") and "in use by another datagen run" in line
    assert said == [line]
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == [".lock"], "nothing written"


async def test_a_part_deployment_fires_its_part_and_carries_it_as_a_parameter(tmp_path: Path) -> None:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 5)
    config = write_config(
        tmp_path / "c.toml", name="split", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )
    said: list[str] = []
    with RunLock(tmp_path / "split", Part(2, 3)):  # part 2/3 busy on another machine
        line = await fire(
            config, fresh_run_names=False, scheduled=datetime.now(UTC), say=said.append, part=Part(2, 3)
        )
    assert line.startswith("skipped: run split is busy (")  # its own part's lock, not the whole run's
    deployment = await _deployment(
        config, Schedule(interval_s=60), "split-part-2-of-3", False, None, Part(2, 3)
    )
    assert deployment.parameters == {
        "config_path": str(config.resolve()),
        "fresh_run_names": False,
        "part": "2/3",
    }


async def test_a_part_firing_counts_its_own_rows_not_those_other_parts_wrote_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part 2/2 fires while part 1/2 runs on another machine into the same run: the firing's "+N" is
    what part 2/2 wrote, and a firing of part 2/2 with nothing left says so while part 1/2 goes on."""
    source = tmp_path / "p.jsonl"
    write_prompts(source, 5)
    config = write_config(
        tmp_path / "c.toml", name="split", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )
    run_dir = tmp_path / "split"
    fired = iter([(["o1", "o2", "o3"], ["m1", "m2"]), (["o4"], [])])

    def write(part: Part, ids: list[str]) -> None:
        store = RunStore(run_dir, part)
        store.open_run("fp", {"categories": [{"name": "chat"}]})
        rows = store.row_writer("chat", flush_rows=10, flush_seconds=60)
        for rid in ids:
            rows.add({**_row(rid), "category": "chat"})
        rows.flush()

    async def execute(config: RunConfig, *, part: Part | None = None) -> RunStatus:
        others, mine = next(fired)
        write(Part(1, 2), others)  # part 1/2, meanwhile
        assert part is not None
        write(part, mine)
        return run_status(config.run_dir)

    monkeypatch.setattr(deploy, "execute", execute)
    fire_part = functools.partial(
        fire,
        config,
        fresh_run_names=False,
        scheduled=datetime.now(UTC),
        say=lambda line: None,
        part=Part(2, 2),
    )
    assert await fire_part() == "run split now has 5 rows and 0 rejects (+2 rows in this firing)"
    assert await fire_part() == "nothing left to do: run split has 6 rows and 0 rejects"


async def test_a_firing_on_a_work_pool_sends_heartbeats_as_often_as_the_dead_run_automation_expects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started as the README says (`prefect worker start --pool NAME`, no datagen settings in
    its environment) starts each firing with the environment the deployment's job variables give it.
    Without the heartbeat there, a firing beat at Prefect's default (every 180 s) and the automation,
    which expects a beat within 90 s, marked the live firing and its subflows Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    deployment = await _deployment(_config(tmp_path), Schedule(interval_s=60), "d", False, "pool")
    nowhere = {PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}  # nothing to look up there
    with temporary_settings(updates=nowhere, restore_defaults={PREFECT_FLOWS_HEARTBEAT_FREQUENCY}):
        job = await ProcessJobConfiguration.from_template_and_values(
            ProcessWorker.get_default_base_job_template(), deployment.job_variables or {}, client=get_client()
        )
        job.prepare_for_flow_run(FlowRun(flow_id=uuid4()))
        beat_s = int(job.env.get(HEARTBEAT_ENV) or PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value())
    expected_within = zombie_automation().trigger.within  # type: ignore[union-attr]
    assert beat_s * MISSED_HEARTBEATS <= expected_within.total_seconds()
    assert job.working_dir == Path.cwd()  # the other job variable kept


async def test_a_firing_of_a_run_in_an_object_store_counts_what_it_added_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`output_dir` a URL: the rows are in the bucket, the run's local folder holds only its lock and
    logs. Counted from the local folder, the rows before a firing were none: every firing said it
    added the whole run ("+4 rows"), and "nothing left to do" was never said, firing after firing."""
    source = tmp_path / "p.jsonl"
    write_prompts(source, 5)
    config = write_config(
        tmp_path / "c.toml", name="run", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )
    output_dir = f"memory://deploy-{uuid4().hex}"  # fsspec's in-process file system: a bucket
    config.write_text(
        config.read_text().replace(
            f'output_dir = "{tmp_path}"', f'output_dir = "{output_dir}"\nlocal_dir = "{tmp_path / "local"}"'
        )
    )
    store = RunStore(f"{output_dir}/run")
    store.open_run("fp", {"categories": [{"name": "chat"}]})

    def write(ids: list[str]) -> None:
        rows = store.row_writer("chat", flush_rows=10, flush_seconds=60)
        for rid in ids:
            rows.add({**_row(rid), "category": "chat"})
        rows.flush()

    write(["a", "b", "c"])  # earlier firings
    fired = iter([["d"], []])

    async def execute(config: RunConfig, *, part: Part | None = None) -> RunStatus:
        write(next(fired))
        return run_status(config.run_location)

    monkeypatch.setattr(deploy, "execute", execute)
    fire_run = functools.partial(
        fire, config, fresh_run_names=False, scheduled=datetime.now(UTC), say=lambda line: None
    )
    assert await fire_run() == "run run now has 4 rows and 0 rejects (+1 rows in this firing)"
    assert await fire_run() == "nothing left to do: run run has 4 rows and 0 rejects"


@pytest.mark.parametrize("fresh_run_names", [False, True])
async def test_no_deployment_takes_a_concurrency_lease(tmp_path: Path, fresh_run_names: bool) -> None:
    """A concurrency limit makes Prefect's engine hold a lease for each firing and cancel the firing
    when a renewal fails (Prefect 3.9's ``flow_engine.py``: ``raise_on_lease_renewal_failure=True``
    whenever the flow run carries a deployment concurrency lease): a Prefect API away for minutes
    stopped a run of days and cut its final flush. Firings of one run have the run lock instead,
    and with fresh run names the deployment's own firing lock (next test)."""
    deployment = await _deployment(_config(tmp_path), Schedule(interval_s=60), "d", fresh_run_names, None)
    assert deployment.concurrency_limit is None and deployment.concurrency_options is None


@pytest.mark.parametrize("part", [None, Part(1, 2)], ids=["whole", "part"])
async def test_a_fresh_firing_while_the_last_one_runs_is_skipped_and_starts_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: Part | None
) -> None:
    """With fresh run names each firing is a new run, so the run lock cannot keep two firings off the
    same servers: a firing due while the last still runs ends at once with "skipped: previous firing
    still running" and starts no run (before: Prefect's concurrency limit, and its lease, did it)."""
    config = _config(tmp_path)
    started: list[str] = []
    running = asyncio.Event()
    finish = asyncio.Event()

    async def execute(config: RunConfig, *, part: Part | None = None) -> RunStatus:
        started.append(config.run.name)
        if len(started) == 1:  # the first firing runs until the test lets it end
            running.set()
            await finish.wait()
        return RunStatus(run_dir=str(config.run_dir), fingerprint=None, categories=[])

    monkeypatch.setattr(deploy, "execute", execute)
    monkeypatch.setattr(deploy, "_settled", lambda config, part: (0, 0))

    def firing(hour: int) -> Coroutine[Any, Any, str]:
        scheduled = datetime(2026, 12, 1, hour, tzinfo=UTC)
        return fire(config, fresh_run_names=True, scheduled=scheduled, say=lambda line: None, part=part)

    first = asyncio.create_task(firing(12))
    await running.wait()
    second = await firing(13)
    assert second.startswith("skipped: previous firing still running (") and "pid " in second, second
    assert started == ["d-20261201T1200Z"], "the second firing started no run"
    finish.set()
    await first
    await firing(14)  # the lock goes with the firing that held it
    assert started == ["d-20261201T1200Z", "d-20261201T1400Z"]
