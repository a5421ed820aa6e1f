"""A category's prompts as a stream: read, convert, skip what is done, cap at the limit, cut in shards.

Streaming (never a list of the whole source) keeps memory flat on million-row sets, and the done-set
check here is what makes resume ask nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from flows.config import CategoryConfig
from flows.rows import raw_row_id, reject_row
from flows.store import CategoryState
from prompts.errors import ConversionError
from prompts.formats import to_record
from prompts.readers import dataset_label, iter_rows
from prompts.records import PromptRecord


@dataclass
class StreamCounts:
    """What happened to the source rows of one category in this run (for the summary)."""

    read: int = 0
    converted: int = 0
    already_done: int = 0
    duplicates: int = 0
    rejected: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Reject:
    """A reject produced before any request (stage ``convert``), to be written as it is."""

    row: dict[str, Any]


def category_items(
    category: CategoryConfig,
    state: CategoryState,
    counts: StreamCounts,
    rows: Iterable[tuple[int, dict[str, Any]]] | None = None,
) -> Iterator[PromptRecord | Reject]:
    """Records still to ask, and conversion rejects not yet recorded, in source order."""
    dataset = dataset_label(category.source)
    source_rows = (
        rows if rows is not None else iter_rows(category.source, split=category.split, subset=category.subset)
    )
    seen: set[str] = set()
    for index, row in source_rows:
        if category.limit is not None and counts.converted >= category.limit:
            return
        counts.read += 1
        try:
            record = to_record(
                row,
                index=index,
                category=category.name,
                dataset=dataset,
                split=category.split,
                fmt=category.format,
            )
        except ConversionError as error:
            rid = raw_row_id(row)
            if rid in state.done_ids or rid in seen:
                continue
            seen.add(rid)
            counts.rejected += 1
            counts.reject_reasons[error.reason] = counts.reject_reasons.get(error.reason, 0) + 1
            yield Reject(
                reject_row(
                    record_id=rid,
                    category=category.name,
                    source={"dataset": dataset, "split": category.split, "row": index},
                    stage="convert",
                    reason=error.reason,
                    detail=str(row)[:2000],
                )
            )
            continue
        if record.id in seen:
            counts.duplicates += 1
            continue
        seen.add(record.id)
        counts.converted += 1
        if record.id in state.done_ids:
            counts.already_done += 1
            continue
        yield record


def take(items: Iterator[PromptRecord | Reject], size: int) -> list[PromptRecord | Reject]:
    """The next shard of at most ``size`` items (an empty list when the stream is done)."""
    return list(islice(items, size))
