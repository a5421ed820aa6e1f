"""The law's projected KV peak against the peak that came, on runs kept with ``--keep``.

The budget (``flows/control/outlook.py``) admits newcomers while the projected peak of the requests
in flight stays under ``peak_kv`` of the pool (0.94 by default). Where the budget bound (no credit
left), this sets that projection (in KV share: the outlook's largest peak times the learned
occupancy, over the pool) against the largest KV usage over the next request life, admissions made
meanwhile included: a projection far above what came is room the law left unused; one below it is
a retraction risk. Only the warm part of each run counts (from the end of its first cohort to its
last send, as ``bench.adaptive_concurrency`` reports it).

What came is read twice. The server's readings (1 s apart, and SGLang's gauges refresh only every
~40 decode steps) miss the peaks between them: a lower bound. The rows say the rest: each answer's
admission, answer and tokens give what it held at any moment (its prompt, and its answer grown
evenly over its life: no queue wait or prefill apart, about nothing where the law keeps the server's
queue near empty), scaled to the readings by the median of reading over rows at the readings' times
(the cache's own count of a token, which the law learns as its occupancy). On the same rows, the
projection of the requests in flight at a bound tick is set against the largest those very requests
held over the projection's horizon (a newcomer's life): whether the outlook itself is right, apart
from what was admitted after it.

The window is placed on the timeline's ``at`` (seconds from the controller's start) from the rows'
times counted from the timeline file's stamp, made a moment before (``bench.clock_count.read_lives``):
off by that moment, alike for every tick.

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
from bench.clock_count import Life, first_start, print_spread, read_lives, run_dirs
from flows.control.lengths import Floats
from flows.control.timeline import iter_timeline

COLUMNS = [
    "at",
    "kv_usage",
    "credit",
    "occupancy",
    "capacity_tokens",
    "outlook_peaks",
    "request_life_s",
    "newcomer_output",
    "tokens_per_s",
]
GRID_S = 0.02
"""What the rows say the cache held is read this often: far finer than a request's life (seconds)."""


@dataclass(frozen=True)
class Tick:
    """One decision where the budget bound: its time, its projected peak (a share of the pool), the
    request life over which what came is read, the peak in the outlook's own tokens (before the
    occupancy) and the horizon it was projected over (a newcomer's life at the outlook's rate)."""

    at: float
    projected: float
    life_s: float
    peak_tokens: float = 0.0
    horizon_s: float = 0.0


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


@dataclass(frozen=True)
class RowsCheck:
    came: float
    """Median over the bound ticks of the largest share of the pool the rows say the cache held over
    the next request life (scaled to the readings by ``scale``)."""
    came_p90: float
    projected_over_held: float
    """Median of the outlook's peak over the largest that the requests in flight at the tick held
    over its horizon (1: the projection right about them)."""
    scale: float
    """Median of a reading's tokens over the rows' at the same moment."""


def held_by_rows(lives: Sequence[Life], times: Floats) -> Floats:
    """The KV tokens the rows say the cache held at each time: every request admitted and not yet
    answered then, with its prompt and its answer so far (grown evenly from admission to answer)."""
    if not lives:
        return np.zeros(len(times))
    columns = np.array(
        [(life.admitted, life.answered, life.prompt_tokens, life.tokens) for life in lives], dtype=np.float64
    )
    admitted, answered, prompt, output = (column[:, None] for column in columns.T)
    live = (admitted <= times[None, :]) & (times[None, :] < answered)
    grown = np.clip((times[None, :] - admitted) / np.maximum(answered - admitted, 1e-9), 0.0, 1.0)
    return np.where(live, prompt + output * grown, 0.0).sum(axis=0)


def largest_held(lives: Sequence[Life], start: float, length: float) -> float:
    """The most the rows say ``lives`` held from ``start`` over ``length`` seconds (on ``GRID_S``),
    counting only those live within it."""
    near = [life for life in lives if life.admitted <= start + length and life.answered > start]
    grid = np.arange(start, start + length, GRID_S)
    return float(held_by_rows(near, grid).max()) if len(grid) else 0.0


def check_rows(
    ticks: Sequence[Tick], lives: Sequence[Life], at: Floats, kv: Floats, capacity: float
) -> RowsCheck | None:
    """The bound ticks against what the rows say came (see the module's docstring); None where the
    rows count nothing at the readings or there is no tick."""
    rows_at = held_by_rows(lives, at)
    counted = rows_at > 0
    if not ticks or not counted.any():
        return None
    scale = float(np.median(kv[counted] * capacity / rows_at[counted]))
    came = np.array([largest_held(lives, tick.at, tick.life_s) * scale / capacity for tick in ticks])
    ratios = []
    for tick in ticks:
        in_flight = [life for life in lives if life.admitted <= tick.at < life.answered]
        held = largest_held(in_flight, tick.at, tick.horizon_s)
        if held > 0 and tick.peak_tokens > 0:
            ratios.append(tick.peak_tokens / held)
    return RowsCheck(
        float(np.median(came)),
        float(np.percentile(came, 90)),
        float(np.median(ratios)) if ratios else float("nan"),
        scale,
    )


@dataclass(frozen=True)
class RunCheck:
    readings: OutlookCheck
    rows: RowsCheck | None


def read_run(run_dir: Path, cohort: int) -> RunCheck | None:
    """The checks over ``run_dir``'s first start, in its warm window (None without one)."""
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
            max(row["outlook_peaks"]),
            row["newcomer_output"] / row["tokens_per_s"] if row["tokens_per_s"] else 0.0,
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
    readings = check(ticks, at, kv)
    if readings is None:
        return None
    return RunCheck(readings, check_rows(ticks, lives, at, kv, float(rows[0]["capacity_tokens"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, or folders of them")
    parser.add_argument("--cohort", type=int, default=64, help="answers that end a run's start")
    args = parser.parse_args()
    table = Table(title="projected KV peak where the budget bound, against the largest over the next life")
    columns = ("run", "bound ticks", "projected", "came", "came p90", "came max", "by rows", "rows p90")
    for column in (*columns, "projected / held", "mean KV"):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    gaps = []
    for run_dir in run_dirs(args.paths):
        result = read_run(run_dir, args.cohort)
        if result is None:
            continue
        readings, rows = result.readings, result.rows
        by_rows = (
            ("-", "-", "-")
            if rows is None
            else (
                f"{rows.came:.3f}",
                f"{rows.came_p90:.3f}",
                f"{rows.projected_over_held:.3f}",
            )
        )
        if rows is not None:
            gaps.append(readings.projected - rows.came)
        table.add_row(
            f"{run_dir.parent.name}/{run_dir.name}",
            str(readings.ticks),
            f"{readings.projected:.3f}",
            f"{readings.came:.3f}",
            f"{readings.came_p90:.3f}",
            f"{readings.came_max:.3f}",
            *by_rows,
            f"{readings.mean_kv:.3f}",
        )
    print_spread(
        table,
        gaps,
        "projected less came by the rows (a share of the pool), over {n} runs",
        "+.3f",
        "no run with a timeline, answers and a warm window found",
    )


if __name__ == "__main__":
    main()
