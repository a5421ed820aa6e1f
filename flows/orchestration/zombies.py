"""Prefect's zombie detection for datagen's flow runs: a run whose process died is marked Crashed.

A run killed with kill -9 (or on a node that vanished) leaves its flow runs Running: nothing is left
to report the end. Prefect's answer ("Detect zombie flows" in its docs) is two halves: flow runs send
a heartbeat event every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds, and an automation with a
proactive trigger marks a flow run Crashed when, after a heartbeat, nothing (no heartbeat, no final
state) follows within ``within_s``. The next start of the same command (or a retry from the UI)
then resumes it in place from the files (``flows/orchestration/runs.py``).

Datagen sends heartbeats every 30 s (Prefect's minimum; its default is 180 s) and creates the
automation, once per server, named ``AUTOMATION_NAME``: only flow runs of datagen's own flows are
matched, so other teams' flows on a shared server, with other heartbeat settings, are never touched.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.automations import Automation

log = logging.getLogger(__name__)

HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
HEARTBEAT_S = 30
MISSED_HEARTBEATS = 3
AUTOMATION_NAME = "datagen: mark dead flow runs Crashed"
DATAGEN_FLOWS = ("datagen", "category", "datagen-scheduled")
"""The flows whose runs the automation watches: the run, its per-category subflows, deploy firings."""
CRASH_MESSAGE = (
    "no heartbeat for {within} s: its process died (kill -9, a lost node); "
    "the same command, or a retry of this flow run, resumes it from the files"
)


def zombie_automation(heartbeat_s: int = HEARTBEAT_S, missed: int = MISSED_HEARTBEATS) -> Automation:
    """The automation (not yet saved): Crashed after ``missed`` heartbeats did not come."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    within = heartbeat_s * missed
    return Automation(
        name=AUTOMATION_NAME,
        description=f"datagen flow runs send a heartbeat every {heartbeat_s} s; {missed} missed: Crashed",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "flow", "prefect.resource.name": list(DATAGEN_FLOWS)}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[
            ChangeFlowRunState(
                name="Crashed",
                state=StateType.CRASHED,
                message=CRASH_MESSAGE.format(within=within),
                # Prefect's own rules then refuse Crashed over a final state: forced, it overwrote
                # scheduled firings that had Completed when their final event reached the trigger late
                force=False,
            )
        ],
    )


async def ensure_zombie_automation() -> bool:
    """Create the automation on the configured server, or bring one of that name made by an earlier
    version up to date (a server outlives upgrades); True if it was created or changed."""
    from prefect.automations import Automation

    wanted = zombie_automation()
    try:
        existing = await Automation.aread(name=AUTOMATION_NAME)
    except ValueError:  # Prefect's "not found"
        await wanted.acreate()
        log.info("created the Prefect automation %r (dead flow runs are marked Crashed)", AUTOMATION_NAME)
        return True
    if _definition(existing) == _definition(wanted):
        return False
    existing.description, existing.trigger, existing.actions = (
        wanted.description,
        wanted.trigger,
        wanted.actions,
    )
    await existing.aupdate()
    log.info("updated the Prefect automation %r to this version's", AUTOMATION_NAME)
    return True


def _definition(automation: Automation) -> object:
    """What the automation does, comparable across processes: the trigger's sets (``after``,
    ``expect``, ``for_each``) dump as lists in set order, which differs with the insertion order and
    the hash seed, so an automation up to date read as changed, now and then (seen in CI)."""
    return _canonical(automation.model_dump(mode="json", include={"description", "trigger", "actions"}))


def _canonical(value: object) -> object:
    """``value`` with every list of strings sorted (a set, as JSON), dicts and other lists kept."""
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        items = [_canonical(item) for item in value]
        return sorted(str(item) for item in items) if all(isinstance(item, str) for item in items) else items
    return value
