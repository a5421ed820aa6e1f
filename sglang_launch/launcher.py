"""Start a server process, wait until it serves, stop it; retry failed starts down the ladder.

One process per attempt, in its own session (so the whole tree, scheduler and detokenizer included,
can be signalled as one process group), recorded in the log folder while it runs, so that a start
can stop a server that a killed run left there (`server_record.py`, `stop_orphans`). Its output
goes through a small pump thread into a log file in the run directory, because SGLang prints its
`server_args` (API key included) at startup and the key must never reach the log. Readiness is
`GET /health` == 200 (SGLang answers 503 while warming up); an attempt that exits or times out
first is classified from its log by `logparse` and, for the memory failures, retried at another
`mem_fraction_static` (the rule is in `ServerConfig`'s docstring, the code in `next_fraction`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from flows.say import SAY
from sglang_launch.argv import REDACTED, build_argv, build_env, redact_argv, secret_values, shown_env
from sglang_launch.logparse import ServerLog, StartupFailure, parse_log
from sglang_launch.ports import free_port
from sglang_launch.probe import Outcome, kv_capacity, server_info, wait_healthy
from sglang_launch.procfs import PROC, processes
from sglang_launch.server_config import ServerConfig
from sglang_launch.server_record import read_records, record_server

logger = logging.getLogger(__name__)


_SHM_DIR = Path("/dev/shm")
_LEFTOVER_GLOBS = (
    "sglang_loads_*.shm",  # SGLang's load-snapshot slots (managers/load_snapshot.py)
    "sem.mp-*",  # named semaphores of its spawn-mode multiprocessing: a stopped 0.5.23 leaves one
)
_KILL_WAIT_S = 5.0


# --- the ladder (pure) -------------------------------------------------------------------------


def retry_direction(kind: str | None, cfg: ServerConfig) -> int:
    """-1: retry with a lower fraction, +1: a higher one, 0: do not retry (see ServerConfig)."""
    if kind in ("cuda_oom", "cuda_graph"):
        return -1
    if kind == "kv_memory":
        return 1
    if kind == "host_memory" and cfg.hicache_size_gb is None:
        return -1
    return 0


def next_fraction(ladder: Sequence[float], failures: Sequence[tuple[float | None, int]]) -> float | None:
    """The fraction for the next attempt, or None to give up.

    `failures` holds (fraction in effect, retry direction) per failed attempt, oldest first. Every
    failure bounds the search (a DOWN failure at f rules out f and above, an UP failure f and
    below), so the ladder never revisits a value and cannot oscillate. When the failed fraction is
    unknown (SGLang chose it and the log did not say), the highest allowed ladder value is next.
    """
    if not failures or failures[-1][1] == 0:
        return None
    last, direction = failures[-1]
    too_small = max((f for f, d in failures if f is not None and d > 0), default=0.0)
    too_large = min((f for f, d in failures if f is not None and d < 0), default=1.0)
    allowed = [f for f in ladder if too_small < f < too_large]
    if last is None or direction < 0:
        return max(allowed, default=None)
    return min(allowed, default=None)


# --- attempts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchAttempt:
    """One start attempt, as reported to the user and kept in the run's records."""

    number: int
    fraction: float | None  # in effect: the one passed, else SGLang's own choice read from its log
    outcome: Outcome
    seconds: float
    log_path: Path
    failure: StartupFailure | None = None

    @property
    def failure_kind(self) -> str | None:
        return self.failure.kind if self.failure else None

    @property
    def fraction_label(self) -> str:
        return "auto" if self.fraction is None else f"{self.fraction:g}"

    def describe(self) -> str:
        what = self.outcome if self.failure is None else f"{self.outcome} ({self.failure.kind})"
        return (
            f"attempt {self.number}: mem_fraction_static={self.fraction_label} {what}"
            f" in {self.seconds:.1f}s, log {self.log_path}"
        )


class CannotLaunch(RuntimeError):
    """Refused before any server ran (the key's variable unset, the port taken, no such interpreter):
    no fraction can help, so it is the caller's input to fix, not a failed start."""


class StartupFailed(RuntimeError):
    """No attempt came up; `attempts` says what each one hit."""

    def __init__(self, attempts: list[LaunchAttempt]):
        self.attempts = attempts
        last = attempts[-1]
        detail = f": {last.failure.explanation} [{last.failure.line.strip()}]" if last.failure else ""
        if not detail:  # an unclassified failure: the server's own last words say most
            detail = f"; its log ends with: {_last_line(last.log_path)}"
        super().__init__(
            f"server did not start after {len(attempts)} attempt(s); last {last.outcome}{detail}"
        )


