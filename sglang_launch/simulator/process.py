"""Start and stop the simulator: as a subprocess (demo, benchmarks, tests) or in a thread (unit tests).

The subprocess is the realistic setup: the simulator runs on its own interpreter (its own core on
a 2-core box) and can be killed like a real server. The thread variant starts in milliseconds and
exposes the engine for white-box assertions. Both bind loopback only and always stop on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from sglang_launch.ports import LOOPBACK, free_port
from sglang_launch.probe import wait_healthy
from sglang_launch.simulator.config import SimConfig
from sglang_launch.simulator.engine import Engine
from sglang_launch.simulator.server import SHUTDOWN_GRACE_S, create_app


def _temporary_log() -> Path:
    fd, path = tempfile.mkstemp(prefix="sglang-sim-", suffix=".log")
    os.close(fd)
    return Path(path)


STARTUP_TIMEOUT_S = 60.0
"""How long ``start()`` waits for ``/health``: a bound on a hang only. The child imports FastAPI and
uvicorn first: about 1 s on the 2 shared cores, 7-12 s with eight busy processes beside it. The old
15 s was within reach of a loaded CI machine, where a start given up on fails the test that asked."""


class SimulatorError(RuntimeError):
    """The simulator did not come up (the message carries the tail of its log)."""


class SimulatorProcess:
    """The simulator as a child process on a free loopback port; a context manager.

    ``start()`` returns once ``/health`` answers 200 (after ``startup_delay_s`` if set);
    ``stop()`` sends SIGTERM, waits, then SIGKILLs. The child's output goes to ``log_path``
    (a temporary file, removed on stop, when not given).
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        log_path: Path | None = None,
        **overrides: Any,
    ) -> None:
        base = config or SimConfig()
        self.config = base.model_copy(update={"host": LOOPBACK, "port": free_port(), **overrides})
        self.startup_timeout_s = startup_timeout_s
        self._own_log = log_path is None
        self.log_path = log_path or _temporary_log()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (the OpenAI base URL is ``url + "/v1"``)."""
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def pid(self) -> int:
        """Process id of the running simulator."""
        if self._proc is None:
            raise SimulatorError("simulator not started")
        return self._proc.pid

    def start(self) -> SimulatorProcess:
        """Spawn the child and wait until it is healthy."""
        cmd = [
            sys.executable,
            "-m",
            "sglang_launch.simulator",
            "--config-json",
            self.config.model_dump_json(),
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self.wait_healthy(self.startup_timeout_s + self.config.startup_delay_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll ``/health`` every 50 ms until 200; raise ``SimulatorError`` on exit or timeout."""
        proc = self._proc
        outcome = wait_healthy(
            self.url,
            lambda: proc is None or proc.poll() is None,
            timeout_s=timeout_s,
            poll_s=0.05,
            api_key=self.config.api_key,
        )
        if outcome == "failed" and proc is not None:
            raise SimulatorError(f"simulator exited with {proc.returncode}:\n{self.log_tail()}")
        if outcome == "timeout":
            raise SimulatorError(f"simulator not healthy after {timeout_s:.1f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the child's output, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)

    def kill(self) -> None:
        """SIGKILL the child, as a crashed server: connections reset, nothing cleaned up."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self, downtime_s: float | None = None) -> None:
        """Simulated restart through ``POST /sim/restart`` (the process stays; see module docs)."""
        body = {} if downtime_s is None else {"downtime_s": downtime_s}
        httpx.post(self.url + "/sim/restart", json=body, timeout=5.0).raise_for_status()

    def set_faults(self, **fields: Any) -> dict[str, Any]:
        """Change fault knobs at run time; returns the knobs now in force."""
        response = httpx.post(self.url + "/sim/faults", json=fields, timeout=5.0)
        response.raise_for_status()
        faults: dict[str, Any] = response.json()
        return faults

    def set_answers(self, **fields: Any) -> dict[str, Any]:
        """Change the answer knobs at run time (``POST /sim/answers``); returns the knobs now in force."""
        response = httpx.post(self.url + "/sim/answers", json=fields, timeout=5.0)
        response.raise_for_status()
        answers: dict[str, Any] = response.json()
        return answers

    def stats(self) -> dict[str, Any]:
        """``GET /sim/stats``."""
        response = httpx.get(self.url + "/sim/stats", timeout=5.0)
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class ThreadedSimulator:
    """A simulator served from a thread of this process."""

    url: str
    app: Starlette
    config: SimConfig

    @property
    def engine(self) -> Engine:
        """The live engine, for white-box assertions (read it, do not drive it from another thread)."""
        engine: Engine = self.app.state.engine
        return engine


@contextlib.contextmanager
def simulator_in_thread(config: SimConfig | None = None, **overrides: Any) -> Iterator[ThreadedSimulator]:
    """Serve the simulator on a free loopback port from a background thread; stop it on exit."""
    cfg = (config or SimConfig()).model_copy(update={"host": LOOPBACK, **overrides})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    cfg = cfg.model_copy(update={"port": sock.getsockname()[1]})
    app = create_app(cfg)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="sglang-sim")
    thread.start()
    try:
        deadline = time.monotonic() + 10.0
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise SimulatorError("threaded simulator did not start")
            time.sleep(0.01)
        yield ThreadedSimulator(f"http://{LOOPBACK}:{cfg.port}", app, cfg)
    finally:
        server.should_exit = True
        thread.join(10.0)
        sock.close()
