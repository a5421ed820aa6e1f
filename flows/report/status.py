"""Where a run stands: from the files on disk (``datagen status``) and from a live session (progress).

Disk is the truth: the status of a run is computed from finished shards only, so it is right for a
run that is going, finished, or was killed an hour ago.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.run.quality import TRUNCATED
from flows.store.run_store import RunStore

if TYPE_CHECKING:
    from flows.config import RunConfig


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

    @property
    def training_rows(self) -> int:
        return self.rows - self.flagged


@dataclass
class RunStatus:
    run_dir: Path
    fingerprint: str | None
    categories: list[CategoryStatus]

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.categories)

    @property
    def rejects(self) -> int:
        return sum(c.rejects for c in self.categories)


def category_status(store: RunStore, name: str, limit: int | None = None) -> CategoryStatus:
    status = CategoryStatus(name=name, limit=limit)
    state = store.category_state(name)
    for row in store.iter_row_columns(name, ["flags", "usage"]):
        status.rows += 1
        flags = row["flags"] or []
        status.flagged += bool(flags)
        status.truncated += TRUNCATED in flags
        usage = row["usage"] or {}
        status.completion_tokens += usage.get("completion_tokens") or 0
        status.prompt_tokens += usage.get("prompt_tokens") or 0
    standing = state.effective_reject_ids
    latest: dict[str, dict[str, Any]] = {}
    for reject in store.iter_rejects(name):
        if reject["id"] in standing:
            latest[reject["id"]] = reject
    status.rejects = len(latest)
    status.retryable_rejects = sum(1 for r in latest.values() if r["retryable"])
    status.reject_reasons = Counter(f"{r['stage']}: {r['reason']}" for r in latest.values())
    return status


def run_status(run_dir: Path) -> RunStatus:
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    if manifest is None:
        raise FileNotFoundError(f"{run_dir} is not a run directory (no manifest.json)")
    limits = {c["name"]: c.get("limit") for c in manifest.get("config", {}).get("categories", [])}
    names = list(limits) + [n for n in store.categories_on_disk() if n not in limits]
    return RunStatus(
        run_dir=run_dir,
        fingerprint=manifest.get("fingerprint"),
        categories=[category_status(store, name, limits.get(name)) for name in names],
    )


def status_document(status: RunStatus) -> dict[str, Any]:
    """The status as plain JSON-able data (``datagen status --json``)."""
    return {
        "run_dir": str(status.run_dir),
        "fingerprint": status.fingerprint,
        "rows": status.rows,
        "rejects": status.rejects,
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
            }
            for c in status.categories
        ],
    }


def expected_prompts(config: RunConfig) -> int | None:
    """Prompts the run will settle, when every category has a limit; None while streaming an unknown total."""
    limits = [c.limit for c in config.categories]
    return None if any(limit is None for limit in limits) else sum(limit or 0 for limit in limits)
