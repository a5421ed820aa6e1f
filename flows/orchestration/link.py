"""Prefect is the window on a run, never a dependency of its data.

Three failures seen in the field, and what each does here:

- Prefect's temporary server migrates its database on first start; its default start-up timeout
  (20 s) is too short on a busy machine. We raise it (a user's own value wins), start the server
  ourselves before anything is spent, retry once, and otherwise stop with one line
  (``PrefectUnavailable``, exit 3) that says how to run without it.
- A configured ``PREFECT_API_URL`` that does not answer at start: the run goes on without Prefect
  and says so once.
- The API goes away mid-run: a watcher notices, says so once, Prefect's own noisy loggers are
  silenced, new categories run without Prefect, and Prefect failing around a category or the run
  (before its body starts or after it ends) never fails the run. The data path never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from flows.orchestration.zombies import HEARTBEAT_ENV, HEARTBEAT_S, ensure_zombie_automation
from flows.say import SAY

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
STARTUP_TIMEOUT_S = 90
"""Prefect's default is 20 s; a first start migrating its database on 2 busy cores took longer."""
START_ATTEMPTS = 2
WATCH_EVERY_S = 5.0
PROBE_TIMEOUT_S = 5.0
MISSES_BEFORE_DOWN = 2
"""One missed probe can be a GC pause; two in a row (about 10 s) mean the API is gone."""
FINISH_GRACE_S = 5.0
"""After a unit's own work is done, how long Prefect may take to record it while its API is down."""

HOW_TO_RUN_WITHOUT = (
    "run with --no-prefect, or start a server (`uv run prefect server start`) and set "
    f"PREFECT_API_URL=http://127.0.0.1:4200/api, or raise {STARTUP_TIMEOUT_ENV}"
)


STARTING_TEMPORARY_SERVER = "starting a temporary Prefect server (set PREFECT_API_URL to use your own)…"

Waiting = Callable[[str], AbstractContextManager[object]]
"""Shows a person what the run waits for, for as long as it waits (the CLI's spinner or line)."""


class PrefectUnavailable(RuntimeError):
    """Prefect's temporary server did not start: nothing was spent; the CLI exits 3 with this line."""


