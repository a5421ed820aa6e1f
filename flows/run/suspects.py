"""Prompts in flight at two server outages are asked again one at a time: a killer is found alone.

A prompt that brings the server down (a kernel fault on one input) takes every request in flight
down with it, and after each restart the run asks them all again, the killer among them: counted
per prompt, every one of them was in flight at the three deaths that make a prompt a reject, and
the batch beside the killer (up to the whole limit, on a lone server) was rejected with it; a
resume asked them all again, and the killer brought the server down three more times.

So a prompt in flight at ``SUSPECT_OUTAGES`` outages is a suspect, and a suspect is asked again only
while no other suspect is in flight (``SuspectGate``, one per run, across its categories and
endpoints). Prompts that are no suspects fill the batch meanwhile, so the run goes on at its pace;
only at the end of a run with many suspects do they trickle one a request's life. At the killer's
next death it is the only suspect in flight: its third outage makes it the only reject, and every
other prompt in flight then was at fewer than three.
"""

from __future__ import annotations

import asyncio
import logging

from flows.say import SAY

log = logging.getLogger(__name__)

SUSPECT_OUTAGES = 2
"""Outages a prompt was in flight at that make it a suspect: one before the third, which rejects it."""


class SuspectGate:
    """One suspect in flight at a time: entered before a suspect is asked again, left once it settles."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[None] | None = None
        self._said = False

    async def enter(self, prompt_id: str) -> None:
        """Wait until no other suspect is in flight; the current task holds the turn until ``leave``.

        Said once a run: the first suspect is a prompt in flight at two deaths of its server, which
        a person should hear of, with what follows."""
        if not self._said:
            self._said = True
            log.warning(
                "prompt %s was in flight at %d server outages: such prompts are asked again one at a "
                "time, the run going on beside them, so that a prompt that brings the server down "
                "is found alone",
                prompt_id,
                SUSPECT_OUTAGES,
                extra=SAY,
            )
        await self._lock.acquire()
        self._holder = asyncio.current_task()  # no await between: a cancel cannot strand the lock

    def held_by(self, task: asyncio.Task[None]) -> bool:
        return self._holder is task

    def leave(self, task: asyncio.Task[None]) -> None:
        """The task's prompt settled (a row, a reject, a stop): the next suspect's turn, if it held it."""
        if self._holder is task:
            self._holder = None
            self._lock.release()
