"""How many decode steps the server counted over each answer's life, against the answer's tokens.

The law's decode clock (``flows/control/decode_clock.py``) counts a request's progress in the
server's decode steps (SGLang's ``/v1/loads`` ``decode_moments``): one token a step for every
request running. Whether the count is every step is the server's affair. SGLang 0.5.23 adds a step
to ``decode_moments`` only when the step before it was a decode step too and no idle gap came
between (its moments are for a regression of step time on batch size): the first decode step after
each prefill is left out, so the clock runs slow by the share of such steps, and each request in
flight is counted younger than it is.

This reads runs kept by ``bench.adaptive_concurrency --keep DIR`` (or any adaptive run directory):
each row's life (its ``created_at`` less its ``latency_s``: admission to answer, as the client saw
it) against the timeline's ``decode_steps``, interpolated between the 1 s readings. The timeline's
``at`` counts from the controller's start, placed at the timeline file's stamp (made a moment
before): an offset moves both ends of a life alike, so the difference is off only by how the step
rate changed within it. Answers at their category's cap are reported apart: an answer cut short by
an end-of-sequence token has the same steps a token, only fewer of them.

Run: ``uv run python -m bench.clock_count DIR [DIR ...]`` (each a run directory, or a folder of
them); results go in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from flows.control.lengths import Floats
from flows.control.timeline import iter_timeline, start_of, timeline_files
from flows.store.run_store import RunStore
from flows.store.start_stamp import stamp_moment


@dataclass(frozen=True)
class Life:
    """One answer: when it was admitted and answered (seconds from the timeline's start), its output
    tokens and its prompt's."""

    admitted: float
    answered: float
    tokens: int
    prompt_tokens: int = 0


def counted_steps(lives: Sequence[Life], at: Floats, steps: Floats) -> Floats:
    """The server's decode steps counted over each life, interpolated between the readings
    ``(at, steps)`` (in time order)."""
    admitted = np.array([life.admitted for life in lives], dtype=np.float64)
    answered = np.array([life.answered for life in lives], dtype=np.float64)
    return np.interp(answered, at, steps) - np.interp(admitted, at, steps)


@dataclass(frozen=True)
class CategoryCount:
    category: str
    answers: int
    at_cap: int
    cap: int
    steps_per_token: float
    """Median over the answers at the cap of counted steps over tokens (1: every step counted)."""
    median_steps: float


def count_category(category: str, lives: Sequence[Life], at: Floats, steps: Floats) -> CategoryCount | None:
    """The category's answers at their cap (the longest answer: the cap where any reached it)
    against the steps counted over their lives; None where none has a positive length."""
    cap = max((life.tokens for life in lives), default=0)
    if cap <= 0:
        return None
    full = [life for life in lives if life.tokens == cap]
    counted = counted_steps(full, at, steps)
    return CategoryCount(
        category,
        len(lives),
        len(full),
        cap,
        float(np.median(counted / cap)),
        float(np.median(counted)),
    )


def read_readings(run_dir: Path, first: str) -> tuple[Floats, Floats, float]:
    """The timeline's decode-step readings of the run's ``first`` start (``at``, steps) and the share
    of consecutive readings with no step between them."""
    rows = [
        row
        for row in iter_timeline(run_dir, ["at", "decode_steps"])
        if row["decode_steps"] is not None and row["start"] == first
    ]
    at = np.array([row["at"] for row in rows], dtype=np.float64)
    steps = np.array([row["decode_steps"] for row in rows], dtype=np.float64)
    still = float(np.mean(np.diff(steps) == 0)) if len(steps) > 1 else 0.0
    return at, steps, still


def read_lives(run_dir: Path, first: str) -> dict[str, list[Life]]:
    """Each category's answers, their times counted from the timeline's ``first`` start."""
    began = stamp_moment(first)
    store = RunStore(run_dir)
    lives: dict[str, list[Life]] = {}
    for category in store.categories_on_disk():
        for row in store.iter_row_columns(category, ["created_at", "latency_s", "usage"]):
            answered = (row["created_at"] - began).total_seconds()
            usage = row["usage"]
            life = Life(
                answered - row["latency_s"], answered, usage["completion_tokens"], usage["prompt_tokens"]
            )
            lives.setdefault(category, []).append(life)
    return lives


def first_start(run_dir: Path) -> str:
    """The stamp of the run's first start, which a kept bench run's readings and rows are set on
    (its timeline files sort by start; ``run_dirs`` gives only runs that have one)."""
    return start_of(timeline_files(run_dir)[0])


def run_dirs(paths: Iterable[Path]) -> list[Path]:
    """The run directories given, or found one level down (a ``--keep`` folder): those with a
    timeline (a fixed setting's run has none)."""
    found = []
    for path in paths:
        if timeline_files(path):
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(child for child in path.iterdir() if timeline_files(child)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, or folders of them")
    args = parser.parse_args()
    table = Table(title="decode steps the server counted over each answer's life, answers at their cap")
    for column in ("run", "category", "answers", "at cap", "cap", "counted steps", "steps / token"):
        table.add_column(column, justify="left" if column in ("run", "category") else "right", no_wrap=True)
    table.add_column("readings with no step", justify="right", no_wrap=True)
    ratios = []
    for run_dir in run_dirs(args.paths):
        first = first_start(run_dir)
        at, steps, still = read_readings(run_dir, first)
        if len(at) < 2:
            continue
        for category, lives in sorted(read_lives(run_dir, first).items()):
            count = count_category(category, lives, at, steps)
            if count is None:
                continue
            ratios.append(count.steps_per_token)
            table.add_row(
                f"{run_dir.parent.name}/{run_dir.name}",
                category,
                str(count.answers),
                str(count.at_cap),
                str(count.cap),
                f"{count.median_steps:.0f}",
                f"{count.steps_per_token:.2f}",
                f"{still:.0%}",
            )
    print_spread(
        table,
        ratios,
        "steps counted per token, over {n} run categories",
        ".2f",
        "no run with a timeline of decode steps and answers found",
    )


def print_spread(table: Table, values: list[float], what: str, fmt: str, empty: str) -> None:
    """A kept-run bench's table, then one line: the median and range of ``values`` (``what`` with
    ``{n}``, their count), or ``empty`` where no run gave one."""
    console = Console(width=140)
    console.print(table)
    if not values:
        console.print(empty)
        return
    low, middle, high = (format(v, fmt) for v in (min(values), statistics.median(values), max(values)))
    console.print(f"{what.format(n=len(values))}: median {middle}, range {low} to {high}")


if __name__ == "__main__":
    main()
