"""Getting buffered rows to disk without pausing the streams: due shards are written in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flows.store.run_store import ShardWriter

FLUSH_POLL_S = 0.25
"""How often due shards are looked for: rows reach disk within flush_seconds + this."""


class Flusher:
    """Writes every due shard of the writers it is given; ``drain`` writes the rest at shutdown."""

    def __init__(self, writers: Callable[[], list[ShardWriter]]) -> None:
        self._writers = writers
        self._writing: asyncio.Future[str | None] | None = None

    async def loop(self) -> None:
        """Write due shards in a worker thread, so an fsync never pauses the streams being read.

        Each write is shielded: cancelling the loop at shutdown lets a shard being written finish
        (``drain`` waits for it) instead of leaving its rows neither buffered nor on disk. A write
        that fails (``StoreWriteFailed``: a full disk) ends the loop with that error, which stops
        the run (``RunSession.guard``): its rows were not written and are asked again on resume.
        """
        while True:
            await asyncio.sleep(FLUSH_POLL_S)
            for writer in self._writers():
                if writer.due():
                    self._writing = asyncio.ensure_future(asyncio.to_thread(writer.write, writer.take()))
                    await asyncio.shield(self._writing)

    async def settle(self) -> None:
        """Wait for a write under way (if any) to end; a failed one is the loop's error, not raised here."""
        if self._writing is not None:
            await asyncio.wait({self._writing})

    async def drain(self) -> None:
        """After the loop was cancelled: let a write under way end, then write every buffered row.

        Every writer is tried even when one fails (a smaller rejects shard may still fit on a nearly
        full disk; a shard that cannot be built, a row Arrow refuses, is no reason to drop the other
        categories' finished rows); the first failure is raised after.
        """
        await self.settle()
        failures: list[Exception] = []
        for writer in self._writers():
            try:
                writer.flush()
            except Exception as error:
                failures.append(error)
        if failures:
            raise failures[0]
