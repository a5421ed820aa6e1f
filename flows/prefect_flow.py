"""The Prefect face of the pipeline: one flow run per pipeline run, a subflow per category, a task per shard.

Never a task per request: requests are asyncio inside a shard task. Task results are not persisted
or cached: the checkpoint store is the only source of truth for what is done, so re-running the
same command resumes from the store whatever Prefect remembers.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast
from uuid import UUID

from prefect import flow, task
from prefect.artifacts import acreate_markdown_artifact, acreate_progress_artifact, aupdate_progress_artifact
from prefect.cache_policies import NO_CACHE

from flows.pipeline import SESSIONS, ShardRunner, register, run_categories, run_category, run_shard
from flows.session import RunSession
from flows.status import progress_fraction, progress_markdown

ARTIFACT_EVERY_S = 5.0


@task(name="shard", cache_policy=NO_CACHE, persist_result=False, task_run_name="{category}-shard-{index}")
async def shard_task(session_key: str, category: str, index: int) -> None:
    await run_shard(session_key, category, index)


@flow(name="category", flow_run_name="{category}", persist_result=False, validate_parameters=False)
async def category_flow(session_key: str, category: str) -> None:
    await run_category(session_key, category, cast(ShardRunner, shard_task))


async def _artifact_loop(session: RunSession) -> None:
    """Progress in the Prefect UI every few seconds (not per request: artifacts are API writes)."""
    artifact_id: UUID | None = None
    while True:
        fraction = progress_fraction(session)
        percent = round(100.0 * fraction, 1) if fraction is not None else 0.0
        if artifact_id is None:
            artifact_id = await acreate_progress_artifact(
                progress=percent, key=f"{_key(session)}-progress", description="rows + rejects done"
            )
        else:
            await aupdate_progress_artifact(artifact_id=artifact_id, progress=percent)
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
        with contextlib.suppress(asyncio.CancelledError, Exception):
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
