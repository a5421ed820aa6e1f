"""Where a server the run launched computes, in nvidia-smi's numbers, where that can be known.

The run places it: through the ``CUDA_VISIBLE_DEVICES`` it starts it with (``[server] env``, or this
process's environment), inside which SGLang's own flags (``--base-gpu-id``, ``--gpu-id-step``, with
the tp, pp and dp sizes) pick the CUDA devices of its ranks; its log echoes those flags as SGLang
resolved them (``ServerArgs.gpu_ids``). For the OOM guard where its processes cannot be found by
port (a container's PID namespace hides them from NVML).

CUDA counts devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML and nvidia-smi count
in PCI bus order. So an index in ``CUDA_VISIBLE_DEVICES`` (or a device id without one) is nvidia-smi's
only under ``PCI_BUS_ID``, and a GPU UUID (``GPU-...``, or the start of one, as CUDA takes it) names
its GPU in any order, and a server on every GPU NVML lists (one GPU, or tp over all) is on all of
them in any order. Elsewhere the GPUs are not known, and the answer says why: never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_launch.argv import build_env
from sglang_launch.judgement import gpu_list
from sglang_launch.logparse import parse_log
from sglang_launch.server_config import ServerConfig

PCI_ORDER = "PCI_BUS_ID"
"""The ``CUDA_DEVICE_ORDER`` under which CUDA counts devices as NVML does."""


@dataclass(frozen=True)
class Placement:
    """The CUDA devices a launched server's ranks use, and the environment they are counted in."""

    devices: tuple[int, ...] | None
    """CUDA device ids, counted in ``visible``; None where its log does not say (no ``server_args``
    line, or several nodes)."""
    visible: str | None
    """Its ``CUDA_VISIBLE_DEVICES``; None when unset (CUDA sees every GPU)."""
    pci_order: bool
    """``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA's indices are nvidia-smi's."""

    @classmethod
    def launched(cls, cfg: ServerConfig, log_path: Path, environ: Mapping[str, str]) -> Placement:
        """The server started from ``cfg`` (with ``environ``, as the launcher gives it) that wrote
        ``log_path``: read once it serves, when its log has its ``server_args``."""
        env = build_env(cfg, environ)
        try:
            devices = parse_log(log_path.read_text(errors="replace")).args.gpu_ids()
        except OSError:  # gone (a person cleaning up): no placement, never a run stopped for it
            devices = None
        return cls(devices, env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER") == PCI_ORDER)

    def nvml_gpus(self, uuids: Sequence[str]) -> tuple[frozenset[int] | None, str]:
        """nvidia-smi's numbers of its GPUs and how they follow, or None and why they cannot be
        known; ``uuids`` are NVML's GPU UUIDs by index."""
        if self.devices is None:
            return None, (
                "where the run placed it is not known: its log does not say where SGLang placed its "
                "ranks (no server_args line, or several nodes)"
            )
        entries = None if self.visible is None else [entry.strip() for entry in self.visible.split(",")]
        counted = f"of CUDA_VISIBLE_DEVICES={self.visible}" if entries else "with CUDA_VISIBLE_DEVICES unset"
        placed = f"CUDA device {gpu_list(self.devices)} {counted}"
        unknown = f"where the run placed it ({placed}) is not known in nvidia-smi's numbers"
        named = [
            str(device) if entries is None else entries[device]
            for device in self.devices
            if entries is None or device < len(entries)
        ]
        if sorted(named) == sorted(str(index) for index in range(len(uuids))):  # each one once
            return frozenset(range(len(uuids))), f"where the run placed it ({placed}): every GPU NVML lists"
        gpus: set[int] = set()
        for device in self.devices:
            if entries is not None and device >= len(entries):
                return None, f"{unknown}: CUDA_VISIBLE_DEVICES names no device {device}"
            entry = str(device) if entries is None else entries[device]
            index, why = self._nvml_index(entry, uuids)
            if index is None:
                return None, f"{unknown}: {why}"
            gpus.add(index)
        order = ", CUDA_DEVICE_ORDER=PCI_BUS_ID" if self.pci_order else ""
        return frozenset(gpus), f"where the run placed it ({placed}{order})"

    def _nvml_index(self, entry: str, uuids: Sequence[str]) -> tuple[int | None, str]:
        """nvidia-smi's number of the GPU one entry of ``CUDA_VISIBLE_DEVICES`` names, or None and why."""
        if entry.startswith("GPU-"):
            matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) == 1:
                return matches[0], ""
            return None, f"{len(matches)} of the GPUs NVML lists have a UUID that starts {entry}"
        if not entry.isdigit():
            return None, f"{entry} names no whole GPU that NVML lists (a MIG instance?)"
        if not self.pci_order:
            return None, (
                "CUDA counts devices in its own order (fastest first), which is nvidia-smi's only with "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID: set that in [server] env, or name the GPUs by UUID"
            )
        if int(entry) >= len(uuids):
            return None, f"NVML counts {len(uuids)} GPUs, no GPU {entry}"
        return int(entry), ""
