"""The Prefect face of the pipeline: one flow run per pipeline run, a subflow per category, a task per shard.

Never a task per request: requests are asyncio inside a shard task. Task results are not persisted
or cached: the checkpoint store is the only source of truth for what is done, so re-running the
same command resumes from the store whatever Prefect remembers. If Prefect fails around a flow
(its API gone), the same pipeline goes on without it (``prefect_link.orchestrated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import Any, cast
from uuid import UUID

from prefect import flow, task
from prefect.artifacts import acreate_markdown_artifact, acreate_progress_artifact, aupdate_progress_artifact
from prefect.cache_policies import NO_CACHE

from flows.prefect_link import PrefectLink, Unit, discard_prefect_backlog, orchestrated, track
from flows.report.status import progress_fraction, progress_markdown
from flows.run.pipeline import Pipeline, ShardRunner
from flows.run.session import RunSession

ARTIFACT_EVERY_S = 5.0
TABLE_EVERY_TICKS = 6
log = logging.getLogger(__name__)


async def _artifact_loop(session: RunSession, link: PrefectLink | None) -> None:
    """Progress in the Prefect UI every few seconds, and the live counts table every half minute.

    Not per request: artifacts are API writes. A failed write (the API restarting) is logged and
    retried at the next tick; it never touches the data.
    """
    progress_id: UUID | None = None
    key = _key(session)
    for tick in itertools.count():
        if link is not None and link.down:  # said once already; try again when it answers
            await asyncio.sleep(ARTIFACT_EVERY_S)
            continue
        try:
            fraction = progress_fraction(session)
            percent = round(100.0 * fraction, 1) if fraction is not None else 0.0
            if progress_id is None:
                described = (
                    "rows + rejects done" if fraction is not None else "total unknown (streamed source)"
                )
                progress_id = await acreate_progress_artifact(
                    progress=percent, key=f"{key}-progress", description=described
                )
            elif fraction is not None:
                await aupdate_progress_artifact(artifact_id=progress_id, progress=percent)
            if tick % TABLE_EVERY_TICKS == 0:
                await acreate_markdown_artifact(
                    markdown=progress_markdown(session), key=f"{key}-summary", description="live counts"
                )
        except Exception:
            log.warning("could not update the Prefect artifacts", exc_info=True)
        await asyncio.sleep(ARTIFACT_EVERY_S)


def _key(session: RunSession) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in session.config.run.name.lower())


class _Units:
    """This run's flow bodies by key: Prefect parameters stay small strings, the objects stay here."""

    def __init__(self) -> None:
        self._units: dict[str, Unit] = {}

    def key(self, unit: Unit) -> str:
        key = uuid.uuid4().hex
        self._units[key] = unit
        return key

    def pop(self, key: str) -> Unit:
        return self._units.pop(key)


def _datagen_flow(pipeline: Pipeline, link: PrefectLink) -> Any:
    """The run's flow, its category subflow and shard task, closed over this run's pipeline.

    The live objects (clients, store, limiter) stay in this process and out of Prefect's parameters,
    which are JSON stored by the API: flows and tasks only pass names, indexes and keys.
    """
    session = pipeline.session
    units = _Units()

    @task(name="shard", cache_policy=NO_CACHE, persist_result=False, task_run_name="{category}-shard-{index}")
    async def shard_task(category: str, index: int) -> None:
        await pipeline.run_shard(category, index)

    @flow(name="category", flow_run_name="{category}", persist_result=False, validate_parameters=False)
    async def category_flow(category: str, unit_key: str) -> None:
        await track(units.pop(unit_key), pipeline.run_category(category, cast(ShardRunner, shard_task)))

    async def category(name: str) -> None:
        """A category as a Prefect subflow, or without Prefect once its API is gone."""
        await orchestrated(
            link,
            lambda unit: category_flow(name, units.key(unit)),
            lambda: pipeline.run_category(name, pipeline.run_shard),
        )

    @flow(name="datagen", flow_run_name="{run_name}", persist_result=False, validate_parameters=False)
    async def datagen_flow(run_name: str, unit_key: str) -> dict[str, Any]:
        updater = asyncio.create_task(_artifact_loop(session, link))
        try:
            await track(units.pop(unit_key), pipeline.run_categories(category))
        finally:
            updater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await updater
        if not link.down:
            try:
                await acreate_markdown_artifact(
                    markdown=progress_markdown(session),
                    key=f"{_key(session)}-summary",
                    description="run summary",
                )
            except Exception:
                log.warning("could not write the summary artifact", exc_info=True)
        return session.snapshot()

    return datagen_flow, units


async def run_with_prefect(session: RunSession, link: PrefectLink) -> None:
    """The run as a Prefect flow run; if Prefect fails around it, the data path goes on without."""
    pipeline = Pipeline(session)
    datagen_flow, units = _datagen_flow(pipeline, link)
    watcher = asyncio.create_task(link.watch())
    try:
        await orchestrated(
            link,
            lambda unit: datagen_flow(run_name=session.config.run.name, unit_key=units.key(unit)),
            pipeline.run_plain,
        )
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if link.down:  # undeliverable: Prefect would retry each at exit, for minutes
            discard_prefect_backlog()
