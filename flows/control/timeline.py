"""Every controller decision with its inputs and reason, kept as a parquet table in the run directory.

One file per start of the run (``timeline/part-<start>.parquet``), rewritten atomically as it grows,
so a resumed run keeps the earlier starts' timelines and the report can plot them all. A law
replays on these rows exactly: they hold everything it was given.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flows.control.adaptive import Decision, Observation
from flows.control.outlook import Outlook
from flows.control.signals import ServerSample
from flows.store.run_store import atomic_file

TIMELINE_DIR = "timeline"
OUTLOOK_COLUMNS = {
    "outlook_now_tokens": "now_tokens",
    "outlook_peaks": "peaks",
    "newcomer_prompt": "newcomer_prompt",
    "newcomer_output": "newcomer_output",
    "tokens_per_s": "tokens_per_s",
}
"""The outlook's fields by their timeline column."""
SAMPLE_COLUMNS = ("source", "capacity_tokens", "block_tokens", "preemptions_total", "generation_tokens_total")
"""The server sample's fields a decision does not already carry (it has the usage, running, queued)."""


class Timeline:
    """Decision rows of this start of the run, for every endpoint."""

    def __init__(self, run_dir: Path) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        self.path = run_dir / TIMELINE_DIR / f"part-{stamp}.parquet"
        self.rows: list[dict[str, Any]] = []
        self._written = 0

    def add(
        self, endpoint: str, decision: Decision, sample: ServerSample | None, outlook: Outlook | None
    ) -> None:
        row = {"endpoint": endpoint, **dataclasses.asdict(decision)}
        for column, name in OUTLOOK_COLUMNS.items():
            value = getattr(outlook, name) if outlook else None
            row[column] = list(value) if isinstance(value, tuple) else value
        for name in SAMPLE_COLUMNS:
            row[name] = getattr(sample, name) if sample else None
        self.rows.append(row)

    def write(self) -> None:
        """Rewrite this start's file if anything was added since the last write."""
        if len(self.rows) == self._written:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.path) as handle:
            pq.write_table(pa.Table.from_pylist(self.rows), handle, compression="zstd")
        self._written = len(self.rows)


def read_timeline(run_dir: Path) -> list[dict[str, Any]]:
    """All decision rows of a run, every start in order (empty for a fixed-limit run)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((run_dir / TIMELINE_DIR).glob("part-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def outlook_from_row(row: dict[str, Any]) -> Outlook | None:
    """The recorded outlook; None where nothing counted was in flight, or in a timeline recorded
    before the outlook existed (its budget is then not replayed)."""
    if row.get("outlook_peaks") is None:
        return None
    fields = {name: row[column] for column, name in OUTLOOK_COLUMNS.items()}
    return Outlook(**{**fields, "peaks": tuple(fields["peaks"])})


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
