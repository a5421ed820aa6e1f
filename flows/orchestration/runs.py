"""A run's earlier flow runs: a killed one is marked Crashed, and the next start continues it.

A process killed with SIGKILL cannot tell Prefect it died: its flow run, subflows and shard tasks stay
"Running". The run directory's lock (``flows/store/run_lock.py``) settles it: a start that holds the
lock knows every other flow run of the same run directory that is still Running or Pending has lost
its process. It marks them Crashed (subflows and task runs too) and then runs *in* the latest earlier
flow run when that one did not complete (retried in place: one flow run per run in the UI, its state
history showing Crashed then Running), or in a new flow run that names the one it continues.

Flow runs of one run directory carry one tag, ``datagen-run-<hash of the directory (and part)>``.
Prefect's own zombie detection (flow run heartbeats and an automation, see the README) marks such a
run Crashed without waiting for the next start.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import Crashed

log = logging.getLogger(__name__)

RUN_FLOW = "datagen"
"""The flow of a whole run (categories are subflows named ``category``)."""
UNFINISHED = [StateType.RUNNING, StateType.PENDING]
RETRY_IN_PLACE = {StateType.RUNNING, StateType.PENDING, StateType.CRASHED, StateType.FAILED}


def run_tag(run_dir: Path, part: str | None = None) -> str:
    """The tag every flow run of this run directory (and part) carries."""
    key = str(run_dir.resolve()) + (f"#{part}" if part else "")
    return "datagen-run-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass
class Earlier:
    """What the earlier flow runs of a run directory were found in, and what was done about them."""

    crashed: list[UUID]
    """Flow runs found Running/Pending (their process is gone) and marked Crashed now."""
    continue_in: FlowRun | None
    """The latest earlier flow run, when it did not complete: the new start runs in it."""
    latest: FlowRun | None


async def settle_earlier_runs(tag: str, *, reuse: bool = True) -> Earlier:
    """Mark the tag's unfinished flow runs Crashed (the caller holds the run lock); pick one to continue."""
    async with get_client() as client:
        unfinished = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=UNFINISHED)),
            )
        )
        crashed = []
        for run in unfinished:
            await _crash_tree(client, run.id)
            crashed.append(run.id)
        latest_runs = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[RUN_FLOW])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
        latest = latest_runs[0] if latest_runs else None
        if latest is not None:
            latest = await client.read_flow_run(latest.id)
            if latest.state is not None and latest.state.type == StateType.CRASHED:
                # Crashed by Prefect's zombie automation, which sets the flow run only
                await _crash_children(client, latest.id)
    state = latest.state.type if latest is not None and latest.state is not None else None
    again = latest if reuse and latest is not None and state in RETRY_IN_PLACE else None
    return Earlier(crashed, again, latest)


CRASH_MESSAGE = (
    "its process died without a word (kill -9, a lost node): found by the next start of the same run, "
    "which resumes it from the files"
)


async def _crash_tree(client: PrefectClient, flow_run_id: UUID) -> None:
    """Crash a flow run, its Running/Pending task runs and its subflows (recursively)."""
    await client.set_flow_run_state(flow_run_id, Crashed(message=CRASH_MESSAGE), force=True)
    await _crash_children(client, flow_run_id)


async def _crash_children(client: PrefectClient, flow_run_id: UUID) -> None:
    """Crash a flow run's Running/Pending task runs and subflows, and theirs (recursively).

    Subflows already Crashed (by Prefect's zombie automation, which sets flow runs only) are looked
    into as well: their task runs are still Running.
    """
    tasks = await client.read_task_runs(
        task_run_filter=TaskRunFilter(
            state=TaskRunFilterState(type=TaskRunFilterStateType(any_=UNFINISHED)),
            flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        ),
    )
    for task_run in tasks:
        await client.set_task_run_state(task_run.id, Crashed(message=CRASH_MESSAGE), force=True)
    children = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[*UNFINISHED, StateType.CRASHED])),
        )
    )
    for child in children:
        if child.state is not None and child.state.type in UNFINISHED:
            await _crash_tree(client, child.id)
        else:
            await _crash_children(client, child.id)
