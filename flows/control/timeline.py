"""Every controller decision with its inputs and reason, kept as a parquet table in the run directory.

Files of one start of the run (``timeline/part-<start>-<segment>.parquet``) hold at most
``SEGMENT_ROWS`` decisions each: the open segment is rewritten atomically as it grows, a full one is
left as it is and a new one begun. A run meant to go on for a week keeps one segment in memory and
rewrites at most that much every half minute (one file for the whole start held a week's 600,000
decisions of one endpoint, over half a GiB, and took 4.4 CPU s to rewrite each time, on the core
that sends the requests). A resumed run keeps the earlier starts' files and the report plots them
all. A law replays on these rows exactly: they hold everything it was given. ``healthy`` is the
health the law was given (``EndpointGuard.serves``: the endpoint not seen down), not whether its lane
took requests: the lane also closes while a request's failure is checked on a server that serves.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flows.control.adaptive import Decision, Observation
from flows.control.outlook import Outlook
from flows.control.signals import ServerSample
from flows.store.run_store import atomic_file
from flows.store.start_stamp import start_stamp

TIMELINE_DIR = "timeline"
SEGMENT_ROWS = 3600
"""Decisions per file: an hour of one endpoint polled once a second (about 4 MiB in memory, 0.02 CPU s
to write: bench/timeline_growth.py; 5 MiB with the newcomer's 32 sizes that answers' lengths add,
measured with tracemalloc on 3,600 rows of 60 requests in flight)."""
OUTLOOK_COLUMNS = {
    "outlook_now_tokens": "now_tokens",
    "outlook_peaks": "peaks",
    "newcomer_prompt": "newcomer_prompt",
    "newcomer_output": "newcomer_output",
    "tokens_per_s": "tokens_per_s",
    "newcomer_sizes": "newcomer_sizes",
}
"""The outlook's fields by their timeline column."""
SAMPLE_COLUMNS = (
    "source",
    "capacity_tokens",
    "block_tokens",
    "max_running",
    "preemptions_total",
    "generation_tokens_total",
    "decode_tokens_per_s",
    "decode_running",
    "decode_steps",
)
"""The server sample's fields a decision does not already carry (it has the usage, running, queued)."""


@dataclass
class DecisionTally:
    """What one endpoint's law did over this start, counted as the decisions come (the report's
    numbers), so nothing needs the decisions kept in memory."""

    decisions: int = 0
    changes: int = 0
    back_offs: int = 0
    retractions: int = 0
    max_queued: int = 0
    min_limit: int | None = None
    max_limit: int | None = None

    def count(self, decision: Decision) -> None:
        self.decisions += 1
        self.changes += decision.limit != decision.previous
        self.back_offs += decision.reason.startswith("back off")
        self.retractions += decision.retractions
        self.max_queued = max(self.max_queued, decision.queued or 0)
        self.min_limit = decision.limit if self.min_limit is None else min(self.min_limit, decision.limit)
        self.max_limit = decision.limit if self.max_limit is None else max(self.max_limit, decision.limit)


