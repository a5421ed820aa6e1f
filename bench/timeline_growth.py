"""What the controller's timeline costs a long run: memory held and CPU per write, as hours go by.

A run meant to go on for a week polls each endpoint once a second and writes its timeline every half
minute (``flows.control.wiring``). Written as one file per start, every decision stayed in memory
and every write rewrote them all: memory and write time grew with the run's age, on the core that
sends the requests. Segmented (``Timeline(segment_rows=SEGMENT_ROWS)``), both stay bounded. This
bench replays a real SGLang run's decisions (the unit tests' fixture) at 1 Hz for ``--hours`` per
endpoint, writing every 30 decisions per endpoint, as one file per start (``segment_rows`` beyond
the run) and in segments, interleaved and repeated, and prints what each holds and spends.

Run: ``uv run python -m bench.timeline_growth [--hours 6] [--endpoints 1] [--repeats 2]``; results go
in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from flows.config import ConcurrencyConfig
from flows.control.adaptive import AdaptiveLimit
from flows.control.timeline import SEGMENT_ROWS, Timeline, observation_from_row, timeline_files
from flows.control.wiring import TIMELINE_WRITE_S, law_settings

RECORDED = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "fixtures"
    / "timelines"
    / "sglang_0.5.23_outlook_300.parquet"
)
SETTINGS = {"one file per start": 10**12, "segments": SEGMENT_ROWS}


@dataclasses.dataclass
class Outcome:
    held: int
    held_mib: float
    write_cpu_s: float
    last_write_cpu_s: float
    files: int


def replay(segment_rows: int, hours: float, endpoints: int) -> Outcome:
    law = AdaptiveLimit(law_settings(ConcurrencyConfig()))
    recorded = []
    for row in pq.read_table(RECORDED).to_pylist():
        observation = observation_from_row(row)
        recorded.append((law.observe(observation), observation.server, observation.outlook))
    ticks = int(hours * 3600)
    with tempfile.TemporaryDirectory() as folder:
        tracemalloc.start()
        timeline = Timeline(Path(folder), segment_rows=segment_rows)
        write_cpu = last_write = 0.0
        for tick in range(ticks):
            decision, sample, outlook = recorded[tick % len(recorded)]
            for endpoint in range(endpoints):
                timeline.add(
                    f"http://e{endpoint}", dataclasses.replace(decision, at=float(tick)), sample, outlook
                )
            if tick % int(TIMELINE_WRITE_S) == int(TIMELINE_WRITE_S) - 1:
                started = time.process_time()
                timeline.write()
                last_write = time.process_time() - started
                write_cpu += last_write
        held_bytes, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        files = len(timeline_files(Path(folder)))
    return Outcome(timeline.held, held_bytes / 2**20, write_cpu, last_write, files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--endpoints", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    console = Console(width=110)
    outcomes: dict[str, list[Outcome]] = {name: [] for name in SETTINGS}
    for repeat in range(args.repeats):
        names = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
        for name in names:
            with console.status(f"repeat {repeat + 1}: {name}"):
                outcomes[name].append(replay(SETTINGS[name], args.hours, args.endpoints))
            console.print(f"repeat {repeat + 1} {name}: {outcomes[name][-1]}")
    decisions = int(args.hours * 3600) * args.endpoints
    table = Table(
        title=f"{decisions:,} decisions ({args.hours:g} h at 1 Hz x {args.endpoints} endpoint(s)), "
        f"a write every {TIMELINE_WRITE_S:g} s; medians of {args.repeats}"
    )
    for column in (
        "timeline",
        "held at the end",
        "MiB held",
        "CPU s, all writes",
        "CPU s, last write",
        "files",
    ):
        table.add_column(column, justify="left" if column == "timeline" else "right")
    medians = {}
    for name, runs in outcomes.items():
        m = medians[name] = {
            field.name: statistics.median(getattr(o, field.name) for o in runs)
            for field in dataclasses.fields(Outcome)
        }
        table.add_row(
            name,
            f"{m['held']:,.0f}",
            f"{m['held_mib']:.1f}",
            f"{m['write_cpu_s']:.2f}",
            f"{m['last_write_cpu_s']:.3f}",
            f"{m['files']:.0f}",
        )
    console.print(table)
    one, seg = medians["one file per start"], medians["segments"]
    console.print(
        f"segments / one file per start: memory held {seg['held_mib'] / one['held_mib']:.3f}x, "
        f"last write {seg['last_write_cpu_s'] / max(one['last_write_cpu_s'], 1e-9):.3f}x, "
        f"all writes {seg['write_cpu_s'] / max(one['write_cpu_s'], 1e-9):.3f}x"
    )
    reproduce = f"--hours {args.hours:g} --endpoints {args.endpoints} --repeats {args.repeats}"
    console.print(f"reproduce: uv run python -m bench.timeline_growth {reproduce}")


if __name__ == "__main__":
    main()