def _last_line(path: Path) -> str:
    """The server's last line in its log, past the launcher's own header (``_header``)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(HEADER_LINES)]
    if not lines:  # quoting the header's last line read as the server's words
        return "(nothing: the server wrote no line; check [server] python is an interpreter with SGLang)"
    return lines[-1][:300]


# --- process plumbing --------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, found through /proc."""
    return [pid for pid, stat in processes() if stat.pgid == pgid]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_gone(pgid: int, leader_running: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while leader_running() or _group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_group(pgid: int, grace_s: float, leader_running: Callable[[], bool] = lambda: False) -> bool:
    """SIGTERM to a whole process group, SIGKILL after `grace_s`; True once none of it is left.

    The group is signalled even when its leader already exited, because SGLang's scheduler children
    can outlive it. `leader_running` is for a leader that is our own child: /proc does not count its
    zombie, but only reaping it (`Popen.poll`) frees its pid.
    """
    if not (leader_running() or _group_members(pgid)):
        return True
    _signal_group(pgid, signal.SIGTERM)
    if _wait_gone(pgid, leader_running, grace_s):
        return True
    logger.warning("server pid %d ignored SIGTERM for %.0fs; sending SIGKILL", pgid, grace_s, extra=SAY)
    _signal_group(pgid, signal.SIGKILL)
    if _wait_gone(pgid, leader_running, _KILL_WAIT_S):
        return True
    logger.error(  # stuck in the kernel (a driver, NFS): waiting longer froze Ctrl-C
        "server pid %d did not exit even after SIGKILL (stuck in the kernel); it may still hold GPU memory: "
        "`datagen preflight` shows what does",
        pgid,
        extra=SAY,
    )
    return False


def stop_orphans(log_dir: Path, grace_s: float) -> None:
    """Stop every server recorded in `log_dir` whose launcher was killed, before a start beside it.

    Such a server still holds its share of every GPU: the start would fail for memory or get a tiny
    KV cache. Only a process provably the recorded one is signalled (`ServerRecord.orphaned`); a
    server whose launcher lives is left alone, as is a record of another machine. Stale records go.
    """
    for path, record in read_records(log_dir):
        if record.orphaned():
            logger.warning(
                "stopping the SGLang server pid %d that a killed run left on port %d",
                record.server.pid,
                record.port,
                extra=SAY,
            )
            if not stop_group(record.pgid, grace_s):
                continue
            remove_leftover_shm({Path(name) for name in record.shm_before})
        elif not record.stale():
            continue
        path.unlink(missing_ok=True)


def shm_files() -> set[Path]:
    """The /dev/shm files SGLang leaves behind unless they are removed (``_LEFTOVER_GLOBS``)."""
    if not _SHM_DIR.is_dir():
        return set()
    return {path for pattern in _LEFTOVER_GLOBS for path in _SHM_DIR.glob(pattern)}


def _shm_files_in_use() -> set[Path]:
    """/dev/shm files that a live process we can inspect has open (fd) or mapped (mmap, semaphores)."""
    prefix = f"{_SHM_DIR}/"
    in_use: set[Path] = set()
    for proc in PROC.glob("[0-9]*"):
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    in_use.add(Path(os.readlink(fd)))
        with contextlib.suppress(OSError):
            maps = (proc / "maps").read_text()
            in_use.update(
                Path(prefix + line.split(prefix, 1)[1].split()[0])
                for line in maps.splitlines()
                if prefix in line
            )
    return {path for path in in_use if path.parent == _SHM_DIR}


def remove_leftover_shm(existed_before: set[Path]) -> None:
    """Remove the /dev/shm files our server left: new since its spawn, ours, and used by nobody.

    Called once its process group is gone. A file another live server uses is still open or
    mapped there, and files that existed before the spawn are never touched.
    """
    uid = os.geteuid()
    for path in shm_files() - existed_before - _shm_files_in_use():
        with contextlib.suppress(OSError):
            if path.stat().st_uid == uid:
                path.unlink()
                logger.debug("removed %s", path)


def _pump(source: IO[bytes], log: IO[bytes], secrets: list[bytes]) -> None:
    """Copy the server's output to its log line by line, with every secret of its argv replaced.

    Keeps draining even if the log cannot be written (disk full): a server blocked on a full
    stdout pipe would stop serving.
    """
    with source, log:
        for line in iter(source.readline, b""):
            with contextlib.suppress(OSError):
                for secret in secrets:
                    line = line.replace(secret, REDACTED.encode())
                log.write(line)
                log.flush()


class ServerProcess:
    """One spawned server: its process group, its log pump, and its /dev/shm leftovers."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, header: str, port: int):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("wb")
        log.write(header.encode())
        log.flush()
        self._shm_before = shm_files()
        try:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals the whole tree
            )
        except OSError as error:
            log.close()
            raise CannotLaunch(f"cannot run {argv[0]}: {error.strerror}") from error
        assert self.popen.stdout is not None
        self._pump = threading.Thread(
            target=_pump,
            args=(self.popen.stdout, log, [secret.encode() for secret in secret_values(argv)]),
            name=f"server-log-{self.popen.pid}",
            daemon=True,
        )
        self._pump.start()
        self.log_path = log_path
        self._record = record_server(log_path.parent, self.pid, port, redact_argv(argv), self._shm_before)
        self._stopped = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float) -> None:
        """Stop the whole group (`stop_group`); then flush the log, clean shm, drop the record.

        Idempotent. The record stays while the group is not provably gone, for the next start.
        """
        if self._stopped:
            return
        if stop_group(self.pid, grace_s, self.alive) and self._record is not None:
            self._record.unlink(missing_ok=True)
        self._pump.join(timeout=_KILL_WAIT_S)
        remove_leftover_shm(self._shm_before)
        self._stopped = True


# --- one attempt -------------------------------------------------------------------------------


def _check_port_free(host: str, port: int) -> None:
    """Refuse a busy port: /health would otherwise be answered by whoever holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # ("::" read as IPv4 was "in use")
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is fine
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CannotLaunch(f"port {host}:{port} is already in use") from exc


def read_api_key(cfg: ServerConfig) -> str | None:
    """The API key from the environment variable `cfg.api_key_env` names (read at spawn time)."""
    if cfg.api_key_env is None:
        return None
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise CannotLaunch(f"api_key_env names {cfg.api_key_env}, but that environment variable is not set")
    return key


def server_url(host: str, port: int) -> str:
    """Where clients reach a server bound to `host` (a wildcard bind is reached over loopback; an
    IPv6 address in brackets)."""
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{reach}]' if ':' in reach else reach}:{port}"


