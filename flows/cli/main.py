"""`datagen`: the command line. Each command is a few lines that call the library."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli import deploy as deploy_cli
from flows.cli import export as export_cli
from flows.cli import gpu as gpu_cli
from flows.cli import launch as launch_cli
from flows.cli import prompts as prompts_cli
from flows.cli.console import (
    PROGRESS_EVERY_S,
    answer,
    console,
    fail,
    print_status,
    run_display,
    setup_logging,
)
from flows.config import ConfigError, load_config
from flows.report.status import run_status, status_document
from flows.run.endpoints import ConfigProblem
from flows.runner import demo_config, demo_sim_config, execute, reset_run_dir, sigterm_stops_run
from flows.store.location import LocationError
from flows.store.parts import Part, PartError
from flows.store.run_lock import RunDirUnusable, RunLocked
from flows.store.run_store import FingerprintMismatch, KeyVersionUnknown, PartsMismatch, StoreWriteFailed

app = typer.Typer(
    help="Regenerate EAGLE-3 drafter training data through SGLang servers, resumable exactly once.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO (default: warnings only).")]
NoPrefect = Annotated[
    bool, typer.Option("--no-prefect", help="Run the same pipeline without Prefect (no UI, no API server).")
]


class _Terminated(Exception):
    """The run was cancelled by SIGTERM; the CLI answers it as it answers Ctrl-C."""


async def _stoppable(make: Callable[[], Coroutine[Any, Any, object]]) -> object:
    """Run ``make()`` so that SIGTERM (a scheduler, `kill`) stops it like Ctrl-C (``sigterm_stops_run``)."""
    with sigterm_stops_run() as termination:
        try:
            return await make()
        except asyncio.CancelledError:
            if termination.received:
                raise _Terminated from None
            raise


def _run(make: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Run a coroutine; turn known problems into one readable line and a non-zero exit."""
    from flows.client.errors import RequestError
    from flows.orchestration.link import PrefectUnavailable
    from flows.run.pipeline import SourceError
    from flows.run.pump import RunAborted
    from flows.run.served import NoEndpointAnswers
    from sglang_launch.launcher import CannotLaunch, StartupFailed

    try:
        asyncio.run(_stoppable(make))
    except (
        ConfigError,
        ConfigProblem,
        FingerprintMismatch,
        KeyVersionUnknown,
        PartsMismatch,
        RunDirUnusable,
        RunLocked,
    ) as error:
        fail(str(error))
    except SourceError as error:
        fail(
            f"{error}. Rows finished so far are saved; fix the source and run the same command again "
            "to resume."
        )
    except StartupFailed as error:
        fail(f"{error}. Server logs: the run directory's server-logs/ (see `datagen diagnose`).", 4)
    except CannotLaunch as error:
        fail(f"cannot launch the server: {error}")
    except RunAborted as error:
        fail(f"the run stopped: {error}. Rows finished so far are saved; fix it and rerun to resume.", 3)
    except (PrefectUnavailable, NoEndpointAnswers) as error:
        fail(str(error), 3)
    except StoreWriteFailed as error:
        remedy = "free some space" if error.disk_full else "fix it"
        fail(f"{error}. Rows written so far are saved; {remedy} and run the same command again to resume.", 5)
    except RequestError as error:  # before any prompt: the endpoint refuses the run (misconfigured)
        refused_key = error.status in (401, 403)
        fail(f"cannot use the endpoint: {error.what}" + (KEY_HINT if refused_key else ""), 3)
    except (KeyboardInterrupt, _Terminated):
        fail("interrupted: finished rows are saved; run the same command again to resume.", 130)


