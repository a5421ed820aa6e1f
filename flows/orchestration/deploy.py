"""Scheduled runs (`datagen deploy`): a deployment whose every firing is one start of a run config.

A firing is the same thing as `datagen run CONFIG`: resume is the default, so successive firings
continue one long run (finished prompts skipped; when nothing is left the firing says so and ends in
seconds), or, with ``fresh_run_names``, each firing starts a new run named after its scheduled time.

Two firings never write one run directory at once: each start takes the run lock
(``flows/store/run_lock.py``) before anything else, and a firing that finds it held ends Completed with
"skipped: run X is busy" instead of waiting behind a run that may last days (the next firing will
find it free). The lock is the guard, because it also holds against a `datagen run` started by hand,
a second deployment of the same config, or another pool. With fresh run names each firing is a new
run, so a firing lock of the config (``firing_lock``, the same kind of lock) keeps a second one off the
servers the last still uses: it ends Completed with "skipped: previous firing still running".

No deployment has a Prefect concurrency limit: with one, Prefect's engine holds a lease for each
firing and cancels the firing when renewing it fails (``raise_on_lease_renewal_failure`` in Prefect
3.9's ``flow_engine.py``), so a Prefect API away for a few minutes stopped a run of days, and the
cancel, repeated at every await, cut its final flush short (measured: rows read were not written).

The flow is importable by module path (``flows.orchestration.deploy.scheduled_run``) with the config
path as its parameter: a process worker on another machine runs it from its own checkout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import State
from prefect.client.schemas.schedules import CronSchedule
from prefect.context import FlowRunContext
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Completed
from pydantic import ValidationError

from flows.config import RunConfig, load_config
from flows.orchestration.zombies import HEARTBEAT_ENV, HEARTBEAT_S
from flows.report.status import RunStatus, run_status
from flows.runner import execute, sigterm_stops_run
from flows.store.parts import Part
from flows.store.run_lock import RunLock, RunLocked

FIRING_LOCK = "firing.lock"
"""``<output_dir>/.<run name>.firing.lock``: held by a firing of a deployment with fresh run names."""
SCHEDULED_FLOW = "datagen-scheduled"
"""The deployment's flow; each firing's run is its subflow ``datagen`` (see ``flow.py``)."""
POOL_TYPE = "process"


@dataclass(frozen=True)
class Schedule:
    """When firings happen: a cron expression (UTC) or a fixed interval in seconds."""

    cron: str | None = None
    interval_s: float | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give a cron expression or an interval, not both or neither")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError("the interval must be a positive number of seconds")
        if self.cron is not None:  # checked now: Prefect's own check came after "serving ..." was said
            try:
                CronSchedule(cron=self.cron, timezone="UTC")
            except ValidationError:
                raise ValueError(
                    f"--cron {self.cron!r} is not a cron expression: five fields, minute hour day month "
                    "weekday, e.g. '0 */6 * * *' for every six hours (UTC)"
                ) from None

    def describe(self) -> str:
        return f"cron {self.cron!r} (UTC)" if self.cron else f"every {self.interval_s:g} s"


def fresh_run_name(name: str, scheduled: datetime) -> str:
    """``<name>-20261201T1200Z``: the firing's scheduled time in UTC (seconds only when not zero).

    Safe for paths and for run names; the same firing retried gets the same name, so it resumes.
    """
    when = scheduled.astimezone(UTC)
    return f"{name}-{when.strftime('%Y%m%dT%H%M%S' if when.second else '%Y%m%dT%H%M')}Z"


def _renamed(config: RunConfig, name: str) -> RunConfig:
    return config.model_copy(update={"run": config.run.model_copy(update={"name": name})})


def _written_by(status: RunStatus, part: Part | None) -> tuple[int, int]:
    """Rows and standing rejects that a firing of ``part`` writes: its part's (the other parts of the
    run write theirs meanwhile, on other machines), or the whole run's (a run without parts has no
    other writer: the run lock)."""
    if part is None:
        return (status.rows, status.rejects)
    own = status.by_part().get(str(part), {"rows": 0, "rejects": 0})
    return (own["rows"], own["rejects"])


def _settled(config: RunConfig, part: Part | None) -> tuple[int, int]:
    """``_written_by`` on disk before a firing (0, 0 for a run not started yet), read where the firing
    writes: the run's location (a bucket's, for an ``output_dir`` URL), not its local folder."""
    try:
        status = run_status(config.run_location)
    except FileNotFoundError:  # no manifest yet
        return (0, 0)
    return _written_by(status, part)


async def fire(
    config_path: Path,
    *,
    fresh_run_names: bool,
    scheduled: datetime,
    say: Callable[[str], None],
    part: Part | None = None,
) -> str:
    """One firing: run (or resume) the config, or skip it when its run directory is busy.

    Returns the line that ends the firing (also said through ``say``): what it added, "nothing left
    to do", "skipped: run X is busy", or, with fresh run names, "skipped: previous firing still
    running". SIGTERM stops it in order (``sigterm_stops_run``) and raises ``CancelledError``, which
    Prefect's engine records as the firing's cancellation.
    """
    config = load_config(config_path)
    if not fresh_run_names:
        return await _fire(config, part, say)
    lock = firing_lock(config, part)
    try:
        lock.acquire()
    except RunLocked as error:
        line = (
            f"skipped: previous firing still running ({error.holder}): fresh runs of "
            f"{config.run.name} go one at a time, so two never share the servers"
        )
        say(line)
        return line
    try:
        return await _fire(_renamed(config, fresh_run_name(config.run.name, scheduled)), part, say)
    finally:
        lock.release()


def firing_lock(config: RunConfig, part: Part | None) -> RunLock:
    """The lock a firing with fresh run names holds for its life, beside the config's runs.

    Keyed by the configured run name (and part) in the folder that holds the run directories (the
    run's ``local_dir`` for an ``output_dir`` URL): every deployment of the config shares it. The run
    lock's rules and kernel ``flock``, so a killed firing releases it at once and a part deployment
    only waits for its own part.
    """
    return RunLock(config.run_dir.parent, part, file=f".{config.run.name}.{FIRING_LOCK}")


async def _fire(config: RunConfig, part: Part | None, say: Callable[[str], None]) -> str:
    """``fire`` of the run ``config`` names: run or resume it, or skip it when it is busy."""
    name = config.run.name
    before = _settled(config, part)
    # a cancel from the UI (or the worker stopping) is SIGTERM, then SIGKILL after a grace: an orderly
    # stop within the grace, like `datagen run`'s, not Prefect's handler raising inside a request task
    with sigterm_stops_run() as termination:
        try:
            status = await execute(config, part=part)
        except RunLocked as error:
            line = f"skipped: run {name} is busy ({error})"
        except asyncio.CancelledError:
            if termination.received:  # the engine marks the firing Cancelled (Crashed for a bare kill)
                say(f"stopped by SIGTERM: run {name}'s finished rows are saved; the next firing resumes it")
            raise
        else:
            after = _written_by(status, part)
            if after == before:
                line = f"nothing left to do: run {name} has {status.rows} rows and {status.rejects} rejects"
            else:
                line = (
                    f"run {name} now has {status.rows} rows and {status.rejects} rejects "
                    f"(+{after[0] - before[0]} rows in this firing)"
                )
    say(line)
    return line


@flow(name=SCHEDULED_FLOW, persist_result=False)
async def scheduled_run(config_path: str, fresh_run_names: bool = False, part: str | None = None) -> State:
    """A firing of `datagen deploy`: the run of CONFIG_PATH resumed (or a fresh one), or skipped if busy.

    ``part`` ("i/K") makes the firing part i of K of the run (one deployment per part, see ``--part``).
    """
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    scheduled = flow_run.expected_start_time if flow_run and flow_run.expected_start_time else None
    line = await fire(
        Path(config_path),
        fresh_run_names=fresh_run_names,
        scheduled=scheduled or datetime.now(UTC),
        say=get_run_logger().info,
        part=None if part is None else Part.parse(part),
    )
    return Completed(message=line)


async def _deployment(
    config_path: Path,
    schedule: Schedule,
    name: str,
    fresh_run_names: bool,
    pool: str | None,
    part: Part | None = None,
) -> RunnerDeployment:
    parameters = {
        "config_path": str(config_path.resolve()),
        "fresh_run_names": fresh_run_names,
        "part": None if part is None else str(part),
    }
    # a process worker starts flow runs in a temporary directory unless told: a relative
    # `output_dir` must mean what it means to `datagen run` here. Its firings get the worker's
    # environment, where Prefect's default heartbeat (180 s) is slower than the dead-run automation
    # expects (``zombies.py``): the heartbeat goes with the deployment, or live firings are Crashed
    job_variables = (
        {"working_dir": str(Path.cwd()), "env": {HEARTBEAT_ENV: str(HEARTBEAT_S)}} if pool else None
    )
    return await scheduled_run.ato_deployment(
        name=name,
        cron=schedule.cron,
        interval=schedule.interval_s,
        parameters=parameters,
        description=f"datagen run of {config_path.resolve()}, {schedule.describe()}",
        entrypoint_type=EntrypointType.MODULE_PATH,
        work_pool_name=pool,
        job_variables=job_variables,
    )


def serve(
    config_path: Path, schedule: Schedule, name: str, fresh_run_names: bool, part: Part | None = None
) -> None:
    """Serve the deployment from this process until Ctrl-C; each firing runs in a child process."""
    from prefect import serve as prefect_serve

    deployment = asyncio.run(_deployment(config_path, schedule, name, fresh_run_names, None, part))
    prefect_serve(deployment, print_starting_message=False)


async def register(
    config_path: Path,
    schedule: Schedule,
    name: str,
    fresh_run_names: bool,
    pool: str,
    part: Part | None = None,
) -> UUID:
    """Register the deployment on a process work pool (created if missing); workers there run it."""
    await ensure_pool(pool)
    deployment = await _deployment(config_path, schedule, name, fresh_run_names, pool, part)
    return await deployment.aapply(work_pool_name=pool)


async def ensure_pool(pool: str) -> bool:
    """Create a process work pool named ``pool`` unless one exists; True when it was created."""
    from prefect.workers.process import ProcessWorker

    async with get_client() as client:
        try:
            await client.read_work_pool(pool)
            return False
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            create = WorkPoolCreate(name=pool, type=POOL_TYPE, base_job_template=template)
            await client.create_work_pool(create)
            return True


def deployment_name(name: str) -> str:
    """How Prefect names it (`prefect deployment run FLOW/NAME`)."""
    return f"{SCHEDULED_FLOW}/{name}"


def api_and_ui() -> tuple[str, str] | None:
    """The configured API and its UI's address; None without ``PREFECT_API_URL``.

    A deployment lives in a server that outlasts this command (workers and the UI read it there), so
    Prefect's temporary server, which dies with the process, is no place for one.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    api = PREFECT_API_URL.value()
    if not api:
        return None
    return api, PREFECT_UI_URL.value() or api.removesuffix("/api")
