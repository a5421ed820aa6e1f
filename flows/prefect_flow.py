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
from flows.prefect_link import PrefectLink, discard_prefect_backlog, orchestrated, track
from flows.session import RunSession
from flows.status import progress_fraction, progress_markdown

ARTIFACT_EVERY_S = 5.0
TABLE_EVERY_TICKS = 6
log = logging.getLogger(__name__)

LINKS: dict[str, PrefectLink] = {}
"""The Prefect link of each live session, by session key."""


@task(name="shard", cache_policy=NO_CACHE, persist_result=False, task_run_name="{category}-shard-{index}")
async def shard_task(session_key: str, category: str, index: int) -> None:
    await run_shard(session_key, category, index)


@flow(name="category", flow_run_name="{category}", persist_result=False, validate_parameters=False)
async def category_flow(session_key: str, category: str, unit_key: str) -> None:
    await track(unit_key, run_category(session_key, category, cast(ShardRunner, shard_task)))


async def _category(session_key: str, category: str) -> None:
    """A category as a Prefect subflow, or without Prefect once its API is gone."""
    await orchestrated(
        LINKS.get(session_key),
        lambda unit: category_flow(session_key, category, unit),
        lambda: run_category(session_key, category, run_shard),
    )


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


@flow(name="datagen", flow_run_name="{run_name}", persist_result=False, validate_parameters=False)
async def datagen_flow(run_name: str, session_key: str, unit_key: str) -> dict[str, Any]:
    session = SESSIONS[session_key]
    link = LINKS.get(session_key)
    updater = asyncio.create_task(_artifact_loop(session, link))
    try:
        await track(unit_key, run_categories(session_key, _category))
    finally:
        updater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await updater
    if link is None or not link.down:
        try:
            await acreate_markdown_artifact(
                markdown=progress_markdown(session), key=f"{_key(session)}-summary", description="run summary"
            )
        except Exception:
            log.warning("could not write the summary artifact", exc_info=True)
    return session.snapshot()


async def run_with_prefect(session: RunSession, link: PrefectLink) -> None:
    """The run as a Prefect flow run; if Prefect fails around it, the data path goes on without."""
    key = register(session)
    LINKS[key] = link
    watcher = asyncio.create_task(link.watch())
    try:
        await orchestrated(
            link,
            lambda unit: datagen_flow(run_name=session.config.run.name, session_key=key, unit_key=unit),
            lambda: run_categories(key, lambda k, name: run_category(k, name, run_shard)),
        )
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        LINKS.pop(key, None)
        SESSIONS.pop(key, None)
        if link.down:  # undeliverable: Prefect would retry each at exit, for minutes
            discard_prefect_backlog()
