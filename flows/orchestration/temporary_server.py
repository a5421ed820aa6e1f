"""Prefect's temporary API server, out of the terminal's way and still tied to the run's life.

Prefect starts it (``SubprocessASGIServer``) as a plain child, in the run's process group. A
terminal's Ctrl-C is SIGINT to that whole group, so it killed the server under the run: each task
run then failed to report its end, Prefect printed a screen of "Crash detected!" and EventsWorker
lines, and its exit drained logs into the dead API for 15 s to 2 minutes. Here the server is
started in its own session, so a Ctrl-C reaches only the run, which stops in order: its flow runs
are recorded, Prefect's logs and events drained, then the server stopped (Prefect's own ``atexit``).

Out of the group, the server no longer died with it (``kill -9`` of the group, the terminal
closing): on Linux it is asked to stop (SIGTERM) when the thread that started it ends, and that
thread lives as long as the process (``start_in_lasting_thread``).

Its output is not the run's either: Prefect's child wrote its own log records (Prefect's format, at
the run's level) to the run's terminal, past the CLI's log handler and its filter, which see only the
run's process. On the resume after a crashed run it printed "Action failed: 'Failed to set state: Run
is already in terminal state CRASHED.'": an automation (datagen's, which marks dead flow runs Crashed,
is in the database the temporary server shares with a ``prefect server start`` of the same home)
acting on a flow run the resume had marked Crashed already. Such a failure stays in the API as an
event; the server's output goes to ``server_log()``, beside that database.

Appended to by every start, that file grew without bound under scheduled runs. Each start moves the
previous start's output to ``server_log()`` + ``.1`` (replacing the one before) and writes its own to a
new file: the file named by the line of a server that did not start holds that start's output, and a
retried start's first try is in ``.1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from prefect.server.api import server as prefect_server
from prefect.settings import PREFECT_HOME

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SERVER_LOG = "temporary-server.log"


def server_log() -> Path:
    """Where the temporary server writes: a file in Prefect's home holding its latest start's output."""
    return Path(PREFECT_HOME.value()) / SERVER_LOG


def _new_server_log() -> Path:
    """``server_log()``, emptied for a new start: the previous start's output is moved to its ``.1``
    (replacing an older one), so the file stays one start long and the previous start readable."""
    log_path = server_log()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # the first start in this home
        log_path.replace(log_path.with_name(f"{log_path.name}.1"))
    return log_path


def _stop_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when its parent thread ends (None elsewhere).

    The request is made in the child, after the fork: a parent ``kill -9``-ed in between would leave
    it unheard and the server orphaned for good, so the child then stops itself the same way. Its
    parent is gone when it is not ``parent`` (the pid of the process that forks it) any more."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: it will never be heard
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def _in_own_session(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` of a child in a session of its own, stopped with its parent thread (its
    arguments as Popen takes them: Prefect names its command ``args=``)."""
    popen: Callable[..., subprocess.Popen[Any]] = subprocess.Popen
    return popen(*args, start_new_session=True, preexec_fn=_stop_with_parent(os.getpid()), **kwargs)


class _Subprocess:
    """``subprocess`` as Prefect's server module sees it while it starts the server: ``Popen`` in a
    new session (and stopped with its parent), writing to ``server_log()``; everything else is
    ``subprocess``'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        with _new_server_log().open("ab") as log:  # the child has its own copy of the file
            return _in_own_session(*args, stdout=log, stderr=subprocess.STDOUT, **kwargs)


@contextmanager
def _popen_in_own_session() -> Iterator[None]:
    plain = prefect_server.subprocess
    prefect_server.subprocess = _Subprocess()  # type: ignore[assignment]
    try:
        yield
    finally:
        prefect_server.subprocess = plain


class TemporaryServer(prefect_server.SubprocessASGIServer):
    """Prefect's temporary server with its uvicorn child in a session of its own, writing to
    ``server_log()``.

    Created before Prefect first asks for it, it is the instance Prefect's client then uses
    (``SubprocessASGIServer`` keeps one per port), with Prefect's command, settings and stop.
    """

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        with _popen_in_own_session():
            return super()._run_uvicorn_command()


async def start_in_lasting_thread(start: Callable[[], T]) -> T:
    """Run ``start()`` in a thread that then waits until the process ends, and return its result.

    Linux sends the server's death signal when the thread that started it ends, not the process: the
    event loop's worker threads end when ``asyncio.run`` returns, before Prefect's exit drains its
    logs into the server. This thread outlives that (a daemon, it ends with the process).
    """
    loop = asyncio.get_running_loop()
    result: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not result.done():  # cancelled meanwhile (Ctrl-C while the server starts)
            outcome()

    def run() -> None:
        try:
            outcome = functools.partial(result.set_result, start())
        except BaseException as error:
            outcome = functools.partial(result.set_exception, error)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
            loop.call_soon_threadsafe(settle, outcome)
        threading.Event().wait()

    threading.Thread(target=run, name="prefect-temporary-server", daemon=True).start()
    return await result
