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
        row["outlook_now_tokens"] = outlook.now_tokens if outlook else None
        row["outlook_peaks"] = list(outlook.peaks) if outlook else None
        row["newcomer_prompt"] = outlook.newcomer_prompt if outlook else None
        row["newcomer_output"] = outlook.newcomer_output if outlook else None
        row["tokens_per_s"] = outlook.tokens_per_s if outlook else None
        row["source"] = sample.source if sample else None
        row["capacity_tokens"] = sample.capacity_tokens if sample else None
        row["preemptions_total"] = sample.preemptions_total if sample else None
        row["generation_tokens_total"] = sample.generation_tokens_total if sample else None
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
    return Outlook(
        now_tokens=row["outlook_now_tokens"],
        peaks=tuple(row["outlook_peaks"]),
        newcomer_prompt=row["newcomer_prompt"],
        newcomer_output=row["newcomer_output"],
        tokens_per_s=row["tokens_per_s"],
    )


def observation_from_row(row: dict[str, Any]) -> Observation:
    """What the law was given at one recorded decision: replaying these reproduces the decisions."""
    server = None
    if row["source"] is not None:
        server = ServerSample(
            source=row["source"],
            kv_usage=row["kv_usage"],
            running=row["running"],
            queued=row["queued"],
            preemptions_total=row["preemptions_total"],
            capacity_tokens=row["capacity_tokens"],
            generation_tokens_total=row["generation_tokens_total"],
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
