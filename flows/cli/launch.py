"""`datagen launch`: start SGLang (or the simulator) with memory settings that fit, and keep it up.

A thin layer: build a ServerConfig from the run config's `[server]` section plus flags, call
`launch_with_ladder`, print every attempt, then serve in the foreground until Ctrl-C / SIGTERM
(or stop at once with `--check`). The server is always stopped on the way out.
"""

from __future__ import annotations

import signal
import time
import tomllib
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flows.cli.console import fail, setup_logging
from sglang_launch.launcher import LaunchAttempt, StartupFailed, launch_with_ladder
from sglang_launch.server_config import SERVER_LOGS, EngineKind, EnvPreset, ParserPreset, ServerConfig

app = typer.Typer(help="Start an inference server with memory settings that fit.", no_args_is_help=True)
console = Console(emoji=False)  # paths, flags and log lines shown as they are


def load_server_section(path: Path) -> dict[str, Any]:
    """The `[server]` table of a TOML run config (empty if it has none).

    Unless the table names a `log_dir`, logs go to the run directory (`[run]` output_dir/name), so
    the log of a launch sits beside the data it served.
    """
    with path.open("rb") as f:
        data = tomllib.load(f)
    section = data.get("server", {})
    if not isinstance(section, dict):
        raise typer.BadParameter(f"[server] in {path} is not a table")
    run = data.get("run", {})
    if "log_dir" not in section and isinstance(run, dict) and isinstance(run.get("name"), str):
        output_dir = Path(run.get("output_dir", "output"))
        section = {**section, "log_dir": output_dir / run["name"] / SERVER_LOGS}
    return section


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--env expects NAME=VALUE, got {pair.split('=')[0]!r}")
        env[name] = value
    return env


def attempts_table(attempts: list[LaunchAttempt]) -> Table:
    """One row per start attempt: what was tried, what happened, where the log is."""
    table = Table("#", "mem_fraction_static", "outcome", "failure", "seconds", "log")
    for a in attempts:
        table.add_row(
            str(a.number),
            a.fraction_label,
            a.outcome,
            a.failure_kind or "",
            f"{a.seconds:.1f}",
            Text(str(a.log_path)),
        )
    return table


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@app.command()
def launch(
    extra_args: Annotated[
        list[str] | None, typer.Argument(help="Passed to the server verbatim (put them after `--`).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Run config TOML; its \\[server] table is the base.")
    ] = None,
    engine: Annotated[EngineKind | None, typer.Option(help="sglang or simulator.")] = None,
    model_path: Annotated[str | None, typer.Option(help="Target model: HF id or directory.")] = None,
    python: Annotated[str | None, typer.Option(help="Interpreter that has sglang installed.")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model name the API answers to.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: a free one).")] = None,
    tp: Annotated[int | None, typer.Option(help="Tensor parallel size.")] = None,
    dp: Annotated[int | None, typer.Option(help="Data parallel size.")] = None,
    mem_fraction_static: Annotated[float | None, typer.Option(help="First fraction tried.")] = None,
    ladder: Annotated[list[float] | None, typer.Option(help="Ladder value (repeat the flag).")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(help="KV cache dtype, e.g. fp8_e4m3.")] = None,
    enable_hierarchical_cache: Annotated[bool | None, typer.Option(help="Host-memory KV tier.")] = None,
    hicache_size_gb: Annotated[int | None, typer.Option(help="Host KV pool in GB.")] = None,
    hicache_ratio: Annotated[float | None, typer.Option(help="Host KV pool / device KV pool.")] = None,
    chunked_prefill_size: Annotated[int | None, typer.Option(help="Prefill chunk tokens; -1 = off.")] = None,
    max_running_requests: Annotated[int | None, typer.Option(help="Cap on running requests.")] = None,
    max_total_tokens: Annotated[int | None, typer.Option(help="Cap on the KV pool (tokens).")] = None,
    context_length: Annotated[int | None, typer.Option(help="Context length override.")] = None,
    reasoning_parser: Annotated[str | None, typer.Option(help="SGLang reasoning parser.")] = None,
    tool_call_parser: Annotated[str | None, typer.Option(help="SGLang tool-call parser.")] = None,
    trust_remote_code: Annotated[bool | None, typer.Option(help="Allow the checkpoint's code.")] = None,
    preset: Annotated[ParserPreset | None, typer.Option(help="Model preset (kimi_k2).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="NAME of the env var holding the API key.")] = None,
    env_preset: Annotated[EnvPreset | None, typer.Option(help="Environment preset (pcie_nccl).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE for the server (repeatable).")] = None,
    startup_timeout_s: Annotated[float | None, typer.Option(help="Seconds to wait for /health.")] = None,
    log_dir: Annotated[Path | None, typer.Option(help="Where server logs go.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Stop as soon as it serves (smoke test).")] = False,
) -> None:
    """Start the server, retrying down the mem-fraction ladder on memory failures; serve until Ctrl-C."""
    setup_logging(verbose=False)  # what the launcher says to the person: `warning:` lines (flows.say)
    flags = {
        k: v
        for k, v in locals().items()
        if k not in ("config", "check", "ladder", "env") and v not in (None, [])
    }
    try:
        section = load_server_section(config) if config else {}
    except (OSError, tomllib.TOMLDecodeError) as unreadable:
        fail(f"cannot read {config}: {unreadable}")
    fields = {**section, **flags}
    if ladder:
        fields["mem_fraction_ladder"] = ladder
    if env:
        fields["env"] = {**fields.get("env", {}), **_env_pairs(env)}
    try:
        cfg = ServerConfig.model_validate(fields)
    except ValidationError as invalid:
        fail(f"invalid server settings: {invalid}")
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)  # a stopped `datagen launch` stops its server
    try:
        code = _serve(cfg, check)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code:
        raise typer.Exit(code)


def _serve(cfg: ServerConfig, check: bool) -> int:
    """Launch, report, and stay until interrupted (or at once with `check`); the exit code."""
    try:
        handle, attempts = launch_with_ladder(cfg)
    except StartupFailed as failed:
        console.print(attempts_table(failed.attempts))
        console.print(f"[red]{escape(str(failed))}[/red]")  # quotes the server's log
        return 1
    except (ValueError, RuntimeError, OSError) as refused:  # before any server ran: no model_path, the
        # key's variable unset, the port taken, no such --python
        fail(f"cannot launch: {refused}")  # exit 2 (the caller restores SIGTERM's handler on the way out)
    with handle:
        console.print(attempts_table(attempts))
        console.print(
            f"serving at {handle.url} (pid {handle.pid}, KV capacity {handle.max_total_num_tokens} tokens)"
        )
        if check:
            return 0
        try:
            while handle.alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            console.print("stopping the server")
            return 0
    console.print(f"[red]the server exited on its own; see {escape(str(handle.log_path))}[/red]")
    return 1