def prefect_env_defaults(env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Settings Prefect reads at import: set only where the user has not chosen a value."""
    env.setdefault(STARTUP_TIMEOUT_ENV, str(STARTUP_TIMEOUT_S))
    env.setdefault(HEARTBEAT_ENV, str(HEARTBEAT_S))  # a dead run is found in 90 s, not 9 minutes


class _Server(Protocol):
    """The part of Prefect's ``SubprocessASGIServer`` used here (a fake in tests)."""

    port: int | None

    def start(self, timeout: int | None = None) -> None: ...
    def stop(self) -> None: ...


def start_ephemeral(new_server: Callable[[], _Server] | None = None, attempts: int = START_ATTEMPTS) -> None:
    """Start Prefect's temporary API server, retrying a failed start once on a new port.

    Prefect starts it lazily on first use, deep inside the flow engine, where a timeout becomes a
    traceback; starting it here turns that into a retry and then one readable line. Each try is a new
    server: Prefect keeps one per port and its ``stop`` forgets the one stopped, so a retry of that one
    started a server Prefect's client no longer knew (its API URL ended in ``:None``, and Prefect
    started another, in the run's process group).
    """
    from flows.orchestration.temporary_server import TemporaryServer, server_log

    if new_server is None:
        new_server = TemporaryServer
    problem = ""
    for _ in range(attempts):
        server = new_server()
        try:
            server.start()
            return
        except Exception as error:  # Prefect raises a bare RuntimeError with the child's output
            problem = _first_sentence(str(error))
            server.stop()  # a half-started server would hold the port and the database
    timeout = os.environ.get(STARTUP_TIMEOUT_ENV, STARTUP_TIMEOUT_S)
    raise PrefectUnavailable(
        f"Prefect's temporary API server did not start ({attempts} tries, {timeout} s each; "
        f"{problem or 'no reason given'}; its output: {server_log()}): {HOW_TO_RUN_WITHOUT}"
    )


def _first_sentence(text: str) -> str:
    """Prefect appends the server's whole stdout/stderr to its message; keep the first sentence."""
    head = text.split(" stdout:", 1)[0].split(" stderr:", 1)[0].strip()
    return head if len(head) <= 200 else head[:199] + "…"


PREFECT_SERVICE_LOGGERS = ("EventsWorker", "APILogWorker")
"""Prefect's background services log under their class names, outside the ``prefect`` tree."""


def silence_prefect() -> None:
    """Once the API is gone, Prefect logs every failed event and log upload: one warning is ours."""
    for name in [*logging.root.manager.loggerDict, *PREFECT_SERVICE_LOGGERS]:
        if name == "prefect" or name.startswith("prefect.") or name in PREFECT_SERVICE_LOGGERS:
            logging.getLogger(name).disabled = True


def discard_prefect_backlog() -> int:
    """Drop the events and logs Prefect still holds for a dead API; return how many.

    Prefect drains them at exit, one failed connection (about 7 s) each, so a run whose API went
    away would sit for minutes after its data is safe. They can no longer be delivered anyway. This
    reaches into Prefect's private service queues: if they change, exit is merely slow again.
    """
    try:
        from prefect._internal.concurrency.services import _active_services

        dropped = 0
        for service in list(_active_services):
            pending = service._queue
            while True:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    break
                pending.task_done()
                if item is None:  # the stop signal: keep it for the service
                    pending.put_nowait(item)
                    break
                dropped += 1
        return dropped
    except Exception:
        log.debug("could not discard Prefect's backlog", exc_info=True)
        return 0


async def api_answers(api_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Any HTTP answer below 500 counts (a 401 means it is there); no retries, a short timeout."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(api_url.rstrip("/") + "/health")
    except httpx.HTTPError:
        return False
    return response.status_code < 500


def tell(text: str) -> None:
    """A line for the person running the run (``flows.say``): on the CLI a ``warning:`` line, else
    a warning in the log. ``"%s"``: a URL holding a % is no format."""
    log.warning("%s", text, extra=SAY)


@dataclass
class PrefectLink:
    """Whether Prefect's API answers, as seen by this run; says once when it stops."""

    api_url: str
    down: bool = False
    warned: bool = False
    say: Callable[[str], None] = field(default=tell)

    def lost(self, why: str) -> None:
        self.down = True
        if not self.warned:
            self.warned = True
            self.say(
                f"the Prefect API ({self.api_url}) is not answering ({why}): the run goes on and "
                "keeps writing rows, but the Prefect UI is not being updated"
            )
            silence_prefect()

    async def watch(self, probe: Callable[[str], Awaitable[bool]] = api_answers) -> None:
        """Probe the API every few seconds for the whole run (cancelled at its end)."""
        misses = 0
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            if await probe(self.api_url):
                misses = 0
                self.down = False
            else:
                misses += 1
                if misses >= MISSES_BEFORE_DOWN:
                    self.lost("no answer to /health")


async def open_link(waiting: Waiting | None = None) -> PrefectLink | None:
    """Prepare Prefect for a run: a link to use it, or None to run without it (already said why).

    The temporary server's start is shown through ``waiting``: about 20 s on 2 busy cores (Prefect's
    server imported, its database migrated) in which the terminal showed nothing, as if hung.
    Raises ``PrefectUnavailable`` when the temporary server does not start.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    configured = PREFECT_API_URL.value()
    if not configured and not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        raise PrefectUnavailable(
            f"no PREFECT_API_URL and Prefect's temporary server is disabled: {HOW_TO_RUN_WITHOUT}"
        )
    if configured:
        if not await api_answers(configured):
            tell(
                f"the Prefect API at {configured} is not answering: running without Prefect "
                "(rows are written as usual; the Prefect UI is not updated)"
            )
            return None
        try:
            await ensure_zombie_automation()
        except Exception:
            log.warning("could not create the automation that marks dead flow runs Crashed", exc_info=True)
        return PrefectLink(configured)
    with contextlib.nullcontext() if waiting is None else waiting(STARTING_TEMPORARY_SERVER):
        from flows.orchestration.temporary_server import start_in_lasting_thread

        await start_in_lasting_thread(start_ephemeral)
    from prefect.server.api.server import SubprocessASGIServer

    return PrefectLink(SubprocessASGIServer().api_url)


@dataclass
class Unit:
    """What happened to one flow body (a category, the run) that Prefect wraps."""

    started: bool = False
    finished: bool = False
    error: BaseException | None = None


async def track(unit: Unit, body: Awaitable[None]) -> None:
    """Run a flow's body, recording whether it started, finished or raised (called inside the flow)."""
    unit.started = True
    try:
        await body
    except BaseException as error:
        unit.error = error
        raise
    unit.finished = True


async def orchestrated(
    link: PrefectLink | None,
    via_prefect: Callable[[Unit], Coroutine[Any, Any, object]],
    plain: Callable[[], Awaitable[None]],
) -> None:
    """Run a unit under Prefect (``via_prefect(unit)`` must ``track`` it), or without when it fails.

    The body's own outcome decides: its error is raised as is; any other error is Prefect's. If the
    body never started it runs without Prefect; if it finished, the run goes on. Once the body is
    done and the API is down, Prefect gets ``FINISH_GRACE_S`` to record it, then is abandoned
    (its client would otherwise retry for about a minute per unit).
    """
    if link is None or link.down:
        await plain()
        return
    unit = Unit()
    try:
        await _until_done_or_abandoned(asyncio.ensure_future(via_prefect(unit)), unit, link)
        return
    except Exception as error:
        if unit.error is not None:
            raise unit.error from None  # the body's own failure, whatever Prefect made of it
        link.lost(f"{type(error).__name__}: {error}"[:200])
        if unit.finished:
            return
        if unit.started:  # stopped mid-body by Prefect itself: its rows are saved, surface it
            raise
    await plain()


async def _until_done_or_abandoned(task: asyncio.Future[object], unit: Unit, link: PrefectLink) -> None:
    grace_left = FINISH_GRACE_S
    while not task.done():
        try:
            await asyncio.wait({task}, timeout=1.0)
        except asyncio.CancelledError:  # Ctrl-C / SIGTERM: stop the body too, as awaiting it would
            task.cancel()
            await asyncio.wait({task}, timeout=FINISH_GRACE_S)
            raise
        if task.done() or not (unit.finished and link.down):
            continue
        grace_left -= 1.0
        if grace_left <= 0:
            await _abandon(task)
            return
    task.result()


async def _abandon(task: asyncio.Future[object]) -> None:
    """Cancel Prefect's bookkeeping; its crash handler may await the API again, so cancel repeatedly."""
    for _ in range(20):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            break
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: Prefect's own failure, already reported by ``lost``
