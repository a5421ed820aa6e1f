"""The categories' start line: all start together, a failed one holds nobody, a slow one holds briefly."""

from __future__ import annotations

import asyncio
import time

from flows.run.pipeline import StartLine


async def test_shards_wait_until_every_category_has_arrived() -> None:
    line = StartLine(2)
    line.arrive()
    first = asyncio.create_task(line.wait())
    await asyncio.sleep(0.02)
    assert not first.done()
    line.arrive()
    await asyncio.wait_for(first, 1)
    await asyncio.wait_for(line.wait(), 1)  # later shards pass at once


async def test_a_category_that_never_sends_holds_nobody() -> None:
    line = StartLine(2)
    line.arrive()  # its source could not be read
    line.arrive()
    await asyncio.wait_for(line.wait(), 1)


async def test_a_slow_category_holds_the_others_for_the_patience_only() -> None:
    line = StartLine(2, patience_s=0.1)
    line.arrive()
    started = time.monotonic()
    await asyncio.wait_for(line.wait(), 2)
    assert 0.09 <= time.monotonic() - started < 1.0
