"""The categories' start line: all start together, a failed one holds nobody, a slow one holds briefly."""

from __future__ import annotations

import asyncio
import time

from flows.run.pipeline import StartLine


async def test_the_first_ready_waits_for_the_others() -> None:
    line = StartLine(2)
    first = asyncio.create_task(line.ready())
    await asyncio.sleep(0.02)
    assert not first.done()
    await asyncio.wait_for(line.ready(), 1)
    await asyncio.wait_for(first, 1)


async def test_a_category_that_never_sends_holds_nobody() -> None:
    line = StartLine(2)
    line.arrive()  # its source could not be read
    await asyncio.wait_for(line.ready(), 1)


async def test_a_slow_category_holds_the_others_for_the_patience_only() -> None:
    line = StartLine(2, patience_s=0.1)
    started = time.monotonic()
    await asyncio.wait_for(line.ready(), 2)
    assert 0.09 <= time.monotonic() - started < 1.0
