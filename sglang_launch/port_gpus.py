"""Which GPUs a server on this machine computes on, found from the port it serves.

Its GPU work is done by the processes under the listener on its port (``port_owner``: the HTTP
server and its schedulers), and NVML lists each GPU's compute processes: where both can be read, the
answer is exact, whatever ``CUDA_VISIBLE_DEVICES`` and device order the server was started with.
The OOM guard reads the GPUs of the server it drives so (``flows/control/vram.py``), and
``diagnose`` judges the GPUs of the server whose log it reads so, where that server still serves
here (a node shared by several servers, each started with its own ``CUDA_VISIBLE_DEVICES``: its log
counts its GPUs from 0, and every GPU judged gave advice for the fullest of them).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from sglang_launch.gpu import GpuSnapshot
from sglang_launch.logparse import ServerArgs
from sglang_launch.port_owner import serving_processes
from sglang_launch.procfs import PROC, command_line


def gpus_of(pids: Collection[int], port: int, snapshot: GpuSnapshot) -> tuple[frozenset[int] | None, str]:
    """The GPUs in ``snapshot`` on which any of ``pids`` (the processes serving ``port``) computes,
    or None and why they cannot be known."""
    if not snapshot.has_process_info:
        return None, "NVML does not list every GPU's processes (vGPU or MIG)"
    gpus = frozenset(gpu.index for gpu in snapshot.gpus if any(p.pid in pids for p in gpu.processes))
    if not gpus:
        return None, (
            f"NVML lists none of the {len(pids)} processes under the listener on port {port} on a GPU "
            "(in a container, its PID namespace hides them)"
        )
    return gpus, f"those of the processes under the listener on port {port}"


def logged_server_gpus(
    args: ServerArgs, snapshot: GpuSnapshot, proc_root: Path = PROC
) -> tuple[frozenset[int] | None, str]:
    """The GPUs of the server whose log echoed ``args``, where it serves on this machine now, or None
    and why not.

    The server on the log's port must be the log's: one of its processes started with the log's
    model path (a log kept from yesterday, its port since taken by another model's server, would
    otherwise have that server's GPUs judged). The same model started again on other GPUs passes:
    the GPUs judged are then where it serves now, and the evidence says how they were found."""
    if args.port is None:
        return None, "the log does not say the server's port"
    pids = serving_processes(args.port, proc_root)
    if not pids:
        return None, f"no process seen serving port {args.port} on this machine"
    if args.model_path is not None and not any(
        _names(command_line(pid, proc_root), args.model_path) for pid in pids
    ):
        return (
            None,
            f"the server on port {args.port} is not the log's (none of its processes names "
            f"{args.model_path})",
        )
    return gpus_of(pids, args.port, snapshot)


def _names(arguments: list[str], value: str) -> bool:
    """Whether a command line gives ``value`` as an argument (``--model-path X`` or ``--model-path=X``)."""
    return any(arg == value or arg.endswith(f"={value}") for arg in arguments)
