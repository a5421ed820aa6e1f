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


COLUMNS = ("index", "memory.used", "memory.total", "memory.free")
"""The order without a header line; a header line (``--format=csv``) says its own order."""


def parse_gpu_csv(text: str, source: str = "nvidia-smi csv") -> GpuSnapshot:
    """Turn the CSV text into a :class:`GpuSnapshot`; raises ValueError naming the bad line.

    A row nvidia-smi could not fill (``[N/A]``, ``[Unknown Error]``: a GPU in a bad state) is left
    out and named in ``GpuSnapshot.unreadable``, so the other GPUs are still judged. Numbers that
    cannot be (more used or free than the total) are an error: columns in another order than the
    header says, or than ``COLUMNS`` without one.
    """
    gpus, unreadable = [], []
    order: tuple[str, ...] = COLUMNS
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if line.lower().startswith("index"):
            order = _header_order(cells, source, line_no)
            continue
        if len(cells) != 4:
            raise ValueError(
                f"{source} line {line_no}: expected 4 columns ({', '.join(order)}), got {line!r}"
            )
        named = dict(zip(order, cells, strict=True))
        try:
            index = int(named["index"])
            if any(cell.startswith("[") for cell in cells):
                unreadable.append(index)
                continue
            used, total, free = (_mib_value(named[f"memory.{what}"]) for what in ("used", "total", "free"))
        except ValueError as exc:
            raise ValueError(f"{source} line {line_no}: {exc}: {line!r}") from exc
        if used > total or free > total:
            raise ValueError(
                f"{source} line {line_no}: used or free above the total: columns in another order than "
                f"{', '.join(order)}? (save the CSV with its header line, --format=csv): {line!r}"
            )
        gpus.append(GpuInfo(index=index, name="", total_bytes=total, used_bytes=used, free_bytes=free))
    if not gpus:
        raise ValueError(
            f"{source}: no GPU rows found" + (f" (unreadable: {unreadable})" if unreadable else "")
        )
    return GpuSnapshot(gpus=tuple(gpus), source=source, has_process_info=False, unreadable=tuple(unreadable))


def _header_order(cells: list[str], source: str, line_no: int) -> tuple[str, ...]:
    """The columns a header line names (``memory.used [MiB]`` is ``memory.used``)."""
    names = tuple(cell.split(" [", 1)[0].strip().lower() for cell in cells)
    if sorted(names) != sorted(COLUMNS):
        raise ValueError(f"{source} line {line_no}: the columns must be {', '.join(COLUMNS)}, got {names}")
    return names


def _mib_value(cell: str) -> int:
    """``"75000 MiB"`` or ``"75000"`` (nvidia-smi's default unit is MiB) to bytes."""
    number, _, unit = cell.partition(" ")
    scale = _UNITS.get(unit.strip().lower() or "mib")
    if scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return round(float(number) * scale)
