"""Keeping a week-long run alive through server deaths: wait for the server, or restart it.

A request whose retries are exhausted while the server is down should not become a reject: the
prompt is fine, the server is not. The guard answers "is the endpoint serving again?" once for all
the requests that noticed (single flight), restarting the server when this run launched it, and
gives up only after ``patience_s`` of continuous outage. With several endpoints, the pump waits
less (``failover_after_s``) and moves the prompt to an endpoint that answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from flows.client.endpoint import EndpointClient
from flows.client.errors import TransientRequestError
from flows.say import SAY
from sglang_launch.engine import Engine
from sglang_launch.placement import Placement
from sglang_launch.probe import is_healthy_async

log = logging.getLogger(__name__)
T = TypeVar("T")


class EndpointGuard:
    """Health of one endpoint, and the way back to healthy.

    ``up`` is False while the endpoint is being waited for (or was given up on): its lane then takes
    no new requests (``GuardedLimit``), so an outage does not turn queued prompts into rejects.
    A guard that gave up answers later calls from one health check, not a new wait, so a server
    that is gone for good costs the patience once, not once per prompt.

    ``down`` is narrower: the endpoint was seen down. Every request failing on it has its health
    checked, the lane closed meanwhile, most often on a server that serves, only busy; its
    controllers read ``serves`` as its health, so that such a check is no outage to them.
    """

    def __init__(
        self,
        url: str,
        engine: Engine | None = None,
        *,
        patience_s: float = 1800.0,
        poll_s: float = 2.0,
        ca_bundle: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.ca_bundle = ca_bundle
        self._api_key = api_key
        """The endpoint's key, for a gateway that checks it on ``/health`` too; never logged."""
        self.engine = engine
        self.patience_s = patience_s
        self.poll_s = poll_s
        self.up = True
        self.down = False
        """Seen down since the last health check that passed: a check failed, a start of its server
        began (for the whole start: minutes for a large model), or it was given up on."""
        self.gone = False
        self.recoveries = 0
        self.restarts = 0
        self.outages = 0
        """Times the endpoint was seen down (``down`` set), once until a health check passes: a request
        that saw this count move while it was in flight failed with its server, not for its prompt
        (the pump counts the two apart)."""
        self.on_up: Callable[[], Awaitable[None]] | None = None
        self.admit: Callable[[], Awaitable[bool]] | None = None
        """Asked once the endpoint answers its health check again, before it takes a request: False
        keeps it out (a server back with another model than the run's)."""
        self._passed_at = -math.inf
        """When the last health check that passed began (``time.monotonic``)."""
        self._last_gone_check = -math.inf
        self._lock = asyncio.Lock()
        self._serving: set[asyncio.Task[object]] = set()
        """The tasks awaiting an answer from this endpoint (``serve``)."""
        self._cut: dict[asyncio.Task[object], str] = {}
        """Those of them cancelled by the guard (given up on, its server restarting), not by the run
        stopping, and why."""

    def is_up(self) -> bool:
        """Whether the endpoint takes new requests (False while waited for or given up on)."""
        return self.up

    def serves(self) -> bool:
        """The endpoint's health as its controllers read it once a tick (the adaptive law, a fixed
        lane's ``OomHold``): False only while it is seen down (``down``). Not ``is_up``: a tick within
        the passing health check of a request's failure read the endpoint down, the next one up, and
        that was a restart to them (``Comeback``): the law's limit back at its cautious start and
        growth held for a request's life, on a busy server that never stopped."""
        return not self.down

    async def healthy(self) -> bool:
        """``GET /health`` answered 200; async, so that many silent endpoints hold no threads."""
        return await is_healthy_async(self.url, api_key=self._api_key, ca_bundle=self.ca_bundle)

    async def recover(self, patience_s: float | None = None) -> bool:
        """True once the endpoint serves again; False after ``patience_s`` (default: the guard's).

        A caller that asked before the last passing health check began is answered by it: the
        requests one outage failed wait on the lock for one check. One that asked after it began
        gets a check of its own, its failure being newer news. Answered by any check of the last
        second before, a request on a server that died again right after coming back was told it
        serves: its failures counted as its prompt's, three a reject, while the run stopped on
        the dead server."""
        asked = time.monotonic()
        async with self._lock:
            if self.up and asked < self._passed_at:
                return True
            if self.gone:
                # one health check a poll for all the requests still on it: each checked in turn
                # under the lock, a host that drops packets (a 5 s timeout) held 256 requests ~20 min
                if time.monotonic() - self._last_gone_check < self.poll_s:
                    return False
                self._last_gone_check = time.monotonic()
                return await self._mark_if_healthy()
            self.up = False
            patience = self.patience_s if patience_s is None else patience_s
            deadline = time.monotonic() + patience
            while True:
                if self.engine is not None:
                    try:
                        # seen down as a start begins, not once it is done: it takes minutes
                        restarting = functools.partial(self._restarting, asyncio.get_running_loop())
                        attempts = await asyncio.to_thread(self.engine.ensure_running, restarting)
                    except Exception as error:  # a start that failed for good: say so, keep the rows
                        log.error("restarting the server at %s failed: %s", self.url, error, extra=SAY)
                        self._give_up()
                        return False
                    if attempts:
                        self.restarts += 1
                        log.warning(
                            "server at %s restarted (%d attempt(s))", self.url, len(attempts), extra=SAY
                        )
                if await self._mark_if_healthy():
                    self.recoveries += 1
                    return True
                began = self._saw_down()
                if time.monotonic() >= deadline:
                    log.error(
                        "%s has not been healthy for %.0f s: giving up on it", self.url, patience, extra=SAY
                    )
                    self._give_up()
                    return False
                if began:  # "answers again" or "giving up" was the first a person heard of an outage
                    log.warning(
                        "%s does not answer its health check: its requests wait up to %.0f s for it",
                        self.url,
                        patience,
                        extra=SAY,
                    )
                await asyncio.sleep(self.poll_s)

    async def serve(self, request: Awaitable[T]) -> T:
        """Await ``request``, made to this endpoint; ``TransientRequestError`` if the guard gives up on
        the endpoint before it is answered, so that the prompt is asked elsewhere.

        A server gone without closing its connections (a host powered off or cut from the network)
        leaves the requests it was answering waiting for the read timeout, an hour by default: its
        other requests failed and moved to endpoints that answer, and these held their shards and the
        run's end for the hour.
        """
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            return await request
        except asyncio.CancelledError:
            if task in self._cut and task.uncancel() == 0:  # ours alone: a stop's cancel stays one
                raise TransientRequestError(f"{self.url} {self._cut[task]} before it answered") from None
            raise
        finally:
            self._serving.discard(task)
            self._cut.pop(task, None)

    def _saw_down(self) -> bool:
        """The endpoint seen down: a failed health check, a start of its server beginning (called by
        ``Engine.ensure_running`` from its thread, while the wait that asked holds the lock: nothing
        else writes these meanwhile), a give-up. Whether this began an outage: however often it is
        seen down until a check passes, one outage."""
        began = not self.down
        if began:
            self.down = True
            self.outages += 1
        return began

    def _give_up(self) -> None:
        """No more waiting for the endpoint: its lane stays closed, its requests still waiting are cut."""
        self._saw_down()
        self.gone = True
        self._cut_serving("was given up on")

    def _restarting(self, loop: asyncio.AbstractEventLoop) -> None:
        """A start of its server begins (called by ``Engine.ensure_running`` from its thread once the
        server is found dead): seen down, and the requests still on the dead server cut, in the
        loop's thread, to wait for the start with the others. Left to their own retries, they were
        sent to the new process while it started: a prompt that brings the server down killed it
        within its start, the start failed, and the run stopped (the simulator, a killer among 40
        prompts: three runs of four)."""
        self._saw_down()
        loop.call_soon_threadsafe(self._cut_serving, "was restarting")

    def _cut_serving(self, why: str) -> None:
        """Cancel the requests awaiting this endpoint: each fails with ``why`` (``serve``)."""
        for task in self._serving - self._cut.keys():
            self._cut[task] = why
            task.cancel()

    def leave_out(self) -> None:
        """Out of service from the start (it did not answer when the run started): ``probe`` brings it
        in once it answers, as an endpoint given up on."""
        self.up = False
        self._give_up()

    async def probe(self) -> None:
        """Bring a lane that was given up on back into service once its server answers again."""
        if self.up or self._lock.locked():
            return
        async with self._lock:
            await self._mark_if_healthy()

    async def _mark_if_healthy(self) -> bool:
        """Back in service if its health check passes. Its return is said only if it was seen down:
        a wait whose first check passes was a request failing on a server that serves (a busy one),
        and "answers again" told a person of an outage that no one saw."""
        began = time.monotonic()
        if not await self.healthy():
            return False
        came_back = not self.up
        if came_back and self.admit is not None and not await self.admit():
            return False
        was_down = self.down
        self.up, self.down, self.gone, self._passed_at = True, False, False, began
        if was_down:
            log.warning("%s answers again", self.url, extra=SAY)
        if came_back and self.on_up is not None:
            await self.on_up()
        return True


@dataclass(frozen=True)
class Endpoint:
    """What a limiter lane holds: the client to send with and the guard to recover with; and for its
    controller's OOM guard, where its free GPU memory is read (None: ``[concurrency] vram``), the
    server's GPUs where the config names them, and for a server the run launched where it placed
    the server serving now (read when asked: ``LaunchedEngine.placement``)."""

    client: EndpointClient
    guard: EndpointGuard
    vram: str | None = None
    gpus: frozenset[int] | None = None
    placement: Callable[[], Placement] | None = None
