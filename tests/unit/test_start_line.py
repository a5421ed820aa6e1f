"""The categories' start line: all start together, a failed one holds nobody, a slow one holds briefly,
and one that an orchestrator starts late is waited for (bounded)."""

from __future__ import annotations

import asyncio
import time

from flows.run.pipeline import StartLine


def begun(runners: int, **bounds: float) -> StartLine:
    """A start line whose categories have all begun reading."""
    line = StartLine(runners, **bounds)
    for _ in range(runners):
        line.begin()
    return line


async def test_shards_wait_until_every_category_has_arrived() -> None:
    line = begun(2)
    line.arrive()
    first = asyncio.create_task(line.wait())
    await asyncio.sleep(0.02)
    assert not first.done()
    line.arrive()
    await asyncio.wait_for(first, 1)
    await asyncio.wait_for(line.wait(), 1)  # later shards pass at once


async def test_a_category_that_never_sends_holds_nobody() -> None:
    line = begun(2)
    line.arrive()  # its source could not be read
    line.arrive()
    await asyncio.wait_for(line.wait(), 1)


async def test_a_slow_category_holds_the_others_for_the_patience_only() -> None:
    line = begun(2, patience_s=0.1)
    line.arrive()
    started = time.monotonic()
    await asyncio.wait_for(line.wait(), 2)
    assert 0.09 <= time.monotonic() - started < 1.0


async def test_a_category_started_late_by_the_orchestrator_is_waited_for_past_the_patience() -> None:
    """Prefect starts each category's subflow in turn (12 s apart on a loaded machine): the patience
    for a slow source runs from when the last category began, not from the first one's shards."""
    line = StartLine(2, patience_s=0.1, begin_s=5.0)
    line.begin()
    line.arrive()
    first = asyncio.create_task(line.wait())
    await asyncio.sleep(0.3)  # three patiences: the other category has not begun yet
    assert not first.done()
    line.begin()
    began = time.monotonic()
    await asyncio.wait_for(first, 2)  # its source is slow: the patience, from its beginning
    assert 0.09 <= time.monotonic() - began < 1.0


async def test_a_category_that_never_begins_holds_the_others_for_the_bound_only() -> None:
    line = StartLine(2, patience_s=0.05, begin_s=0.2)
    line.begin()
    line.arrive()
    started = time.monotonic()
    await asyncio.wait_for(line.wait(), 2)
    assert 0.19 <= time.monotonic() - started < 1.0
