"""Parse a saved ``nvidia-smi --query-gpu=index,memory.used,memory.total,memory.free --format=csv,noheader``.

People diagnose servers on machines they are not logged into; a CSV they (or a colleague) saved is
then the only GPU evidence. Both ``--format=csv,noheader`` (values like ``75000 MiB``) and
``csv,noheader,nounits`` (bare MiB numbers) are accepted, and so is a header line if one slipped in.
nvidia-smi's CSV has no process list, so the snapshot says so (``has_process_info=False``).
"""

from __future__ import annotations

from sglang_launch.gpu import GpuInfo, GpuSnapshot
from sglang_launch.memory_math import MIB

_UNITS = {"mib": MIB, "gib": 1 << 30, "kib": 1 << 10, "b": 1}


def parse_gpu_csv(text: str, source: str = "nvidia-smi csv") -> GpuSnapshot:
    """Turn the CSV text into a :class:`GpuSnapshot`; raises ValueError naming the bad line."""
    gpus = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.lower().startswith("index"):
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 4:
            raise ValueError(
                f"{source} line {line_no}: expected 4 columns (index, used, total, free), got {line!r}"
            )
        try:
            index = int(cells[0])
            used, total, free = (_mib_value(cell) for cell in cells[1:])
        except ValueError as exc:
            raise ValueError(f"{source} line {line_no}: {exc}: {line!r}") from exc
        gpus.append(GpuInfo(index=index, name="", total_bytes=total, used_bytes=used, free_bytes=free))
    if not gpus:
        raise ValueError(f"{source}: no GPU rows found")
    return GpuSnapshot(gpus=tuple(gpus), source=source, has_process_info=False)


def _mib_value(cell: str) -> int:
    """``"75000 MiB"`` or ``"75000"`` (nvidia-smi's default unit is MiB) to bytes."""
    number, _, unit = cell.partition(" ")
    scale = _UNITS.get(unit.strip().lower() or "mib")
    if scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return round(float(number) * scale)
