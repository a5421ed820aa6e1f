"""A fixed limit's OOM guard: free GPU memory read each poll, the lane held while it is under the floor.

An adaptive lane's controller reads free GPU memory and its law backs off below ``min_free_vram_gib``
(``adaptive.py``, rule 2). A fixed lane has no controller, so an endpoint's ``vram`` and ``gpus`` and
``[concurrency] vram`` were silently ignored: ``limit = N`` picks the number in flight, not the risk of
running a server out of memory. ``OomHold`` is that reading for a fixed lane; the lane's ``HeldLimit``
admits at most ``min_limit`` while it holds, the full limit again once memory is back above the floor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from flows.control.adaptive import Comeback, short_of_memory
from flows.control.controller import READ_DEADLINE_S
from flows.control.vram import VramReader, VramSample
from flows.say import SAY

log = logging.getLogger(__name__)


@dataclass
class OomHold:
    """Whether one endpoint's GPUs have less free memory than ``min_free_bytes``, read by ``run``.

    A reading that fails or does not come within ``READ_DEADLINE_S`` is no hold (the reader warned
    that there is no OOM guard), as the adaptive law reads no memory as no back-off."""

    url: str
    reader: VramReader
    min_free_bytes: int
    floor: int
    """What the lane admits at most while held (``min_limit``): its ``HeldLimit`` reads it here."""
    poll_s: float
    healthy: Callable[[], bool]
    """Whether the endpoint serves (``EndpointGuard.serves``: not seen down): back from an outage, its
    server may be a new process on other GPUs, found again before the reading (``Comeback``, as the
    adaptive law).
    Not on memory let go, the law's other sign a fixed lane could read: that comes as the old process
    dies, before the new one listens, when there is nothing to find."""
    holding: bool = False
    holds: int = 0
    comeback: Comeback = field(default_factory=Comeback)

    async def run(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Read every ``poll_s``; ``changed`` (the limiter's notify) wakes the waiters when the
        hold begins or ends."""
        while True:
            await asyncio.sleep(self.poll_s)
            if self.comeback.seen(self.healthy()):
                self.reader.relocate()
            try:
                async with asyncio.timeout(READ_DEADLINE_S):
                    sample = await self.reader.read()
            except TimeoutError:
                sample = None
            if self.observe(sample):
                await changed()

    def observe(self, sample: VramSample | None) -> bool:
        """Hold or not after ``sample``; whether that changed. The first hold is a warning for the
        person running the run, later ones and every end an INFO line."""
        holding = short_of_memory(sample.free_bytes if sample else None, self.min_free_bytes)
        if holding == self.holding:
            return False
        self.holding = holding
        if sample is not None and holding:
            self.holds += 1
            log.log(
                logging.WARNING if self.holds == 1 else logging.INFO,
                "%s: GPU free memory %.2f GiB, under min_free_vram_gib %g (OOM guard): at most %d in "
                "flight until it is back above",
                self.url,
                sample.free_bytes / 2**30,
                self.min_free_bytes / 2**30,
                self.floor,
                extra=SAY if self.holds == 1 else None,
            )
        else:
            log.info("%s: GPU free memory back above min_free_vram_gib: the fixed limit again", self.url)
        return True

    async def aclose(self) -> None:
        await self.reader.aclose()