def _kv_capacity(url: str, log_path: Path, api_key: str | None) -> int | None:
    """From the server, else from SGLang's startup log line `max_total_num_tokens=N, ...`."""
    served = kv_capacity(server_info(url, api_key))
    if served is not None:
        return served
    ranks = parse_log(log_path.read_text(errors="replace")).startup
    return next((r.max_total_num_tokens for r in ranks if r.max_total_num_tokens is not None), None)


HEADER_LINES = ("# datagen launch attempt ", "# argv: ", "# env overrides: ")
"""How the launcher's own lines at the top of each attempt's log begin."""


def _header(number: int, fraction: float | None, argv: list[str], cfg: ServerConfig) -> str:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    env = " ".join(f"{k}={v}" for k, v in shown_env(cfg).items()) or "(none)"
    return (
        f"# datagen launch attempt {number} at {started}, mem_fraction_static={fraction}\n"
        f"# argv: {shlex.join(redact_argv(argv))}\n# env overrides: {env}\n"
    )


@dataclass
class _Started:
    process: ServerProcess
    fraction: float | None
    max_total_num_tokens: int | None


AttemptStarted = Callable[[Path], None]
"""Told each attempt's log as its server process starts: a run's live line says what it waits for."""


def _unwatched(log_path: Path) -> None:
    """An ``AttemptStarted`` for a caller that shows nothing while a server starts."""


def _attempt(
    cfg: ServerConfig, port: int, fraction: float | None, number: int, on_attempt: AttemptStarted
) -> tuple[LaunchAttempt, _Started | None]:
    url = server_url(cfg.host, port)
    api_key = read_api_key(cfg)
    argv = build_argv(cfg, port, fraction, api_key)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    log_path = cfg.log_dir / f"{cfg.engine}-{port}-{stamp}-attempt{number}.log"
    _check_port_free(cfg.host, port)
    began = time.monotonic()
    process = ServerProcess(
        argv, build_env(cfg, os.environ), log_path, _header(number, fraction, argv, cfg), port
    )
    try:
        on_attempt(log_path)
        # the key goes with the wait as with every probe: SGLang ignores it on /health, the server it
        # goes to is the one it was given to, and a wrapper that checks it would otherwise time out
        outcome = wait_healthy(
            url, process.alive, timeout_s=cfg.startup_timeout_s, poll_s=cfg.health_poll_s, api_key=api_key
        )
        kv = _kv_capacity(url, log_path, api_key) if outcome == "ready" else None
    except BaseException:  # Ctrl-C / SIGTERM while starting: never leave the server behind
        process.stop(cfg.stop_grace_s)
        raise
    if outcome == "ready":
        attempt = LaunchAttempt(number, fraction, outcome, time.monotonic() - began, log_path)
        return attempt, _Started(process, fraction, kv)
    process.stop(cfg.stop_grace_s)
    log = parse_log(log_path.read_text(errors="replace"))
    return LaunchAttempt(
        number, _in_effect(fraction, log), outcome, time.monotonic() - began, log_path, log.failure
    ), None


