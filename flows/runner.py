"""Run a config end to end: open the session, run the pipeline (with or without Prefect), summarise.

The CLI's commands are a few lines that call this module.
"""

from __future__ import annotations

import logging
import os
import shutil
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from flows.config import RunConfig, parse_config
from flows.console import LiveProgress, print_summary, warn
from flows.pipeline import run_plain
from flows.prefect_link import PrefectLink, open_link, prefect_env_defaults
from flows.report import write_report
from flows.run_lock import RunLock
from flows.session import ConfigProblem, RunSession
from flows.status import RunStatus, expected_prompts, run_status
from prompts.readers import missing_local
from sglang_launch.simulator import SimConfig

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def configure(verbose: bool) -> None:
    """Quiet, structured logs by default; must run before Prefect is imported (it reads env at import)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    prefect_env_defaults()
    level = "INFO" if verbose else "WARNING"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", level)
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
    )
    for noisy in ("httpx", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def execute(
    config: RunConfig,
    *,
    force: bool = False,
    use_prefect: bool = True,
    show_progress: bool = True,
) -> RunStatus:
    """Run (or resume) the config; return the status read back from disk."""
    missing = [f"{c.name}: {c.source}" for c in config.categories if missing_local(c.source)]
    if missing:
        raise ConfigProblem("prompt source not found (" + "; ".join(missing) + ")")
    with RunLock(config.run_dir):  # one orchestrator per run directory, refused before anything starts
        link: PrefectLink | None = await open_link(warn) if use_prefect else None
        return await _run_session(config, link, force=force, show_progress=show_progress)


async def _run_session(
    config: RunConfig, link: PrefectLink | None, *, force: bool, show_progress: bool
) -> RunStatus:
    session = RunSession(config, force=force)
    progress = LiveProgress(expected_prompts(config)) if show_progress else None
    if progress is not None:
        session.reporters.append(progress.update)
    try:
        async with session:
            if progress is not None:
                progress.__enter__()
            try:
                if link is not None:
                    from flows.prefect_flow import run_with_prefect

                    await run_with_prefect(session, link)
                else:
                    await run_plain(session)
            finally:
                await session.report()
                if progress is not None:
                    progress.__exit__(None, None, None)
    finally:
        if session.fingerprint:  # the run directory was opened: explain it, even after a failure
            status = run_status(config.run_dir)
            summary = write_report(session, status)
    if show_progress:
        print_summary(summary, status)
    return status


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
