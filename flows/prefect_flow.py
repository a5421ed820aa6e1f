"""The Prefect face of the pipeline: one flow run per pipeline run, a subflow per category, a task per shard.

Never a task per request: requests are asyncio inside a shard task. Task results are not persisted
or cached: the checkpoint store is the only source of truth for what is done, so re-running the
same command resumes from the store whatever Prefect remembers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any, cast
from uuid import UUID

from prefect import flow, task
from prefect.artifacts import acreate_markdown_artifact, acreate_progress_artifact, aupdate_progress_artifact
from prefect.cache_policies import NO_CACHE

from flows.pipeline import SESSIONS, ShardRunner, register, run_categories, run_category, run_shard
from flows.session import RunSession
from flows.status import progress_fraction, progress_markdown

ARTIFACT_EVERY_S = 5.0
TABLE_EVERY_TICKS = 6
log = logging.getLogger(__name__)


@task(name="shard", cache_policy=NO_CACHE, persist_result=False, task_run_name="{category}-shard-{index}")
async def shard_task(session_key: str, category: str, index: int) -> None:
    await run_shard(session_key, category, index)


@flow(name="category", flow_run_name="{category}", persist_result=False, validate_parameters=False)
async def category_flow(session_key: str, category: str) -> None:
    await run_category(session_key, category, cast(ShardRunner, shard_task))


async def _artifact_loop(session: RunSession) -> None:
    """Progress in the Prefect UI every few seconds, and the live counts table every half minute.

    Not per request: artifacts are API writes. A failed write (the API restarting) is logged and
    retried at the next tick; it never touches the data.
    """
    progress_id: UUID | None = None
    key = _key(session)
    for tick in itertools.count():
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


@flow(name="datagen", flow_run_name="{run_name}", persist_result=False, validate_parameters=False)
async def datagen_flow(run_name: str, session_key: str) -> dict[str, Any]:
    session = SESSIONS[session_key]
    updater = asyncio.create_task(_artifact_loop(session))
    try:
        await run_categories(session_key, category_flow)
    finally:
        updater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await updater
    await acreate_markdown_artifact(
        markdown=progress_markdown(session), key=f"{_key(session)}-summary", description="run summary"
    )
    return session.snapshot()


async def run_with_prefect(session: RunSession) -> None:
    key = register(session)
    try:
        await datagen_flow(run_name=session.config.run.name, session_key=key)
    finally:
        SESSIONS.pop(key, None)
