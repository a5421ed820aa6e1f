"""`datagen deploy`: a run config on a schedule, served from here or registered on a work pool
(mount with ``app.command()(deploy)``). The work is in ``flows.orchestration.deploy``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import httpx
import typer

from flows.cli.console import console, fail, setup_logging
from flows.config import ConfigError, load_config
from flows.store.parts import Part


def deploy(
    config: Annotated[Path, typer.Argument(help="Run config (TOML).", exists=True, dir_okay=False)],
    cron: Annotated[str | None, typer.Option(help='Fire on a cron schedule (UTC): "0 */6 * * *".')] = None,
    interval: Annotated[float | None, typer.Option(help="Fire every SECONDS.", metavar="SECONDS")] = None,
    pool: Annotated[
        str | None,
        typer.Option(help="Register on this process work pool (created if missing) instead of serving here."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Deployment name (default: the run's name).")] = None,
    fresh_run_names: Annotated[
        bool,
        typer.Option(
            "--fresh-run-names",
            help="Each firing starts a new run <name>-<scheduled UTC time> instead of resuming the run.",
        ),
    ] = False,
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            help="Each firing runs part i of K (e.g. 2/4): one deployment per part, each on its own pool "
            "or machine, sharing one output location.",
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log at INFO (default: warnings).")
    ] = False,
) -> None:
    """Run CONFIG on a schedule: each firing resumes the run (or starts a new one); a busy run is skipped."""
    setup_logging(verbose)
    from flows.orchestration.deploy import Schedule, api_and_ui, deployment_name, register, serve
    from flows.orchestration.link import api_answers

    try:
        schedule = Schedule(cron=cron, interval_s=interval)
        cfg = load_config(config)
        split = None if part is None else Part.parse(part)
    except (ValueError, ConfigError) as error:
        fail(str(error))
    addresses = api_and_ui()
    if addresses is None:
        fail(
            "a deployment needs a Prefect server that outlives this command: start one (`datagen ui`) "
            "and export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    api, ui = addresses
    label = name or (cfg.run.name if split is None else f"{cfg.run.name}-{split.label}")
    what = f"deployment {deployment_name(label)} ({schedule.describe()})"
    # registering on a pool and serving both talk to the API first: one line when it does not answer
    try:
        if pool is None:
            if not asyncio.run(api_answers(api)):  # before saying it serves
                raise httpx.ConnectError("no answer to /health")
            console.print(f"serving {what} from this process; Ctrl-C stops it", markup=False)
            console.print(f"UI: {ui}/deployments (its flow runs: {ui}/runs)", markup=False)
            with contextlib.suppress(KeyboardInterrupt):
                serve(config, schedule, label, fresh_run_names, split)
            console.print(f"stopped serving {what}: its schedule is paused until it is served again")
            return
        deployment_id = asyncio.run(register(config, schedule, label, fresh_run_names, pool, split))
    except (httpx.HTTPError, OSError) as error:
        fail(f"the Prefect API at {api} cannot be reached ({error}): start it (`datagen ui`)", 3)
    console.print(f"{what} registered on work pool {pool!r} at {api}", markup=False)
    console.print(f"UI: {ui}/deployments/deployment/{deployment_id}", markup=False)
    console.print(
        f"Start a worker where the project is installed: PREFECT_API_URL={api} "
        f"uv run prefect worker start --pool {pool}",
        markup=False,
    )
