"""``datagen preflight`` and ``datagen diagnose``: a thin typer layer over :mod:`sglang_launch.preflight`
and :mod:`sglang_launch.diagnose`.

Exit codes (both commands): 0 nothing to act on (healthy server / clean GPUs); 1 findings (stale
processes, unbalanced GPUs, too little margin, a bottleneck or a failure in the log); 2 no input
(no NVIDIA driver or GPU, an unreadable file).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, NoReturn

import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sglang_launch.diagnose import Diagnosis
from sglang_launch.diagnose import diagnose as diagnose_log
from sglang_launch.gpu import GpuSnapshot, GpuUnavailableError, read_gpus
from sglang_launch.gpu_csv import parse_gpu_csv
from sglang_launch.judgement import EXIT_NO_INPUT, Thresholds
from sglang_launch.logparse import parse_log
from sglang_launch.memory_math import GIB, ServerMemory, frac, gib, kv_bytes_per_token, server_memory
from sglang_launch.port_gpus import logged_server_gpus
from sglang_launch.preflight import PreflightReport
from sglang_launch.preflight import preflight as preflight_gpus
from sglang_launch.probe import auth_headers

app = typer.Typer(
    help="Check GPUs before launching SGLang, and explain what limits a running (or failed) server.",
    no_args_is_help=True,
)
console = Console(highlight=False, emoji=False)  # command lines and paths shown as they are

GpuCsv = Annotated[
    Path | None,
    typer.Option(
        "--gpu-csv",
        help="Saved `nvidia-smi --query-gpu=index,memory.used,memory.total,memory.free "
        "--format=csv,noheader` (with or without units) instead of reading the GPUs live through NVML.",
    ),
]
BytesPerToken = Annotated[
    int | None, typer.Option("--bytes-per-token", help="KV bytes one token takes on one GPU.")
]
ModelConfig = Annotated[
    Path | None,
    typer.Option(
        "--model-config", help="The model's Hugging Face config.json, to compute KV bytes per token."
    ),
]
Tp = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size, for --model-config.")]
KvDtype = Annotated[
    str, typer.Option("--kv-cache-dtype", help="SGLang's --kv-cache-dtype (auto, fp8_e4m3, ...).")
]
MinMargin = Annotated[
    float, typer.Option("--min-margin-gib", help="GPU memory to keep free for activation peaks.")
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]


@app.command()
def preflight(
    fraction: Annotated[
        float | None, typer.Option("--fraction", min=0.0, max=1.0, help="Proposed --mem-fraction-static.")
    ] = None,
    current_fraction: Annotated[
        float | None,
        typer.Option(
            "--current-fraction",
            min=0.0,
            max=1.0,
            help="The --mem-fraction-static of the server running on these GPUs now.",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="GPU indices of the tensor-parallel group, e.g. 0,1,2,3 (default: all)."),
    ] = None,
    server_info: Annotated[
        str | None,
        typer.Option(
            "--server-info",
            help="A running server's URL or a saved /get_server_info JSON (current fraction, bytes/token).",
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="NAME of the environment variable holding the server's API key."),
    ] = None,
    weights_gib: Annotated[
        float | None, typer.Option("--weights-gib", help="Weights per GPU, for the KV size of a new launch.")
    ] = None,
    bytes_per_token: BytesPerToken = None,
    model_config: ModelConfig = None,
    tp: Tp = 1,
    kv_cache_dtype: KvDtype = "auto",
    gpu_csv: GpuCsv = None,
    min_margin_gib: MinMargin = 2.0,
    json_out: JsonOut = False,
) -> None:
    """GPU memory, processes holding it, balance across GPUs, and headroom for a --mem-fraction-static.

    Exit code 0: nothing to act on; 1: warnings (a process holds GPU memory, unbalanced GPUs, too
    little margin); 2: no NVIDIA driver or GPU, or unreadable input.
    """
    try:
        snapshot = _snapshot(gpu_csv, json_out)
    except GpuUnavailableError as exc:
        _fail(f"{exc}. Pass --gpu-csv with a saved nvidia-smi snapshot to check another machine.", json_out)
    facts = _server_facts(server_info, api_key_env) if server_info else None
    if facts is not None and current_fraction is None:
        current_fraction = facts.mem_fraction_static
    per_token = _bytes_per_token(bytes_per_token, model_config, tp, kv_cache_dtype)
    try:
        report = preflight_gpus(
            snapshot,
            group=_gpu_list(gpus) if gpus else None,
            fraction=fraction,
            current_fraction=current_fraction,
            bytes_per_token=per_token or (facts.bytes_per_token if facts else None),
            basis_bytes=facts.startup_available_bytes if facts else None,
            weights_bytes=round(weights_gib * GIB) if weights_gib is not None else None,
            thresholds=Thresholds(min_margin_bytes=round(min_margin_gib * GIB)),
        )
    except ValueError as exc:
        _fail(str(exc), json_out)
    if json_out:
        _print_json(report)
    else:
        _show_preflight(report)
    raise typer.Exit(report.exit_code)


@app.command()
def diagnose(
    log: Annotated[Path, typer.Argument(help="The SGLang server log (stdout/stderr of launch_server).")],
    gpu_csv: GpuCsv = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", help="How many requests the client kept in flight.")
    ] = None,
    mem_fraction: Annotated[
        float | None,
        typer.Option(
            "--mem-fraction", help="The server's --mem-fraction-static, if the log does not show it."
        ),
    ] = None,
    last_minutes: Annotated[
        float | None,
        typer.Option("--last-minutes", min=0.0, help="Judge only the last N minutes of the log."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="The server's GPU indices as nvidia-smi numbers them, e.g. 4,5,6,7 (default: those of "
            "its processes if it still serves on this machine, else where its server_args in the log "
            "place it; all GPUs if neither says).",
        ),
    ] = None,
    bytes_per_token: BytesPerToken = None,
    model_config: ModelConfig = None,
    tp: Tp = 1,
    kv_cache_dtype: KvDtype = "auto",
    min_margin_gib: MinMargin = 2.0,
    json_out: JsonOut = False,
) -> None:
    """Say what bounds an SGLang server (KV, retractions, prefill, the client...) and what to change.

    The GPU numbers come from --gpu-csv, else live NVML when this machine has a driver; only the
    server's GPUs are judged (--gpus, else those of its processes if it still serves on this machine,
    else its server_args in the log). Exit code 0: healthy; 1: a bottleneck or a failure found; 2:
    unreadable input.
    """
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        _fail(f"cannot read {log}: {exc.strerror or exc}", json_out)
    try:
        snapshot: GpuSnapshot | None = _snapshot(gpu_csv, json_out)
    except GpuUnavailableError:
        snapshot = None  # a log alone still says what bounds the server
    log_read = parse_log(text)
    # live NVML (no CSV from elsewhere) and no --gpus: the log's server, if it serves here, by its port
    serving = (
        logged_server_gpus(log_read.args, snapshot)
        if snapshot is not None and not gpu_csv and not gpus
        else None
    )
    result = diagnose_log(
        log_read,
        snapshot,
        gpu_ids=_gpu_list(gpus) if gpus else None,
        serving=serving,
        concurrency=concurrency,
        bytes_per_token=_bytes_per_token(bytes_per_token, model_config, tp, kv_cache_dtype),
        mem_fraction=mem_fraction,
        last_minutes=last_minutes,
        thresholds=Thresholds(min_margin_bytes=round(min_margin_gib * GIB)),
    )
    if json_out:
        _print_json(result)
    else:
        _show_diagnosis(result)
    raise typer.Exit(result.exit_code)


# --- inputs -------------------------------------------------------------------------------------
def _snapshot(gpu_csv: Path | None, json_out: bool) -> GpuSnapshot:
    """The CSV if given (unreadable: exit 2), else live NVML (raises GpuUnavailableError)."""
    if gpu_csv is None:
        return read_gpus()
    try:
        return parse_gpu_csv(gpu_csv.read_text(), source=f"nvidia-smi csv {gpu_csv.name}")
    except (OSError, ValueError) as exc:
        _fail(f"cannot read {gpu_csv}: {exc}", json_out)


def _gpu_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise typer.BadParameter(
            f"--gpus wants comma-separated GPU indices like 0,1,2,3, not {text!r}"
        ) from exc


def _bytes_per_token(given: int | None, config: Path | None, tp: int, kv_cache_dtype: str) -> int | None:
    if given is not None or config is None:
        return given
    try:
        return kv_bytes_per_token(json.loads(config.read_text()), tp_size=tp, kv_cache_dtype=kv_cache_dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(f"cannot compute KV bytes per token from {config}: {exc}") from exc


def _server_facts(source: str, api_key_env: str | None) -> ServerMemory:
    """Memory facts from a live server (``http://host:port``) or a saved /get_server_info body."""
    headers = auth_headers(os.environ.get(api_key_env) if api_key_env else None)
    try:
        if source.startswith(("http://", "https://")):
            response = httpx.get(source.rstrip("/") + "/get_server_info", headers=headers, timeout=10.0)
            response.raise_for_status()
            body = response.json()
        else:
            body = json.loads(Path(source).read_text())
    except (OSError, ValueError, httpx.HTTPError) as exc:
        raise typer.BadParameter(f"cannot read server info from {source}: {exc}") from exc
    if not isinstance(body, dict):
        raise typer.BadParameter(f"{source} is not a /get_server_info answer (a JSON object)")
    return server_memory(body)


def _fail(message: str, json_out: bool) -> NoReturn:
    if json_out:
        typer.echo(json.dumps({"error": message, "exit_code": EXIT_NO_INPUT}))
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_NO_INPUT)