def _in_effect(passed: float | None, log: ServerLog) -> float | None:
    """The fraction a server ran at: the one passed, else SGLang's own choice, which its
    ``server_args`` line shows (0.5.x logs the resolved value: ``'mem_fraction_static': 0.874``)."""
    return passed if passed is not None else log.args.mem_fraction_static


def _climb(
    cfg: ServerConfig,
    port: int,
    first: float | None,
    number: int,
    on_attempt: AttemptStarted,
    failures: Sequence[tuple[float | None, int]] = (),
) -> tuple[_Started, list[LaunchAttempt]]:
    """Attempts from `first` down/up the ladder until one serves; raises StartupFailed.

    `failures` are earlier ones (a server that died while serving) that still bound the ladder."""
    attempts: list[LaunchAttempt] = []
    failures = list(failures)
    fraction = first
    while True:
        attempt, started = _attempt(cfg, port, fraction, number + len(attempts), on_attempt)
        attempts.append(attempt)
        logger.info("%s", attempt.describe())
        if started is not None:
            return started, attempts
        failures.append((attempt.fraction, retry_direction(attempt.failure_kind, cfg)))
        fraction = next_fraction(cfg.mem_fraction_ladder, failures)
        if fraction is None:
            raise StartupFailed(attempts)


# --- the handle --------------------------------------------------------------------------------


class ServerHandle:
    """A running server started by `launch_with_ladder`: its URL, KV capacity, and lifecycle.

    The port and the fraction that worked are kept, so a restart comes back at the same URL
    (clients keep working) with the same memory settings, falling back to the ladder only if
    that start fails.
    """

    def __init__(
        self,
        cfg: ServerConfig,
        port: int,
        started: _Started,
        attempts_so_far: int,
        on_attempt: AttemptStarted = _unwatched,
    ):
        self.cfg = cfg
        self.on_attempt = on_attempt
        self.port = port
        self.url = server_url(cfg.host, port)
        self._started = started
        self._attempts_so_far = attempts_so_far

    @property
    def pid(self) -> int:
        return self._started.process.pid

    @property
    def fraction(self) -> float | None:
        return self._started.fraction

    @property
    def max_total_num_tokens(self) -> int | None:
        return self._started.max_total_num_tokens

    @property
    def log_path(self) -> Path:
        return self._started.process.log_path

    def alive(self) -> bool:
        return self._started.process.alive()

    def stop(self) -> None:
        self._started.process.stop(self.cfg.stop_grace_s)

    def restart(self) -> list[LaunchAttempt]:
        """Stop (if still running) and start again on the same port; returns the new attempts.

        A server that died of a memory failure while serving (CUDA out of memory) would die again
        at the fraction it ran at, SGLang's own choice included: the restart climbs from the rung
        below it, as after a failed start; any other death restarts at the same settings.
        """
        self.stop()
        died = parse_log(self.log_path.read_text(errors="replace"))
        direction = retry_direction(died.failure.kind if died.failure else None, self.cfg)
        failures = [(_in_effect(self.fraction, died), direction)] if direction else []
        first = next_fraction(self.cfg.mem_fraction_ladder, failures) if failures else self.fraction
        if failures and first is None:  # no rung left on that side of the fraction that failed
            ran = LaunchAttempt(
                self._attempts_so_far, failures[0][0], "failed", 0.0, self.log_path, died.failure
            )
            raise StartupFailed([ran])
        try:
            started, attempts = _climb(
                self.cfg, self.port, first, self._attempts_so_far + 1, self.on_attempt, failures
            )
        except StartupFailed as failed:
            self._attempts_so_far += len(failed.attempts)
            raise
        self._started = started
        self._attempts_so_far += len(attempts)
        return attempts

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_with_ladder(
    cfg: ServerConfig, on_attempt: AttemptStarted = _unwatched
) -> tuple[ServerHandle, list[LaunchAttempt]]:
    """Start the configured server, moving along the mem-fraction ladder on memory failures.

    ``on_attempt`` is told each attempt's log as it starts (a restart's too). Raises StartupFailed
    (with every attempt) when no attempt serves.
    """
    stop_orphans(cfg.log_dir, cfg.stop_grace_s)
    port = cfg.port or free_port(cfg.host)
    started, attempts = _climb(cfg, port, cfg.mem_fraction_static, 1, on_attempt)
    return ServerHandle(cfg, port, started, len(attempts), on_attempt), attempts
