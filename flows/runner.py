"""Run a config end to end: open the session, run the pipeline (with or without Prefect), summarise.

The CLI's commands are a few lines that call this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tomllib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from flows.config import RunConfig, parse_config
from flows.orchestration.link import PrefectLink, open_link, prefect_env_defaults
from flows.report.progress_log import ProgressLog
from flows.report.status import RunStatus, run_status
from flows.report.summary import write_report
from flows.run.endpoints import ConfigProblem, SecretLoader
from flows.run.pipeline import Pipeline
from flows.run.session import RunSession
from flows.store.parts import Part
from flows.store.run_lock import RunLock
from prompts.readers import missing_local
from sglang_launch.simulator import SimConfig

log = logging.getLogger(__name__)

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def configure(verbose: bool, handler: logging.Handler | None = None) -> None:
    """Quiet, structured logs by default; must run before Prefect is imported (it reads env at import).

    ``handler``: where log records go (the CLI's terminal, which shows those said to the person
    running the run as ``warning:`` lines, ``flows.say``); by default a stream to stderr. Prefect
    keeps a handler set here (it replaces the root's only where there is none of the user's)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    prefect_env_defaults()
    level = "INFO" if verbose else "WARNING"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", level)
    # run-level events (started, resumed, a category finished, a server restarted) go to the Prefect
    # UI at INFO through the run logger; the terminal shows them only with -v
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", level)
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        handlers=None if handler is None else [handler],
    )
    for each in logging.getLogger().handlers:  # INFO from Prefect's run loggers is for the UI
        each.setLevel(getattr(logging, level))
    for noisy in ("httpx", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class RunDisplay(Protocol):
    """What a person watching the run sees: the CLI's live line and closing summary, or nothing."""

    def start(self) -> None: ...

    def update(self, session: RunSession) -> None: ...

    def stop(self) -> None: ...

    def summary(self, summary: dict[str, Any], status: RunStatus) -> None: ...

    def waiting(self, what: str) -> AbstractContextManager[object]:
        """``what`` the run waits for before it starts (Prefect's temporary server), shown meanwhile."""
        ...


async def execute(
    config: RunConfig,
    *,
    force: bool = False,
    use_prefect: bool = True,
    display: RunDisplay | None = None,
    part: Part | None = None,
) -> RunStatus:
    """Run (or resume) the config, or only its ``part`` of the prompts; return the status read from disk.

    The status is of the whole run (every part's shards): what a person wants to see after a part.
    """
    missing = [f"{c.name}: {c.source}" for c in config.categories if missing_local(c.source)]
    if missing:
        raise ConfigProblem(
            "prompt source not found ("
            + "; ".join(missing)
            + "): fix the category's `source`, or remove the category; nothing was sent"
        )
    with RunLock(config.run_dir, part):  # one orchestrator per run directory (and part), refused at once
        link: PrefectLink | None = None
        if use_prefect:
            link = await open_link(None if display is None else display.waiting)
        return await _run_session(config, link, force=force, display=display, part=part)


async def _run_session(
    config: RunConfig, link: PrefectLink | None, *, force: bool, display: RunDisplay | None, part: Part | None
) -> RunStatus:
    secrets: SecretLoader | None = None
    if link is not None:  # Secret blocks live in Prefect: the orchestration room reads them
        from flows.orchestration.secrets import load_secret

        secrets = load_secret
    session = RunSession(config, force=force, part=part, secrets=secrets)
    session.reporters.append(ProgressLog(config.run_dir))
    opening: asyncio.Task[None] | None = None
    if display is not None:
        session.reporters.append(display.update)
        display.start()
        opening = asyncio.create_task(_show_opening(session, display))
    try:
        try:
            async with session:
                try:
                    if link is not None:
                        from flows.orchestration.flow import run_with_prefect

                        label = None if part is None else part.label
                        await session.guard(run_with_prefect(session, link, label))
                    else:
                        await session.guard(Pipeline(session).run_plain())
                finally:
                    await session.report()
        finally:
            if opening is not None:
                opening.cancel()
            if display is not None:
                display.stop()
    except BaseException as error:
        if session.opened:  # explain the start, even after a failure; a refused one writes nothing
            try:
                write_report(session, run_status(session.store))
            except Exception as also:  # the same full disk, usually: the first error is the one to tell
                log.info("no report after %s: %s", type(error).__name__, also)
        raise
    status = run_status(session.store)
    summary = write_report(session, status)
    if display is not None:
        display.summary(summary, status)
    return status


async def _show_opening(session: RunSession, display: RunDisplay) -> None:
    """The display's updates while the session opens, before its own reports begin: opening launches
    ``[server]`` when asked, minutes for a large model, and the display said only "starting". Only
    while a server starts: a start refused before (a locked run, a changed config) is its one line."""
    engine = session.pool.engine
    while not session.opened:
        if engine is not None and engine.starting is not None:
            display.update(session)
        await asyncio.sleep(session.report_every_s)


@dataclass
class Termination:
    """Whether SIGTERM has stopped the run (set by the handler ``sigterm_stops_run`` installs)."""

    received: bool = False


@contextlib.contextmanager
def sigterm_stops_run() -> Iterator[Termination]:
    """While open, SIGTERM cancels the current task (as asyncio answers Ctrl-C); then the old handler is back.

    Cancelling the task that runs the run is the orderly stop: every ``finally`` runs, in-flight
    requests are cancelled (their connections closed), buffered rows are flushed, the report is
    written and a launched server stopped. A signal handler that raises (Python's, or Prefect's
    ``TerminationSignal`` in a deployment's firing) lands in whatever task happens to run: it kills
    that task mid-step, and in a firing the run went on as if no stop had been asked. Only the first
    SIGTERM counts: a second cancellation landed in the final flush and skipped the rest of it
    (systemd and uv may each pass a SIGTERM on); ``kill -9`` still stops it at once.
    """
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    previous = signal.getsignal(signal.SIGTERM)
    termination = Termination()

    def terminate() -> None:
        if termination.received:
            return
        termination.received = True
        if main is not None:
            main.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        yield termination
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if previous is not None:  # Prefect's engine expects its own handler back for its teardown
            signal.signal(signal.SIGTERM, previous)


DEMO_CONFIG = "demo.toml"


def demo_sim_config() -> SimConfig:
    """A GPU-sized simulated server (116k-token KV pool) at 1/10 of real time, with reasoning on."""
    return SimConfig(port=0, time_scale=0.1, reasoning=True, stop_probability=0.8, log_level="warning")


def demo_config(url: str, output_dir: Path) -> RunConfig:
    """The bundled demo config, pointed at a running simulator."""
    samples = resources.files("prompts") / "samples"
    text = (samples / DEMO_CONFIG).read_text(encoding="utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    data["endpoints"] = [{"url": url}]
    data.setdefault("run", {})["output_dir"] = str(output_dir)
    with resources.as_file(samples) as base:
        return parse_config(data, source=f"prompts/samples/{DEMO_CONFIG}", base=Path(base))


def reset_run_dir(config: RunConfig) -> bool:
    """The demo starts clean each time; real runs never delete anything."""
    if config.run_dir.exists():
        shutil.rmtree(config.run_dir)
        return True
    return False