KEY_HINT = (
    "; the server refused the API key: set the endpoint's api_key_env (or api_key_secret) to the key "
    "it was started with"
)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="Run config (TOML).", exists=True, dir_okay=False)],
    force: Annotated[
        bool, typer.Option("--force", help="Add to a run made with another prompt/sampling config.")
    ] = False,
    no_prefect: NoPrefect = False,
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            help="Only part i of K (e.g. 2/4, counted from 1): K machines share the prompts by a hash "
            "of their id, each writing its own shards into one output location.",
        ),
    ] = None,
    progress_every: Annotated[
        float,
        typer.Option(
            "--progress-every",
            min=0.1,
            help="Where the output is not a terminal (a file, a pipe): a progress line about every this "
            "many seconds (the first one sooner) and one at the end, in place of the live bar.",
        ),
    ] = PROGRESS_EVERY_S,
    verbose: Verbose = False,
) -> None:
    """Run or resume CONFIG against its endpoints (resume = the same command again)."""
    setup_logging(verbose)
    try:
        cfg = load_config(config)
        split = None if part is None else Part.parse(part)
    except (ConfigError, PartError) as error:
        fail(str(error))
        return
    _run(
        lambda: execute(
            cfg, force=force, use_prefect=not no_prefect, display=run_display(progress_every), part=split
        )
    )


@app.command()
def demo(
    output_dir: Annotated[Path, typer.Option(help="Where the demo run goes.")] = Path("output"),
    no_prefect: NoPrefect = False,
    verbose: Verbose = False,
) -> None:
    """Start the bundled SGLang simulator and regenerate the bundled sample prompts into OUTPUT_DIR/demo."""
    setup_logging(verbose)
    from sglang_launch.simulator import SimulatorProcess

    started = time.monotonic()
    with SimulatorProcess(demo_sim_config()) as sim:
        cfg = demo_config(sim.url, output_dir)
        if reset_run_dir(cfg):
            console.print(f"(replacing the previous demo run in {cfg.run_dir})", markup=False)
        console.print(
            f"simulator (SGLang 0.5.23 surface) at {sim.url}; Prefect: {'off' if no_prefect else 'on'}"
        )
        _run(lambda: execute(cfg, use_prefect=not no_prefect, display=run_display()))
    console.print(f"demo finished in {time.monotonic() - started:.1f} s")


@app.command()
def status(
    run_dir: Annotated[str, typer.Argument(help="A run directory (e.g. output/demo) or its URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    report: Annotated[
        bool, typer.Option("--report", help="Also redraw the plots and rewrite RUN_DIR/report.md.")
    ] = False,
) -> None:
    """Progress per category of a run, read from its finished shards (works on a killed run too)."""
    try:
        found = run_status(run_dir)
    except (FileNotFoundError, LocationError) as error:
        fail(str(error))
    if report:
        from flows.report.summary import report_from_disk
        from flows.store.location import local_path

        local = local_path(run_dir)
        if local is None:
            fail(
                "--report redraws the plots of a local run directory; a run at a URL gets its report "
                "in each machine's local_dir at the end of every start"
            )
            return
        for written in report_from_disk(local):
            console.print(f"report: {written}", markup=False)
    if json_out:
        typer.echo(json.dumps(status_document(found), indent=2))
    else:
        print_status(found, out=answer)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
)
def sim(ctx: typer.Context) -> None:
    """Serve the SGLang-compatible simulator in the foreground (`datagen sim --help` lists its options)."""
    from sglang_launch.simulator.cli import config_from_args
    from sglang_launch.simulator.server import serve

    cfg = config_from_args(list(ctx.args))
    if cfg.port:  # a free port (0) is known only once bound
        console.print(f"simulator at http://{cfg.host}:{cfg.port} (an [[endpoints]] url); Ctrl-C stops it")
    serve(cfg)


def _stop_on_sigterm(signum: int, frame: object) -> None:
    """Outside an event loop (``datagen ui``): SIGTERM stops like Ctrl-C."""
    raise KeyboardInterrupt


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="Port of the server and its UI.")] = 4200,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
) -> None:
    """Start a local Prefect server with its UI (analytics off) until Ctrl-C; prints what to export."""
    from flows.orchestration.server import PrefectServer

    server = PrefectServer(host, port, ui=True)
    try:
        server.start()
    except RuntimeError as error:
        fail(f"{error} (is the port in use? try --port)")
    console.print(f"Prefect UI: {server.ui_url}")
    console.print(f"For runs to report there: export PREFECT_API_URL={server.api_url}")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # `kill` stops the server too, like Ctrl-C
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


app.command()(export_cli.export)
app.command()(deploy_cli.deploy)
app.add_typer(prompts_cli.app)
app.add_typer(gpu_cli.app)
app.add_typer(launch_cli.app)

if __name__ == "__main__":
    app()
