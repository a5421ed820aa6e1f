"""What the pipeline holds for a server: "make sure it is up" and "stop it", whoever runs it.

`datagen run` either launches the server itself (`[server] launch = true`: real SGLang or the
simulator, both started by `launcher.py` from the same config) or talks to one someone else
runs. Both sit behind `Engine`, so the run loop calls `ensure_running()` after connection errors
and at the start, and `stop()` at the end, without knowing which it has. The calls block for as
long as a start takes (minutes for a large model): async code calls them with `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flows.say import SAY
from sglang_launch.launcher import LaunchAttempt, ServerHandle, launch_with_ladder
from sglang_launch.placement import Placement
from sglang_launch.server_config import ServerConfig

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """A server endpoint whose liveness the pipeline can ensure."""

    @property
    def url(self) -> str: ...

    @property
    def max_total_num_tokens(self) -> int | None: ...

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[LaunchAttempt]:
        """Start or restart the server if it is not serving; the attempts made (none if it was up).
        ``on_start`` is called as a start begins, in the calling thread: the endpoint's guard then
        says it down for the whole start, not only once it is done."""
        ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Starting:
    """A start under way, for a run's live line: a large model takes minutes to load on its GPUs, and
    a run that only said "starting" looked stuck."""

    since: float
    """When the start began (``time.monotonic``), over every attempt of its ladder."""
    log_path: Path | None = None
    """The log of the attempt running now (None before its process is spawned)."""


class LaunchedEngine:
    """A server process this run owns: started on first use, restarted when it dies, stopped at the end.

    Thread-safe, so that several shard tasks noticing the same dead server cause one restart.
    """

    def __init__(self, cfg: ServerConfig):
        self._cfg = cfg
        self._handle: ServerHandle | None = None
        self._lock = threading.Lock()
        self.attempts: list[LaunchAttempt] = []
        self.starting: Starting | None = None
        """Set while a start or restart is under way."""
        self._placement: tuple[Path, Placement] | None = None
        """The placement of the server now serving, with the log of its start it was read from."""

    def _running(self) -> ServerHandle:
        if self._handle is None:
            raise RuntimeError("the server has not been started yet: call ensure_running() first")
        return self._handle

    @property
    def url(self) -> str:
        return self._running().url

    @property
    def max_total_num_tokens(self) -> int | None:
        return self._running().max_total_num_tokens

    @property
    def handle(self) -> ServerHandle | None:
        return self._handle

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[LaunchAttempt]:
        with self._lock:
            if self._handle is not None and self._handle.alive():
                return []
            if on_start is not None:
                on_start()
            self.starting = Starting(time.monotonic())
            try:
                if self._handle is None:
                    self._handle, attempts = launch_with_ladder(self._cfg, self._attempting)
                else:
                    logger.warning(
                        "server pid %d at %s died; restarting it",
                        self._handle.pid,
                        self._handle.url,
                        extra=SAY,
                    )
                    attempts = self._handle.restart()
            finally:
                self.starting = None
            self.attempts.extend(attempts)
            return attempts

    def placement(self) -> Placement:
        """Where its server computes, from the environment it was started with and the
        ``server_args`` its log echoes: read once per server start, the first time it is asked.

        Each start has its own log, and a restart's process may be placed elsewhere: the log read is
        that of the process serving now (the handle moves to a restart's once it serves, so its log
        has its server_args). Asked at each search for the server's GPUs (the first, and after
        each outage), it reads a start's log once, not a week's log again at every outage."""
        log_path = self._running().log_path
        if self._placement is None or self._placement[0] != log_path:
            self._placement = (log_path, Placement.launched(self._cfg, log_path, os.environ))
        return self._placement[1]

    def _attempting(self, log_path: Path) -> None:
        self.starting = Starting(self.starting.since if self.starting else time.monotonic(), log_path)

    def stop(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.stop()

    def __enter__(self) -> LaunchedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
