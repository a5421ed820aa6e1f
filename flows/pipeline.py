"""The pipeline: categories run side by side, each cut into shards, each shard pumped under the limiter.

The same ``run_categories`` drives the Prefect flow (a flow run per pipeline run, a subflow per
category, a task per shard) and the Prefect-free path; only the shard runner differs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from flows.prompt_stream import MostlyRejected, category_items, take
from flows.pump import RunAborted, pump_shard
from flows.session import RunSession

ShardRunner = Callable[[str, str, int], Coroutine[Any, Any, None]]
"""(session key, category, shard index) -> shard done. Prefect's task or a plain coroutine."""


class SourceError(RuntimeError):
    """A category's prompt source could not be read (missing file, Hub unreachable, corrupt file)."""


SESSIONS: dict[str, RunSession] = {}
"""Live sessions by key: Prefect parameters stay small strings, the objects stay in this process."""


def register(session: RunSession) -> str:
    key = uuid.uuid4().hex
    SESSIONS[key] = session
    return key


async def run_shard(session_key: str, category: str, index: int) -> None:
    """Pump one shard; the items were parked in the session by ``run_category``."""
    session = SESSIONS[session_key]
    items = session.shards.pop((category, index))
    run = session.category(category)
    assert session.limiter is not None
    await pump_shard(
        items,
        limiter=session.limiter,
        category=run.config,
        sampling=run.sampling,
        sink=run.sink,
        patience=session.patience,
    )


def shard_window(session: RunSession) -> int:
    """Shards in flight per category: enough queued prompts to fill the limit across a shard boundary."""
    limit = session.config.concurrency.limit * max(len(session.endpoints), 1)
    size = session.config.store.shard_prompts
    return max(2, -(-limit // size) + 1)


async def run_category(session_key: str, category: str, shard_runner: ShardRunner) -> None:
    """Stream the category's prompts into shards and run a few shards at once."""
    session = SESSIONS[session_key]
    run = session.category(category)
    items = category_items(run.config, session.states[category], run.counts, dedup=session.dedup)
    size = session.config.store.shard_prompts
    window = shard_window(session)
    active: set[asyncio.Task[None]] = set()
    index = 0
    unreadable: SourceError | None = None
    try:
        while True:
            try:
                shard = await asyncio.to_thread(take, items, size)
            except MostlyRejected as error:
                unreadable = SourceError(f"category {category}: {error}")
                break
            except Exception as error:  # the shards already running still finish and are saved
                unreadable = SourceError(f"category {category}: cannot read {run.config.source}: {error}")
                break
            if not shard:
                break
            session.shards[(category, index)] = shard
            task = asyncio.create_task(shard_runner(session_key, category, index))
            active.add(task)
            index += 1
            if len(active) >= window:
                done, _ = await asyncio.wait(active, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    active.discard(finished)
                    finished.result()
        if active:
            await asyncio.gather(*active)
    finally:
        for task in active:
            task.cancel()
        if active:
            await asyncio.gather(*active, return_exceptions=True)
    if unreadable is not None:
        raise unreadable


async def run_categories(session_key: str, category_runner: Callable[[str, str], Awaitable[None]]) -> None:
    """All categories at once: they share the limiter, so the endpoint never idles between them."""
    session = SESSIONS[session_key]
    await asyncio.to_thread(session.load_states)
    results = await asyncio.gather(
        *(category_runner(session_key, c.name) for c in session.config.categories), return_exceptions=True
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    aborted = [f for f in failures if isinstance(f, RunAborted)]
    others = [f for f in failures if not isinstance(f, SourceError | RunAborted)]
    if aborted or others:
        raise (aborted or others)[0]
    if failures:  # only unreadable sources: the other categories ran to the end
        raise SourceError("; ".join(str(f) for f in failures))


async def run_plain(session: RunSession) -> None:
    """The pipeline without Prefect: same code path, no orchestrator (tests, `--no-prefect`)."""
    key = register(session)
    try:
        await run_categories(key, lambda k, name: run_category(k, name, run_shard))
    finally:
        SESSIONS.pop(key, None)
