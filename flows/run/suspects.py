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

Its reject is retryable (a server that died three times for its own reasons, an OOM at full load,
with one prompt in flight looks the same), and says so (``LONE_SUSPECT``): the next start asks it as
a suspect from the first, alone, and its next outage is its last. A killer then costs one death and
becomes a final reject (``CONVICTED_AGAIN``); before, every start of a scheduled run asked it again
and it brought the server down three times each time. An innocent one is answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from flows.say import SAY

log = logging.getLogger(__name__)

OUTAGE_ROUNDS = 3
"""Server outages (a death, a restart, an endpoint given up on) a prompt may be in flight at: then it
is a retryable reject too, once the run goes on (an outage that stops it counts for no prompt: each
is left for the resume). An outage is not the prompt's fault and spends none of its
``RECOVERY_ROUNDS`` (two in a run, A dying and then B restarting, made a reject of the prompt's first
failure after them), but a prompt that brings down every server it is sent to (a kernel fault on one
input) would have the run restart servers for ever. Three, what it cost before outages were counted
apart: an innocent prompt, in flight minutes, is at three deaths only if servers die every few
minutes; the killer is alone among the suspects at its third (below)."""
SUSPECT_OUTAGES = OUTAGE_ROUNDS - 1
"""Outages a prompt was in flight at that make it a suspect: one before the last, which rejects it."""
LONE_SUSPECT = f"in flight at {OUTAGE_ROUNDS} server outages, the last with no other suspect in flight"
"""How its reject's reason begins: the next start reads it (``convicted``) and asks the prompt alone."""
CONVICTED_AGAIN = (
    "brought the server down again, asked alone after an earlier start's reject "
    f"(in flight at {OUTAGE_ROUNDS} server outages, the last alone)"
)


class SuspectGate:
    """One suspect in flight at a time: entered before a suspect is asked again, left once it settles."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[None] | None = None
        self._said = False

    async def enter(self, prompt_id: str, convicted: bool) -> None:
        """Wait until no other suspect is in flight; the current task holds the turn until ``leave``.

        Said once a run: the first suspect is a prompt in flight at two deaths of its server (or one
        an earlier start rejected so), which a person should hear of, with what follows."""
        if not self._said:
            self._said = True
            why = "an earlier start rejected it so" if convicted else "it was in flight at two server outages"
            log.warning(
                "prompt %s is a suspect (%s): suspects are asked one at a time, the run going on beside "
                "them, so that a prompt that brings the server down is found alone",
                prompt_id,
                why,
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


def convicted(retryable_reasons: Mapping[str, str]) -> set[str]:
    """The ids an earlier start rejected alone among suspects at their last outage, from the reasons
    of a category's retryable rejects (``CategoryState.retryable_reasons``)."""
    return {rid for rid, reason in retryable_reasons.items() if reason.startswith(LONE_SUSPECT)}
