"""The law's projected KV peak against the peak that came, on runs kept with ``--keep``.

The budget (``flows/control/outlook.py``) admits newcomers while the projected peak of the requests
in flight stays under ``peak_kv`` of the pool (0.94 by default). Where the budget bound (no credit
left), this sets that projection (in KV share: the outlook's largest peak times the learned
occupancy, over the pool) against the largest KV usage the server reported over the next request
life, admissions made meanwhile included: a projection far above what came is room the law left
unused; one below it is a retraction risk. Only the warm part of each run counts (from the end of
its first cohort to its last send, as ``bench.adaptive_concurrency`` reports it); the 1 s readings
miss the peaks between them, so "came" is a lower bound. The window is placed on the timeline's
``at`` (seconds from the controller's start) from the rows' times counted from the timeline file's
stamp, made a moment before (``bench.clock_count.read_lives``): off by that moment, alike for every
tick.

Run: ``uv run python -m bench.outlook_check DIR [DIR ...]`` (each a run directory, or a folder of
them, kept by ``bench.adaptive_concurrency --keep``); results go in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.table import Table

from bench.adaptive_concurrency import warm_window
from bench.clock_count import first_start, print_spread, read_lives, run_dirs
from flows.control.lengths import Floats
from flows.control.timeline import iter_timeline

COLUMNS = ["at", "kv_usage", "credit", "occupancy", "capacity_tokens", "outlook_peaks", "request_life_s"]


@dataclass(frozen=True)
class Tick:
    """One decision where the budget bound: its time, its projected peak (a share of the pool) and the
    request life over which that peak was projected."""

    at: float
    projected: float
    life_s: float


@dataclass(frozen=True)
class OutlookCheck:
    ticks: int
    projected: float
    """Median projected peak (KV share) at the ticks where the budget bound."""
    came: float
    """Median of the largest KV share read over the next request life after each such tick."""
    came_p90: float
    came_max: float
    mean_kv: float
    """The mean KV share of every reading in the window."""


def check(ticks: Sequence[Tick], at: Floats, kv: Floats) -> OutlookCheck | None:
    """Each bound tick's projection against the largest reading ``(at, kv)`` after it within its
    request life; None where no tick has a reading after it."""
    pairs = []
    for tick in ticks:
        after = (at > tick.at) & (at <= tick.at + tick.life_s)
        if after.any():
            pairs.append((tick.projected, float(kv[after].max())))
    if not pairs:
        return None
    projected, came = np.array(pairs).T
    return OutlookCheck(
        len(pairs),
        float(np.median(projected)),
        float(np.median(came)),
        float(np.percentile(came, 90)),
        float(came.max()),
        float(kv.mean()),
    )


def read_run(run_dir: Path, cohort: int) -> OutlookCheck | None:
    """The check over ``run_dir``'s first start, in its warm window (None without one)."""
    first = first_start(run_dir)
    lives = [life for category in read_lives(run_dir, first).values() for life in category]
    window = warm_window([life.answered for life in lives], [life.admitted for life in lives], cohort)
    if window is None:
        return None
    low, high = window
    rows = [
        row
        for row in iter_timeline(run_dir, COLUMNS)
        if row["start"] == first and row["kv_usage"] is not None and low <= row["at"] <= high
    ]
    ticks = [
        Tick(
            row["at"],
            max(row["outlook_peaks"]) * row["occupancy"] / row["capacity_tokens"],
            row["request_life_s"],
        )
        for row in rows
        if row["credit"] == 0
        and row["outlook_peaks"]
        and row["occupancy"]
        and row["capacity_tokens"]
        and row["request_life_s"]
    ]
    at = np.array([row["at"] for row in rows], dtype=np.float64)
    kv = np.array([row["kv_usage"] for row in rows], dtype=np.float64)
    return check(ticks, at, kv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, or folders of them")
    parser.add_argument("--cohort", type=int, default=64, help="answers that end a run's start")
    args = parser.parse_args()
    table = Table(
        title="projected KV peak where the budget bound, against the largest reading over the next life"
    )
    for column in ("run", "bound ticks", "projected", "came", "came p90", "came max", "mean KV"):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    gaps = []
    for run_dir in run_dirs(args.paths):
        result = read_run(run_dir, args.cohort)
        if result is None:
            continue
        gaps.append(result.projected - result.came)
        table.add_row(
            f"{run_dir.parent.name}/{run_dir.name}",
            str(result.ticks),
            f"{result.projected:.3f}",
            f"{result.came:.3f}",
            f"{result.came_p90:.3f}",
            f"{result.came_max:.3f}",
            f"{result.mean_kv:.3f}",
        )
    print_spread(
        table,
        gaps,
        "projected less came (a share of the pool), over {n} runs",
        "+.3f",
        "no run with a timeline, answers and a warm window found",
    )


if __name__ == "__main__":
    main()