def _print_json(report: PreflightReport | Diagnosis) -> None:
    typer.echo(json.dumps(asdict(report), default=str, indent=2))


# --- rendering for people ---------------------------------------------------------------------
def _show_preflight(report: PreflightReport) -> None:
    snap = report.snapshot
    table = Table(
        title=f"GPUs ({snap.source}" + (f", driver {snap.driver_version})" if snap.driver_version else ")")
    )
    for column in ("GPU", "name", "total GiB", "used GiB", "free GiB", "processes"):
        table.add_column(column, justify="left" if column in ("name", "processes") else "right")
    for g in snap.gpus:
        if g.index in report.group:
            procs = ", ".join(f"{p.pid} {p.name}".strip() for p in g.processes) or (
                "-" if snap.has_process_info else "(not in CSV)"
            )
            table.add_row(*_row(g.index, g.name, g.total_bytes, g.used_bytes, g.free_bytes), Text(procs))
    console.print(table)
    if report.changes:
        first = report.changes[0]
        title = f"--mem-fraction-static {frac(first.current)} -> {frac(first.proposed)}"
        changes = Table(title=title)
        for column in ("GPU", "extra KV GiB", "extra tokens", "margin GiB"):
            changes.add_column(column, justify="right")
        for index, c in zip(report.group, report.changes, strict=True):
            tokens = f"{c.extra_kv_tokens:,}" if c.extra_kv_tokens is not None else "? (--bytes-per-token)"
            changes.add_row(str(index), f"{gib(c.extra_kv_bytes):.2f}", tokens, f"{gib(c.margin_bytes):.2f}")
        console.print(changes)
        console.print(
            f"extra KV = ({frac(first.proposed)} - {frac(first.current)}) x {gib(first.basis_bytes):.1f} GiB "
            f"({report.basis_source}); margin = free now - extra KV, what stays free for activation peaks."
        )
        if report.safe_fraction is not None:
            console.print(f"highest value leaving the margin free: {frac(report.safe_fraction)}")
    if report.launch:
        b = report.launch
        kv = ""
        if b.kv_bytes is not None:
            kv = f", of which KV {gib(b.kv_bytes):.1f} GiB" if b.kv_bytes > 0 else ", no room for KV"
        tokens = f" ({b.kv_tokens:,} tokens)" if b.kv_tokens and b.kv_tokens > 0 else ""
        console.print(
            f"launch at {frac(b.fraction)}: SGLang lets weights + KV take {frac(b.fraction)} x "
            f"{gib(b.free_before_load_bytes):.1f} GiB free = {gib(b.static_bytes):.1f} GiB{kv}{tokens}; "
            f"{gib(b.margin_bytes):.1f} GiB stay for activations, CUDA graphs and NCCL."
        )
    for f in report.findings:
        console.print(f"{'WARNING' if f.severity == 'warning' else 'note'}: {f.message}", markup=False)
    if not report.findings:
        held = "no process holds GPU memory" if report.snapshot.has_process_info else "no process list here"
        console.print(f"OK: free memory is balanced ({held}).")


def _row(index: int, name: str, total: int, used: int, free: int) -> list[str]:
    return [str(index), name, f"{gib(total):.1f}", f"{gib(used):.1f}", f"{gib(free):.1f}"]


def _show_diagnosis(result: Diagnosis) -> None:
    console.print(result.headline, style="bold", markup=False)
    console.print(result.meaning, style="italic", markup=False)
    console.print("Evidence:")
    for line in result.evidence:
        console.print(f"  - {line}", markup=False)
    if result.advice:
        console.print("Advice:")
        for number, line in enumerate(result.advice, start=1):
            console.print(f"  {number}. {line}", markup=False)
