"""One orchestrator per run directory, enforced with an advisory ``flock`` on ``<run>/.lock``.

Two runs of one config started seconds apart used to race: the second removed the first's
temporary shard and the first died in ``os.replace``. A pid file would need stale-lock guessing
after a kill -9; ``flock`` needs none, because the kernel drops the lock when its holder's file is
closed, which death by any signal does. The file itself stays (deleting it would let two processes
lock two different inodes); its text only says who holds it, for the refusal message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

from flows.store.parts import Part

LOCK_FILE = ".lock"


class RunLocked(RuntimeError):
    """Another live process is running in this run directory (the CLI exits 2 with this line).

    ``holder`` is what the holder wrote ("pid N on HOST, started ..."), for a caller's own line.
    """

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class RunDirUnusable(RuntimeError):
    """The run directory cannot be made or written (``output_dir`` a file, read-only, not permitted):
    found before anything else, and said in one line (the CLI exits 2 with it)."""


class RunLock:
    """Hold ``<run_dir>/.lock`` for the life of a run; refuses at once when another process holds it.

    The parts of a run split with ``--part i/K`` share the directory: each holds ``.lock`` shared
    and its own ``.lock-part-i-of-K`` exclusively, so parts run side by side, a part never twice,
    and a whole (unsplit) run never beside any part. ``file`` names another lock with the same rules
    in ``run_dir`` (a deployment's firing lock, ``flows/orchestration/deploy.py``).
    """

    def __init__(self, run_dir: Path, part: Part | None = None, *, file: str = LOCK_FILE) -> None:
        self.path = run_dir / file
        self.part = part
        self._fds: list[int] = []

    def acquire(self) -> None:
        try:
            self._acquire()
        except OSError as error:
            raise RunDirUnusable(
                f"cannot use the run directory {self.path.parent}: {error.strerror or error} "
                f"({error.filename or self.path}); check `output_dir` in [run]"
            ) from None

    def _acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.part is None:
            self._fds = [_take(self.path, fcntl.LOCK_EX, "")]
            return
        whose = f"part {self.part}: "
        shared = _take(self.path, fcntl.LOCK_SH, whose)
        try:
            own = _take(self.path.with_name(f"{self.path.name}-{self.part.label}"), fcntl.LOCK_EX, whose)
        except RunLocked:
            os.close(shared)
            raise
        self._fds = [own, shared]

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._fds = []

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def _take(path: Path, mode: int, whose: str) -> int:
    """Lock ``path`` (exclusive or shared) without waiting; write who holds it, for the next refusal."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunLocked(
            f"{path.parent} is in use by another datagen run ({holder or 'holder unknown'}): "
            "wait for it to end, or stop it; a killed run releases the directory at once",
            holder or "holder unknown",
        ) from None
    os.ftruncate(fd, 0)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    os.pwrite(fd, f"{whose}pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
    return fd


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return ""
