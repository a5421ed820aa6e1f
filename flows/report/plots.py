"""PNG plots for the run report (matplotlib, headless: the Agg backend, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.store.run_store import atomic_file


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported when a plot is first drawn (it takes a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay the figure out and write it whole or not at all, then free it.

    The parts of a run that share one folder (a network file system) draw the same plots at their
    ends; written in place, one part's report could be read while another rewrote its PNG.
    """
    fig.tight_layout()
    with atomic_file(path) as handle:
        fig.savefig(handle, format="png", dpi=90)
    pyplot().close(fig)


CONTROLLER_COLUMNS = ["endpoint", "at", "limit", "in_flight", "queued", "kv_usage"]
"""The timeline columns the controller plot reads."""


def plot_controller(rows: Iterable[dict[str, Any]], path: Path, *, bin_rows: int = 1) -> bool:
    """The controller's timeline: limit and in flight, server queue, KV usage; one colour per endpoint.

    Returns False (and writes nothing) for a run without decisions (a fixed limit). Starts of a
    resumed run follow each other on one time axis. A long run's decisions (a week polled once a
    second is 600,000 per endpoint, against a figure 900 pixels wide) are drawn in bins of
    ``bin_rows`` per endpoint: the limit and in flight as their means, the queue and the KV usage
    as their peaks, so a flood or a full cache still shows.
    """
    series = controller_series(rows, bin_rows)
    if not series:
        return False
    fig, (top, middle, bottom) = pyplot().subplots(3, 1, figsize=(10, 7), sharex=True)
    for endpoint, s in series.items():
        line = top.step(s["t"], s["limit"], where="post", label=f"limit {endpoint}")[0]
        top.plot(s["t"], s["in_flight"], color=line.get_color(), alpha=0.4, label=f"in flight {endpoint}")
        middle.plot(s["t"], s["queued"], color=line.get_color())
        bottom.plot(s["t"], s["kv"], color=line.get_color())
    binned = f" (peak per {bin_rows} decisions)" if bin_rows > 1 else ""
    top.set_ylabel("requests" + (f" (mean per {bin_rows} decisions)" if bin_rows > 1 else ""))
    top.legend(fontsize=7, loc="upper left")
    middle.set_ylabel("server queue" + binned)
    bottom.set_ylabel("KV usage" + binned)
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel("seconds")
    save_figure(fig, path)
    return True


def controller_series(rows: Iterable[dict[str, Any]], bin_rows: int = 1) -> dict[str, dict[str, list[float]]]:
    """Per endpoint, the points to draw: time on one axis across the starts of a resumed run, each
    point a bin of ``bin_rows`` of the endpoint's decisions.

    A row's ``start`` names the start of the run it belongs to (``iter_timeline``). A decision's time
    counts from its own controller's start, so a start follows the longest time of the start before
    it. Where a start ends, each endpoint's last bin is drawn and its lines break (a point of NaN at
    the start's end), so two starts are never averaged into one point nor joined as one run.
    """
    offset = 0.0  # where the current start begins on the run's axis
    longest = 0.0  # the current start's latest decision, from its own beginning
    start: str | None = None
    bins: dict[str, _Bin] = {}
    series: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row["start"] != start:
            if start is not None:
                offset += longest
                _drain_all(bins, series)
                for points in series.values():
                    _break(points, offset)
            start, longest = row["start"], 0.0
        endpoint, at = row["endpoint"], row["at"]
        longest = max(longest, at)
        current = bins.setdefault(endpoint, _Bin())
        current.add(offset + at, row)
        if current.count >= bin_rows:
            current.drain(series.setdefault(endpoint, _empty_series()))
    _drain_all(bins, series)
    return series


def _drain_all(bins: dict[str, _Bin], series: dict[str, dict[str, list[float]]]) -> None:
    """Every endpoint's unfinished bin as a point (at a start's end, or the run's)."""
    for endpoint, current in bins.items():
        if current.count:
            current.drain(series.setdefault(endpoint, _empty_series()))


def _break(points: dict[str, list[float]], at: float) -> None:
    """A point of no values at ``at``: matplotlib ends the lines there (a limit's step holds to it)."""
    for key, values in points.items():
        values.append(at if key == "t" else math.nan)


def _empty_series() -> dict[str, list[float]]:
    return {key: [] for key in ("t", "limit", "in_flight", "queued", "kv")}


@dataclass
class _Bin:
    """One endpoint's decisions since its last plotted point."""

    count: int = 0
    start: float = 0.0
    limit: float = 0.0
    in_flight: float = 0.0
    queued: float = math.nan
    kv: float = math.nan

    def add(self, at: float, row: dict[str, Any]) -> None:
        if not self.count:
            self.start = at
        self.count += 1
        self.limit += row["limit"]
        self.in_flight += row["in_flight"]
        self.queued = _peak(self.queued, row["queued"])
        self.kv = _peak(self.kv, row["kv_usage"])

    def drain(self, series: dict[str, list[float]]) -> None:
        """Append the bin as one point and empty it."""
        series["t"].append(self.start)
        series["limit"].append(self.limit / self.count)
        series["in_flight"].append(self.in_flight / self.count)
        series["queued"].append(self.queued)
        series["kv"].append(self.kv)
        self.count, self.limit, self.in_flight, self.queued, self.kv = 0, 0.0, 0.0, math.nan, math.nan


def _peak(current: float, value: float | None) -> float:
    """The larger of the two, where a reading that was not there (None, NaN) counts as none."""
    if value is None:
        return current
    return value if math.isnan(current) else max(current, value)
