"""Judge a GPU snapshot before or beside a launch: stale processes, memory no process accounts for,
unbalanced GPUs, and the headroom for a proposed ``--mem-fraction-static``, with the arithmetic. Pure.

Used by ``datagen preflight``, and by ``datagen diagnose`` (:func:`assess_gpus`) to say what the GPUs
of a slow or failed server hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_launch.gpu import GpuSnapshot
from sglang_launch.judgement import DEFAULT_THRESHOLDS, EXIT_FINDINGS, EXIT_OK, Thresholds, gpu_list, size
from sglang_launch.memory_math import (
    FractionChange,
    LaunchBudget,
    frac,
    fraction_change,
    gib,
    launch_budget,
    max_safe_fraction,
)


@dataclass(frozen=True, slots=True)
class GpuFinding:
    """Something about the GPUs a person should know; ``warning`` ones make the exit code 1."""

    kind: str  # "process" | "unattributed" | "unreadable" | "unbalanced" | "low_margin" | "no_kv"
    severity: str  # "warning" | "info"
    gpus: tuple[int, ...]
    message: str


def assess_gpus(
    snapshot: GpuSnapshot,
    group: Sequence[int] | None = None,
    *,
    server_expected: bool = False,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> tuple[GpuFinding, ...]:
    """Processes holding memory (the stale server from a crashed run), memory used by no listed
    process (another container), and unequal free memory across the tensor-parallel ``group``.

    With ``server_expected`` (a server is meant to run there) processes are information, not warnings.
    """
    gpus = [g for g in snapshot.gpus if group is None or g.index in group]
    level = "info" if server_expected else "warning"
    findings: list[GpuFinding] = []
    holders: dict[int, list[tuple[int, int | None]]] = {}
    names: dict[int, str] = {}
    for gpu in gpus:
        for proc in gpu.processes:
            holders.setdefault(proc.pid, []).append((gpu.index, proc.used_bytes))
            names[proc.pid] = proc.cmdline or proc.name
    for pid, places in sorted(holders.items()):
        held = sum(b for _, b in places if b is not None)
        where = ", ".join(f"GPU {i}" for i, _ in places)
        who = names[pid] or "not visible from here (another container or PID namespace)"
        amount = f"{gib(held):.1f} GiB" if held else "memory"
        findings.append(
            GpuFinding(
                "process", level, tuple(i for i, _ in places), f"PID {pid} holds {amount} on {where}: {who}"
            )
        )
    why = (
        "but no process listed (held from another container or PID namespace, or by the driver)"
        if snapshot.has_process_info
        else "(no process list here, from a CSV or a vGPU/MIG driver: a server still running, or a stale one)"
    )
    for gpu in gpus if snapshot.has_process_info or not server_expected else ():
        if not gpu.processes and gpu.used_bytes >= thresholds.unattributed_bytes:
            findings.append(
                GpuFinding(
                    "unattributed",
                    level,
                    (gpu.index,),
                    f"GPU {gpu.index}: {gib(gpu.used_bytes):.1f} GiB used {why}",
                )
            )
    unreadable = [i for i in snapshot.unreadable if group is None or i in group]
    if unreadable:
        findings.append(
            GpuFinding(
                "unreadable",
                "warning",
                tuple(unreadable),
                f"GPU {gpu_list(unreadable)}: no memory reading ([N/A], a GPU in a bad state): not judged",
            )
        )
    if len(gpus) > 1:
        low = min(gpus, key=lambda g: g.free_bytes)
        high = max(gpus, key=lambda g: g.free_bytes)
        if low.free_bytes < thresholds.balance * high.free_bytes:
            short = tuple(g.index for g in gpus if g.free_bytes < thresholds.balance * high.free_bytes)
            findings.append(
                GpuFinding(
                    "unbalanced",
                    "warning",
                    short,
                    f"free memory is unbalanced: GPU {low.index} has {gib(low.free_bytes):.1f} GiB free, "
                    f"GPU {high.index} {gib(high.free_bytes):.1f} GiB; {_gpus(short)} below "
                    f"{thresholds.balance:.0%} of the most free. A tensor-parallel server budgets every GPU "
                    "by the smallest, and SGLang refuses to start (newer versions: warns) below 90%.",
                )
            )
    return tuple(findings)


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """``datagen preflight``'s answer: the GPUs, findings, and the headroom arithmetic asked for."""

    snapshot: GpuSnapshot
    group: tuple[int, ...]
    findings: tuple[GpuFinding, ...]
    changes: tuple[FractionChange, ...]  # per GPU, for a running server (current -> proposed)
    launch: LaunchBudget | None  # for a fresh launch at the proposed fraction
    safe_fraction: float | None
    bytes_per_token: int | None
    basis_source: str  # what the fraction of a running server applies to
    exit_code: int


