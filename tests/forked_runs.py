"""Start many short-lived `datagen` processes fast: a pre-imported parent forks each one.

A fresh `datagen run` spends 3-6 s importing (pyarrow, the pandas it pulls in, openai) on the 2
shared cores before its first request, so 20 kill -9s of one run would take minutes of imports. This helper
runs one "zygote" process that imports the CLI once and forks a child per run: the child is the
real command (the same ``flows.cli.main:app`` entry, its own session and process group) and can
be killed with ``os.killpg`` like any orchestrator. The zygote reaps its children itself.

Used as a script by ``Zygote`` (``python tests/forked_runs.py``): reads one JSON list of
arguments per line on stdin, answers the child's pid on stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

# No native threads in the zygote besides jemalloc's (fork-safe): OpenBLAS would start one per core.
_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
ONCE_TIMEOUT_S = 120.0
"""How long a life may take to reach the progress its kill waits for."""


class Zygote:
    """Context manager: ``start(args, log)`` forks a `datagen ARGS` child writing to ``log``."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **_ENV},
        )
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the forking parent did not start: {ready!r}")

    def start(self, args: list[str], log: Path) -> int:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"args": args, "log": str(log)}) + "\n")
        self._proc.stdin.flush()
        return int(self._proc.stdout.readline())

    def killed_after(
        self,
        args: list[str],
        log: Path,
        moment_s: float,
        meanwhile: tuple[float, Callable[[], None]] | None = None,
        once: Callable[[], bool] | None = None,
    ) -> bool:
        """One life of `datagen ARGS`, killed with SIGKILL ``moment_s`` after its start, or, given
        ``once``, ``moment_s`` after ``once()`` first holds (a point of progress, so that the kill
        lands mid-run on a machine of any speed); ``meanwhile`` (seconds in, action) does something to
        its world first (an endpoint dying under it). Whether the run was still going when killed:
        one that had ended was not killed at that moment."""
        pid = self.start(args, log)
        try:
            since = time.monotonic()
            if meanwhile is not None:
                waited, action = meanwhile
                time.sleep(waited)
                action()
            if once is not None:
                deadline = time.monotonic() + ONCE_TIMEOUT_S
                while alive(pid) and not once():
                    assert time.monotonic() < deadline, f"{log.name}: no progress in {ONCE_TIMEOUT_S} s"
                    time.sleep(0.05)
                since = time.monotonic()
            time.sleep(max(since + moment_s - time.monotonic(), 0.0))
            return alive(pid)
        finally:
            kill_9(pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def kill_9(pid: int, timeout_s: float = 30) -> None:
    """kill -9 a forked run's process group and wait until the run itself is gone.

    The run itself is killed too, by pid: a kill drawn at moment 0 can land before the child's
    ``os.setsid()``, while no group ``pid`` exists yet and the child still sits in the zygote's.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} survived kill -9 for {timeout_s} s (state {_state(pid)})")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether ``pid`` is still running (a zombie, killed but not yet reaped, counts as gone)."""
    state = _state(pid)
    return state is not None and state != "Z"


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, Z, ...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _serve() -> None:
    from flows.cli.main import app
    from flows.store.run_store import warm_arrow

    warm_arrow()  # what a run's first shard writer would import (pandas, through pyarrow)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(app, request["args"], request["log"])
        print(pid, flush=True)


def _child(app: object, args: list[str], log: str) -> None:
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    code = 1
    try:
        app(args, prog_name="datagen")  # type: ignore[operator]
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve()
