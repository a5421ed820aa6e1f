"""A local Prefect server with its UI (`datagen ui`), started right: on the port asked, its UI calling
that same port (``PREFECT_UI_API_URL``; without it the UI of a server on another port calls 4200),
analytics off. Also used by the tests and the browser check, which need a real server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from sglang_launch.ports import free_port

DEFAULT_PORT = 4200
START_TIMEOUT_S = 180.0


def server_env(host: str, port: int, home: Path | None = None, *, ui: bool = True) -> dict[str, str]:
    """The environment of a server on host:port whose UI talks to that same server."""
    api = f"http://{host}:{port}/api"
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_UI_API_URL": api,
        "PREFECT_API_URL": api,
        "PREFECT_UI_ENABLED": "true" if ui else "false",
    }
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    return env


class PrefectServer:
    """``prefect server start`` in its own process group; ``with`` waits for /health and stops it after."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, home: Path | None = None, *, ui: bool = True
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.home = home
        self.ui = ui
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, quiet: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        argv = [sys.executable, "-m", "prefect", "server", "start"]
        argv += ["--host", self.host, "--port", str(self.port)]
        out = subprocess.DEVNULL if quiet else None
        self.proc = subprocess.Popen(
            argv,
            env=server_env(self.host, self.port, self.home, ui=self.ui),
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited while starting (exit {self.proc.returncode})")
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"prefect server did not answer on {self.api_url} within {timeout_s:.0f} s")

    def wait(self) -> None:
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
