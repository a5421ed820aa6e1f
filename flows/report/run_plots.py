"""The run report's plots, from the run directory alone (so `datagen status --report` redraws them).

- ``throughput.png``: output tok/s over time and requests in flight (``progress/``, every start);
- ``categories.png``: rows per category and their finish reasons (the finished shards);
- ``lengths.png``: output-length histogram per category (the shards' ``usage.completion_tokens``);
- ``controller.png``: limit, in flight, server queue and KV usage (``plots.plot_controller``, from
  the controller's timeline, when the server exposes them).

Headless matplotlib (Agg). Every plot is skipped, not faked, when its data is missing.
"""

from __future__ import annotations

import base64
import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

from flows.control.timeline import count_decisions, iter_timeline
from flows.report.plots import CONTROLLER_COLUMNS, plot_controller, pyplot, save_figure
from flows.report.progress_log import read_progress
from flows.store.run_store import RunStore

THROUGHPUT_PLOT = "throughput.png"
CATEGORIES_PLOT = "categories.png"
LENGTHS_PLOT = "lengths.png"
CONTROLLER_PLOT = "controller.png"
PLOTTED_POINTS = 20_000
"""At most about this many points on a plot over time; a longer run is drawn in bins."""
# (title, file name) of each plot drawn, in report order.
Plots = list[tuple[str, str]]


def throughput_series(starts: list[list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Seconds since the first sample, output tok/s between samples, and requests in flight; at most
    about ``PLOTTED_POINTS`` of them (a longer run keeps every k-th sample: the rate is then over
    the k samples' span)."""
    series: dict[str, list[float]] = {"t": [], "tok_s": [], "in_flight": []}
    if not starts:
        return series
    origin = starts[0][0]["at"]
    stride = math.ceil(sum(len(samples) for samples in starts) / PLOTTED_POINTS) or 1
    for samples in starts:
        kept = samples[::stride] + ([samples[-1]] if (len(samples) - 1) % stride else [])
        for before, after in itertools.pairwise(kept):
            span = after["at"] - before["at"]
            if span <= 0:
                continue
            series["t"].append(after["at"] - origin)
            series["tok_s"].append(max(after["completion_tokens"] - before["completion_tokens"], 0) / span)
            series["in_flight"].append(after["in_flight"])
    return series


def plot_throughput(run_dir: Path, path: Path) -> bool:
    series = throughput_series(read_progress(run_dir))
    if not series["t"]:
        return False
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    top.plot(series["t"], series["tok_s"])
    top.set_ylabel("output tok/s")
    bottom.plot(series["t"], series["in_flight"], color="tab:orange")
    bottom.set_ylabel("requests in flight")
    bottom.set_xlabel("seconds (wall clock, every start of the run)")
    save_figure(fig, path)
    return True


def category_numbers(data: str | Path) -> dict[str, dict[str, Any]]:
    """Per category in the run's data (every part's): rows, finish reasons, each row's output length."""
    store = RunStore(data)
    numbers: dict[str, dict[str, Any]] = {}
    for name in store.categories_on_disk():
        finish: Counter[str] = Counter()
        lengths: list[int] = []
        for row in store.iter_row_columns(name, ["finish_reason", "usage"]):
            finish[str(row["finish_reason"])] += 1
            lengths.append(int((row["usage"] or {}).get("completion_tokens") or 0))
        numbers[name] = {"rows": len(lengths), "finish": finish, "lengths": lengths}
    return numbers


def plot_categories(numbers: dict[str, dict[str, Any]], path: Path) -> bool:
    """Rows per category, stacked by finish reason."""
    if not any(n["rows"] for n in numbers.values()):
        return False
    plt = pyplot()
    names = list(numbers)
    reasons = sorted({reason for n in numbers.values() for reason in n["finish"]})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names) + 3), 4))
    bottom = [0] * len(names)
    for reason in reasons:
        heights = [numbers[name]["finish"].get(reason, 0) for name in names]
        ax.bar(names, heights, bottom=bottom, label=f"finish: {reason}")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for x, total in enumerate(bottom):
        ax.annotate(str(total), (x, total), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("rows")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def plot_lengths(numbers: dict[str, dict[str, Any]], path: Path) -> bool:
    """Output-length histogram per category (one panel each)."""
    shown = {name: n["lengths"] for name, n in numbers.items() if n["lengths"]}
    if not shown:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 2.2 * len(shown) + 0.5), squeeze=False)
    for ax, (name, lengths) in zip(axes[:, 0], shown.items(), strict=True):
        ax.hist(lengths, bins=min(40, max(5, len(set(lengths)))))
        ax.set_ylabel(name, fontsize=8)
    axes[-1, 0].set_xlabel("output tokens per row")
    save_figure(fig, path)
    return True


def write_plots(run_dir: Path, data: str | Path) -> Plots:
    """Draw every plot the run's files allow; (title, file name) of each one drawn, in report order.

    The plots go to the run's local folder ``run_dir``; ``data`` is where its shards are (the same
    folder, or a URL).
    """
    numbers = category_numbers(data)
    drawn = []
    if plot_throughput(run_dir, run_dir / THROUGHPUT_PLOT):
        drawn.append(("output tok/s and requests in flight", THROUGHPUT_PLOT))
    if plot_controller(
        iter_timeline(run_dir, CONTROLLER_COLUMNS),
        run_dir / CONTROLLER_PLOT,
        bin_rows=math.ceil(count_decisions(run_dir) / PLOTTED_POINTS) or 1,
    ):
        drawn.append(("controller: limit, in flight, server queue, KV usage", CONTROLLER_PLOT))
    if plot_categories(numbers, run_dir / CATEGORIES_PLOT):
        drawn.append(("rows per category and finish reasons", CATEGORIES_PLOT))
    if plot_lengths(numbers, run_dir / LENGTHS_PLOT):
        drawn.append(("output length per category", LENGTHS_PLOT))
    return drawn


def plots_markdown(run_dir: Path, plots: Plots, *, embed: bool = False) -> list[str]:
    """A "Plots" section: links beside report.md, or the PNGs inline (``embed``, for a UI artifact)."""
    if not plots:
        return []
    lines = ["## Plots", ""]
    for title, name in plots:
        if embed:
            data = base64.b64encode((run_dir / name).read_bytes()).decode("ascii")
            lines += [f"**{title}**", "", f"![{title}](data:image/png;base64,{data})", ""]
        else:
            lines += [f"![{title}]({name})", ""]
    return lines
