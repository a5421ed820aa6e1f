"""Read the GPUs through NVML (nvidia-ml-py) into plain dataclasses.

This is the only module that imports ``pynvml``: everything that judges the numbers works on the
dataclasses below, so it is testable without a GPU (tests monkeypatch the ``pynvml`` functions) and
the same judgements apply to a saved ``nvidia-smi`` CSV (:mod:`sglang_launch.gpu_csv`).

GPU indices are NVML's, the same as ``nvidia-smi``'s; they ignore ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pynvml

from sglang_launch.argv import redact_argv
from sglang_launch.procfs import PROC


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU; ``name``/``cmdline`` are empty when /proc cannot see it
    (another container or PID namespace). ``used_bytes`` is None when the driver will not say."""

    pid: int
    name: str
    cmdline: str
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU's memory, as nvidia-smi shows it."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """All GPUs at one moment, and where the numbers came from (``nvml`` or a CSV file)."""

    gpus: tuple[GpuInfo, ...]
    source: str
    driver_version: str | None = None
    has_process_info: bool = True
    unreadable: tuple[int, ...] = ()
    """GPUs whose memory could not be read (nvidia-smi's ``[N/A]``): left out of ``gpus``."""

    def only(self, indices: Collection[int]) -> GpuSnapshot:
        """The same moment, for the GPUs ``indices`` names only: a server is judged by its own GPUs,
        not by another job's on the same node."""
        return replace(
            self,
            gpus=tuple(g for g in self.gpus if g.index in indices),
            unreadable=tuple(i for i in self.unreadable if i in indices),
        )


class GpuUnavailableError(RuntimeError):
    """NVML cannot be used here (no NVIDIA driver, no GPU, no permission): one line for people."""


def describe_process(pid: int, proc_root: Path = PROC) -> tuple[str, str]:
    """``(name, redacted command line)`` of ``pid`` from /proc; empty strings when it is not visible."""
    base = proc_root / str(pid)
    try:
        name = (base / "comm").read_text().strip()
        raw = (base / "cmdline").read_bytes()
    except OSError:
        return "", ""
    argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    return name, " ".join(redact_argv(argv))  # a process list must not leak a server's key


def read_gpus(proc_root: Path = PROC) -> GpuSnapshot:
    """Query every GPU's memory and the processes holding it.

    Raises :class:`GpuUnavailableError` (never a raw NVML traceback) when NVML is unusable.
    """
    with _nvml(" (is the NVIDIA driver installed?)"):
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        read = [_read_one(i, proc_root) for i in range(pynvml.nvmlDeviceGetCount())]
    if not read:
        raise GpuUnavailableError("NVML found no NVIDIA GPU")
    listed = all(known for _, known in read)
    return GpuSnapshot(
        gpus=tuple(gpu for gpu, _ in read), source="nvml", driver_version=driver, has_process_info=listed
    )


def read_memory(indices: Collection[int] | None = None) -> list[tuple[int, int]]:
    """(free, total) bytes of the GPUs ``indices`` names, or of every GPU: the light reading a
    controller can take every second (a server's controller reads its server's GPUs only)."""
    with _nvml():
        count = pynvml.nvmlDeviceGetCount()
        absent = sorted(set(indices or ()) - set(range(count)))
        if absent:
            raise GpuUnavailableError(
                f"no GPU {','.join(map(str, absent))} on this machine: NVML counts {count} GPUs"
                + (f" (0-{count - 1}, as nvidia-smi numbers them)" if count else "")
            )
        readings = []
        for index in range(count) if indices is None else sorted(indices):
            mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            readings.append((int(mem.free), int(mem.total)))
    if not readings:
        raise GpuUnavailableError("NVML found no NVIDIA GPU")
    return readings


def read_uuids() -> list[str]:
    """NVML's GPU UUIDs (``GPU-...``) by index: what a ``CUDA_VISIBLE_DEVICES`` of UUIDs names, as
    nvidia-smi numbers it (its indices may count in CUDA's order, not NVML's)."""
    with _nvml():
        return [
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(pynvml.nvmlDeviceGetCount())
        ]


@contextmanager
def _nvml(hint: str = "") -> Iterator[None]:
    """NVML initialised for the queries inside and shut down after, its errors (never a raw NVML
    traceback) as :class:`GpuUnavailableError`; ``hint`` follows the one that it cannot start."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuUnavailableError(f"cannot read NVIDIA GPUs through NVML: {exc}{hint}") from exc
    try:
        yield
    except pynvml.NVMLError as exc:
        raise GpuUnavailableError(f"NVML query failed: {exc}") from exc
    finally:
        pynvml.nvmlShutdown()


def _read_one(index: int, proc_root: Path) -> tuple[GpuInfo, bool]:
    """One GPU's memory and processes, and whether its processes could be listed: vGPU and MIG
    answer the process queries with NotSupported, and the memory figures are still worth judging
    (they were thrown away with the whole snapshot)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    seen: dict[int, GpuProcess] = {}
    listed = True
    for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            procs = query(handle)
        except pynvml.NVMLError:
            listed = False
            continue
        for proc in procs:
            if proc.pid not in seen:  # a process can be both compute and graphics: count it once
                name, cmdline = describe_process(proc.pid, proc_root)
                seen[proc.pid] = GpuProcess(proc.pid, name, cmdline, proc.usedGpuMemory)
    return GpuInfo(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        total_bytes=int(mem.total),
        used_bytes=int(mem.used),
        free_bytes=int(mem.free),
        processes=tuple(sorted(seen.values(), key=lambda p: p.pid)),
    ), listed


def _text(value: str | bytes) -> str:
    """Old nvidia-ml-py releases return bytes, new ones str."""
    return value.decode() if isinstance(value, bytes) else value