class Timeline:
    """Decision rows of this start of the run, for every endpoint, one bounded segment in memory.

    ``add`` runs on the event loop, ``write`` in a worker thread: a lock keeps a row added during a
    write from being counted as written or dropped when a full segment is let go, and a second one
    keeps the last write at the run's end from racing the periodic one for the same file.
    """

    def __init__(self, run_dir: Path, segment_rows: int = SEGMENT_ROWS) -> None:
        self._folder = run_dir / TIMELINE_DIR
        self._stamp = start_stamp()  # names the files: ``part-<start>-<segment>.parquet``
        self._segment_rows = segment_rows
        self._segment = 0
        self._rows: list[dict[str, Any]] = []
        self._written = 0
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self.tallies: dict[str, DecisionTally] = {}

    @property
    def held(self) -> int:
        """Decisions kept in memory: the open segment's, at most ``segment_rows`` and those added
        since its last write."""
        return len(self._rows)

    @property
    def path(self) -> Path:
        """The open segment's file."""
        return self._folder / f"part-{self._stamp}-{self._segment:05d}.parquet"

    def add(
        self, endpoint: str, decision: Decision, sample: ServerSample | None, outlook: Outlook | None
    ) -> None:
        row = {"endpoint": endpoint, **dataclasses.asdict(decision)}
        for column, name in OUTLOOK_COLUMNS.items():
            value = getattr(outlook, name) if outlook else None
            row[column] = list(value) if isinstance(value, tuple) else value
        for name in SAMPLE_COLUMNS:
            row[name] = getattr(sample, name) if sample else None
        with self._lock:
            self._rows.append(row)
        self.tallies.setdefault(endpoint, DecisionTally()).count(decision)

    def write(self) -> None:
        """Rewrite the open segment if anything was added since the last write; begin a new one
        once it is full."""
        with self._writing:
            with self._lock:
                rows, path = self._rows[:], self.path
            if len(rows) == self._written:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as handle:
                pq.write_table(pa.Table.from_pylist(rows), handle, compression="zstd")
            with self._lock:
                self._written = len(rows)
                if self._written >= self._segment_rows:
                    self._rows = self._rows[self._written :]
                    self._segment, self._written = self._segment + 1, 0


def timeline_files(run_dir: Path) -> list[Path]:
    """The run's timeline files in time order: by start, then segment (a start of an earlier release
    wrote one ``part-<start>.parquet``)."""
    return sorted((run_dir / TIMELINE_DIR).glob("part-*.parquet"))


def count_decisions(run_dir: Path) -> int:
    """How many decisions the run's timeline holds, from the files' footers (nothing else is read)."""
    return sum(pq.ParquetFile(path).metadata.num_rows for path in timeline_files(run_dir))


def start_of(path: Path) -> str:
    """The start of the run a timeline file belongs to: the stamp its name carries
    (``part-<start>-<segment>``, or ``part-<start>`` from an earlier release)."""
    return path.stem.split("-")[1]


def iter_timeline(run_dir: Path, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The run's decision rows in order, one file in memory at a time; only ``columns`` if given.

    Each row also has ``start``: the start of the run that decided it, from its file's name (no file
    holds it as a column). A decision's ``at`` counts from its own start, so nothing in the rows
    else tells two starts apart: a second start whose first decision came later than the first's
    last looked like the same start going on.
    """
    for path in timeline_files(run_dir):
        start = start_of(path)
        for row in pq.read_table(path, columns=columns).to_pylist():
            row["start"] = start
            yield row


def read_timeline(run_dir: Path) -> list[dict[str, Any]]:
    """All decision rows of a run, every start and segment in order (empty for a fixed-limit run)."""
    return list(iter_timeline(run_dir))


def outlook_from_row(row: dict[str, Any]) -> Outlook | None:
    """The recorded outlook; None where nothing counted was in flight, or in a timeline recorded
    before the outlook existed (its budget is then not replayed)."""
    if row.get("outlook_peaks") is None:
        return None
    # newcomer_sizes is absent in timelines recorded before the lengths' distribution: None
    fields: dict[str, Any] = {}
    for column, name in OUTLOOK_COLUMNS.items():
        value = row.get(column)
        fields[name] = tuple(value) if isinstance(value, list) else value  # parquet lists: tuples
    return Outlook(**fields)


def observation_from_row(row: dict[str, Any]) -> Observation:
    """What the law was given at one recorded decision: replaying these reproduces the decisions."""
    server = None
    if row["source"] is not None:
        server = ServerSample(
            source=row["source"],
            kv_usage=row["kv_usage"],
            running=row["running"],
            queued=row["queued"],
            **{name: row.get(name) for name in SAMPLE_COLUMNS if name != "source"},
        )
    return Observation(
        at=row["at"],
        server=server,
        in_flight=row["in_flight"],
        waiting=row["waiting"],
        outlook=outlook_from_row(row),
        completions_per_s=row["completions_per_s"],
        healthy=row["healthy"],
        free_vram_bytes=row.get("free_vram_bytes"),
        total_vram_bytes=row.get("total_vram_bytes"),
        request_life_s=row.get("request_life_s"),
        output_spread=row.get("output_spread"),
    )
