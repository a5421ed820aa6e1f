"""Where a run stands: from the files on disk (``datagen status``) and from a live session (progress).

Disk is the truth: the status of a run is computed from finished shards only, so it is right for a
run that is going, finished, or was killed an hour ago.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.run.quality import TRUNCATED
from flows.store.parts import part_of_file
from flows.store.run_store import CategoryState, RunStore


@dataclass
class CategoryStatus:
    name: str
    rows: int = 0
    flagged: int = 0
    truncated: int = 0
    rejects: int = 0
    retryable_rejects: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    limit: int | None = None
    reject_reasons: Counter[str] = field(default_factory=Counter)
    repeated_rows: int = 0
    """Rows whose id is already in another row: never made by the store, but counted, not hidden."""
    rows_by_part: Counter[str] = field(default_factory=Counter)
    rejects_by_part: Counter[str] = field(default_factory=Counter)

    training_rows: int = 0
    """Rows ``datagen export`` writes: unflagged, one per id (the first, shard by shard, as it
    reads them). ``rows - flagged`` counted a repeated id twice."""


@dataclass
class RunStatus:
    run_dir: str
    """Where the run's data is: a local path or a URL."""
    fingerprint: str | None
    categories: list[CategoryStatus]
    parts: int | None = None
    """The number of parts the run was split into (``--part i/K``), None for a whole run."""

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.categories)

    @property
    def rejects(self) -> int:
        return sum(c.rejects for c in self.categories)

    @property
    def repeated_rows(self) -> int:
        return sum(c.repeated_rows for c in self.categories)

    def by_part(self) -> dict[str, dict[str, int]]:
        """Rows and standing rejects per part (``"1/4"``), in part order; empty for a whole run."""
        names = {part for c in self.categories for part in (*c.rows_by_part, *c.rejects_by_part)}
        ordered = sorted(names, key=lambda name: int(name.split("/")[0]))
        return {
            part: {
                "rows": sum(c.rows_by_part[part] for c in self.categories),
                "rejects": sum(c.rejects_by_part[part] for c in self.categories),
            }
            for part in ordered
        }


def category_status(store: RunStore, name: str, limit: int | None = None) -> CategoryStatus:
    """A category's numbers from the union of every part's shards, each folder listed and read once.

    Which rejects still stand is decided by the row ids of the very shards counted as rows: read
    apart (the store's done-set first, then the rows again), a shard that a live run wrote between
    the two reads counted its rows while their ids still stood as rejects. The rows are read before
    the rejects, so a reject is only ever newer than the rows it is weighed against.
    """
    status = CategoryStatus(name=name, limit=limit)
    state = CategoryState()
    training: set[str] = set()
    for path, table in store.shard_tables(store.data_dir(name), ["id", "flags", "usage"]):
        part = part_of_file(posixpath.basename(path))
        for row in table.to_pylist():
            status.rows += 1
            status.repeated_rows += row["id"] in state.row_ids
            state.row_ids.add(row["id"])
            if part is not None:
                status.rows_by_part[part] += 1
            flags = row["flags"] or []
            status.flagged += bool(flags)
            if not flags:
                training.add(row["id"])
            status.truncated += TRUNCATED in flags
            usage = row["usage"] or {}
            status.completion_tokens += usage.get("completion_tokens") or 0
            status.prompt_tokens += usage.get("prompt_tokens") or 0
    status.training_rows = len(training)
    latest: dict[str, tuple[dict[str, Any], str | None]] = {}
    columns = ["id", "stage", "reason", "retryable"]
    for path, table in store.shard_tables(store.rejects_dir(name), columns):
        part = part_of_file(posixpath.basename(path))
        for reject in table.to_pylist():
            state.add_reject(reject["id"], reject["retryable"])
            latest[reject["id"]] = (reject, part)
    still = state.effective_reject_ids
    standing = [found for rid, found in latest.items() if rid in still]  # in the order read
    status.rejects = len(standing)
    status.retryable_rejects = sum(1 for r, _ in standing if r["retryable"])
    status.reject_reasons = Counter(f"{r['stage']}: {r['reason']}" for r, _ in standing)
    status.rejects_by_part = Counter(part for _, part in standing if part is not None)
    return status


def run_status(where: RunStore | str | Path) -> RunStatus:
    """The run's status from its files: ``where`` is its store, local folder or URL."""
    store = where if isinstance(where, RunStore) else RunStore(where)
    manifest = store.read_manifest()
    if manifest is None:
        raise FileNotFoundError(f"{store.url()} is not a run directory (no manifest.json)")
    limits = {c["name"]: c.get("limit") for c in manifest.get("config", {}).get("categories", [])}
    names = list(limits) + [n for n in store.categories_on_disk() if n not in limits]
    return RunStatus(
        run_dir=store.url(),
        fingerprint=manifest.get("fingerprint"),
        categories=[category_status(store, name, limits.get(name)) for name in names],
        parts=manifest.get("parts"),
    )


def status_document(status: RunStatus) -> dict[str, Any]:
    """The status as plain JSON-able data (``datagen status --json``)."""
    return {
        "run_dir": str(status.run_dir),
        "fingerprint": status.fingerprint,
        "rows": status.rows,
        "rejects": status.rejects,
        "repeated_rows": status.repeated_rows,
        "parts": status.parts,
        "by_part": status.by_part(),
        "categories": [
            {
                "name": c.name,
                "rows": c.rows,
                "training_rows": c.training_rows,
                "truncated": c.truncated,
                "flagged": c.flagged,
                "rejects": c.rejects,
                "retryable_rejects": c.retryable_rejects,
                "limit": c.limit,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "reject_reasons": dict(c.reject_reasons),
                "repeated_rows": c.repeated_rows,
            }
            for c in status.categories
        ],
    }
