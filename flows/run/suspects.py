"""Prompts in flight at two server outages are suspects, asked apart: a killer is found alone.

A prompt that brings the server down (a kernel fault on one input) takes every request in flight
down with it, and after each restart the run asks them all again, the killer among them: counted
per prompt, every one of them was in flight at the three deaths that make a prompt a reject, and
the batch beside the killer (up to the whole limit, on a lone server) was rejected with it; a
resume asked them all again, and the killer brought the server down three more times.

So a prompt in flight at ``SUSPECT_OUTAGES`` outages is a suspect, and suspects take turns
(``SuspectGate``, one per run, across its categories and endpoints): one at a time while other
prompts wait for a slot, which they fill, so the run goes on at its pace; at the killer's next death
it is the only suspect in flight, its third outage makes it the only reject, and every other prompt
in flight then was at fewer than three. With room to spare (the run's last prompts) they go
together, half as many after each death among them (``SuspectGate``).

Its reject is retryable (a server that died three times for its own reasons, an OOM at full load,
with one prompt in flight looks the same), and says so (``LONE_SUSPECT``): the next start asks it as
a suspect from the first, alone, and its next outage is its last. A killer then costs one death and
becomes a final reject (``CONVICTED_AGAIN``); before, every start of a scheduled run asked it again
and it brought the server down three times each time. An innocent one is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

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


IDLE_CHECK_S = 1.0
"""How often a suspect waiting for its turn looks whether the run has room to spare."""
UNUSED_S = 2.0
"""Room to spare: no admission has waited for a slot this long (``Limiter.unused_for``). Not "no
prompt waits now": a shard's dispatcher waits for one slot at a time, and between two it waits for
none (measured in the tests: suspects let go together at the start of a run)."""


class SuspectGate:
    """The suspects' turns: one at a time while other prompts wait for a slot, and while none waits
    (the run's last prompts: a slot a suspect waits for would stay empty) as many as ``width``.

    One at a time, a suspect at its next outage is alone, and the outage is counted. Let go together
    at the end of a run (one at a time, 150 suspects of two-minute answers would hold an 8-GPU
    node to one request for five hours), those at an outage together are not counted: which of
    them brings the server down is not known. The next group is half as large (``split``), so a
    killer among n is alone after about log2(n) deaths, each a server restart, where one at a time
    cost n request lives; and an innocent group (a server that died twice for its own reasons) is
    answered at once. A conviction lets the rest go together again.
    """

    def __init__(self, unused_s: float = UNUSED_S) -> None:
        self.unused_s = unused_s
        self._holders: set[asyncio.Task[None]] = set()
        self._entries = 0
        """Turns taken so far: a suspect's request is alone if none was taken while it ran."""
        self._width: int | None = None
        """Suspects let go together while no prompt waits for a slot (None: all of them)."""
        self._split_at: object = None
        """The outage the width was last halved at."""
        self._freed = asyncio.Event()
        self._said = False

    async def enter(self, prompt_id: str, convicted: bool, unused_for: Callable[[], float]) -> None:
        """Wait for a turn (``unused_for``: how long the run's slots have had room that no prompt
        waited for, ``Limiter.unused_for``); the current task holds it until ``leave`` or ``split``.

        Said once a run: the first suspect is a prompt in flight at two deaths of its server (or one
        an earlier start rejected alone), which a person should hear of, with what follows."""
        if not self._said:
            self._said = True
            why = "an earlier start rejected it alone" if convicted else "in flight at two server outages"
            log.warning(
                "prompt %s is a suspect (%s): suspects are asked one at a time while other prompts "
                "wait, the run going on beside them, so that a prompt that brings the server down is "
                "found alone",
                prompt_id,
                why,
                extra=SAY,
            )
        while not self._has_turn(unused_for() > self.unused_s):
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), IDLE_CHECK_S)
        task = asyncio.current_task()
        assert task is not None
        self._holders.add(task)  # no await since the test: no other suspect took the turn meanwhile
        self._entries += 1

    def _has_turn(self, idle: bool) -> bool:
        if not self._holders:
            return True
        return idle and (self._width is None or len(self._holders) < self._width)

    def held_by(self, task: asyncio.Task[None]) -> bool:
        return task in self._holders

    def sent(self, task: asyncio.Task[None]) -> int | None:
        """As the task's request is sent: a mark for ``alone`` if it is the only suspect in flight."""
        return self._entries if self._holders == {task} else None

    def alone(self, sent: int | None) -> bool:
        """Whether the request marked ``sent`` was the only suspect's in flight all along."""
        return sent is not None and self._entries == sent

    def split(self, task: asyncio.Task[None], outage: object) -> None:
        """The task was at ``outage`` (its endpoint's, as the guard counts them) with other suspects:
        half as many as were in flight then go together from now on, and it waits for a turn again.
        Halved once an outage: each of the group comes here in turn, and halved at each, a group of
        40 would go one at a time after its first death (found reading the first version)."""
        if outage != self._split_at:
            self._split_at = outage
            self._width = max(1, len(self._holders) // 2)
        self.leave(task)

    def convicted(self) -> None:
        """A suspect alone at its last outage was rejected: the others may go together again."""
        self._width = None

    def leave(self, task: asyncio.Task[None]) -> None:
        """The task's turn given back (its prompt settled: a row, a reject, a stop), if it held one."""
        if task in self._holders:
            self._holders.discard(task)
            self._freed.set()


def convicted(retryable_reasons: Mapping[str, str]) -> set[str]:
    """The ids an earlier start rejected alone among suspects at their last outage, from the reasons
    of a category's retryable rejects (``CategoryState.retryable_reasons``)."""
    return {rid for rid, reason in retryable_reasons.items() if reason.startswith(LONE_SUSPECT)}
