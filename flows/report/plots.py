"""PNG plots for the run report (matplotlib, headless: the Agg backend, no display needed)."""

from __future__ import annotations

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


def plot_controller(rows: list[dict[str, Any]], path: Path) -> bool:
    """The controller's timeline: limit and in flight, server queue, KV usage; one colour per endpoint.

    Returns False (and writes nothing) for a run without decisions (a fixed limit). Starts of a
    resumed run follow each other on one time axis.
    """
    if not rows:
        return False
    fig, (top, middle, bottom) = pyplot().subplots(3, 1, figsize=(10, 7), sharex=True)
    offset, last_at = 0.0, None
    series: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if last_at is not None and row["at"] < last_at:  # a new start of the run: continue the axis
            offset += last_at
        last_at = row["at"]
        s = series.setdefault(row["endpoint"], {k: [] for k in ("t", "limit", "in_flight", "queued", "kv")})
        s["t"].append(offset + row["at"])
        s["limit"].append(row["limit"])
        s["in_flight"].append(row["in_flight"])
        s["queued"].append(row["queued"] if row["queued"] is not None else float("nan"))
        s["kv"].append(row["kv_usage"] if row["kv_usage"] is not None else float("nan"))
    for endpoint, s in series.items():
        line = top.step(s["t"], s["limit"], where="post", label=f"limit {endpoint}")[0]
        top.plot(s["t"], s["in_flight"], color=line.get_color(), alpha=0.4, label=f"in flight {endpoint}")
        middle.plot(s["t"], s["queued"], color=line.get_color())
        bottom.plot(s["t"], s["kv"], color=line.get_color())
    top.set_ylabel("requests")
    top.legend(fontsize=7, loc="upper left")
    middle.set_ylabel("server queue")
    bottom.set_ylabel("KV usage")
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel("seconds")
    save_figure(fig, path)
    return True