def preflight(
    snapshot: GpuSnapshot,
    *,
    group: Sequence[int] | None = None,
    fraction: float | None = None,
    current_fraction: float | None = None,
    bytes_per_token: int | None = None,
    basis_bytes: int | None = None,
    weights_bytes: int | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> PreflightReport:
    """Findings plus, when ``fraction`` is given, the headroom arithmetic.

    With ``current_fraction`` (a server runs there now) each GPU gets a :class:`FractionChange`
    (basis: ``basis_bytes``, SGLang's pre-load free memory if known, else the GPU's total). Without
    it, a :class:`LaunchBudget` for the GPU with the least free memory (SGLang budgets by it).
    """
    chosen = tuple(g.index for g in snapshot.gpus if group is None or g.index in group)
    if not chosen:
        found = gpu_list([g.index for g in snapshot.gpus])
        raise ValueError(f"none of GPUs {list(group or [])} exist here (found {found})")
    gpus = [g for g in snapshot.gpus if g.index in chosen]
    judged = chosen + tuple(i for i in snapshot.unreadable if group is None or i in group)
    findings = list(
        assess_gpus(snapshot, judged, server_expected=current_fraction is not None, thresholds=thresholds)
    )
    changes: tuple[FractionChange, ...] = ()
    launch = None
    safe = None
    if fraction is not None and current_fraction is not None:
        changes = tuple(
            fraction_change(
                current_fraction,
                fraction,
                basis_bytes=basis_bytes or g.total_bytes,
                free_bytes=g.free_bytes,
                bytes_per_token=bytes_per_token,
            )
            for g in gpus
        )
        safe = min(
            max_safe_fraction(
                current_fraction,
                basis_bytes=basis_bytes or g.total_bytes,
                free_bytes=g.free_bytes,
                min_margin_bytes=thresholds.min_margin_bytes,
            )
            for g in gpus
        )
        tight = tuple(
            g.index
            for g, c in zip(gpus, changes, strict=True)
            if c.margin_bytes < thresholds.min_margin_bytes
        )
        if tight:
            worst = min(changes, key=lambda c: c.margin_bytes)
            findings.append(
                GpuFinding(
                    "low_margin",
                    "warning",
                    tight,
                    f"--mem-fraction-static {frac(fraction)} leaves ~{size(worst.margin_bytes)} free on "
                    f"GPUs {gpu_list(tight)} (keep >= {size(thresholds.min_margin_bytes)} for activation "
                    f"peaks); highest safe value {frac(safe)}",
                )
            )
    elif fraction is not None:
        binding = min(gpus, key=lambda g: g.free_bytes)
        launch = launch_budget(
            fraction,
            free_before_load_bytes=binding.free_bytes,
            weights_bytes=weights_bytes,
            bytes_per_token=bytes_per_token,
        )
        if launch.margin_bytes < thresholds.min_margin_bytes:
            findings.append(
                GpuFinding(
                    "low_margin",
                    "warning",
                    (binding.index,),
                    f"--mem-fraction-static {frac(fraction)} leaves only {size(launch.margin_bytes)} on GPU "
                    f"{binding.index} for activations, CUDA graphs and NCCL "
                    f"(keep >= {size(thresholds.min_margin_bytes)})",
                )
            )
        if launch.kv_bytes is not None and launch.kv_bytes <= 0 and weights_bytes:
            needed = weights_bytes / binding.free_bytes
            fix = f"it needs a fraction above {needed:.3f}" if needed < 1 else "free memory on that GPU first"
            findings.append(
                GpuFinding(
                    "no_kv",
                    "warning",
                    (binding.index,),
                    f"the weights ({size(weights_bytes)}) do not fit in {frac(fraction)} x "
                    f"{size(binding.free_bytes)} free on GPU {binding.index}: no room for the KV cache "
                    f"(SGLang stops with 'Not enough memory'); {fix}",
                )
            )
    warned = any(f.severity == "warning" for f in findings)
    return PreflightReport(
        snapshot=snapshot,
        group=chosen,
        findings=tuple(findings),
        changes=changes,
        launch=launch,
        safe_fraction=safe,
        bytes_per_token=bytes_per_token,
        basis_source="SGLang's free memory before loading" if basis_bytes else "the GPU's total memory",
        exit_code=EXIT_FINDINGS if warned else EXIT_OK,
    )


def _gpus(indices: Sequence[int]) -> str:
    """``GPU 3 is`` / ``GPUs 3,5 are``, for sentences about some GPUs."""
    return f"GPU {indices[0]} is" if len(indices) == 1 else f"GPUs {gpu_list(indices)} are"
