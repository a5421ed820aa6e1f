"""A category's prompts as a stream: read, filter, convert, sample, dedup, skip what is done, cut in shards.

Streaming (never a list of the whole source) keeps memory flat on million-row sets, and the done-set
check here is what makes resume ask nothing twice. Every row that does not become a request is
counted by the step that dropped it, so a shrink is always explained.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from flows.config import CategoryConfig
from flows.run.regen import first_turn
from flows.run.rows import raw_row_id, reject_row
from flows.say import SAY
from flows.store.parts import Part
from flows.store.run_store import CategoryState
from prompts.dedup import KEY_VERSION, DedupIndex, prompt_key, sample_score
from prompts.errors import ConversionError
from prompts.filters import row_filter
from prompts.formats import to_record
from prompts.readers import dataset_label, iter_rows
from prompts.records import PromptRecord

Rows = Iterable[tuple[int, dict[str, Any]]]
MAX_UNEXPECTED_REASON = 200

log = logging.getLogger(__name__)

EARLY_ROWS = 1000
"""Rows that reach conversion before the category is judged for a wrong format or column names."""
EARLY_REJECT_SHARE = 0.95
"""A category whose first ``EARLY_ROWS`` rows are rejected at least this often is stopped."""


class MostlyRejected(ValueError):
    """Nearly every row of a category fails conversion: the format or the column names are wrong,
    and going on would only write one reject per source row (millions on a large set)."""


@dataclass
class StreamCounts:
    """What happened to the source rows of one category in this run (for previews and summaries)."""

    read: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    converted: int = 0
    not_sampled: int = 0
    duplicates: int = 0
    duplicates_across: Counter[str] = field(default_factory=Counter)
    taken: int = 0
    already_done: int = 0
    passed_by_limit: int = 0
    """Records left unclaimed on resume because those the category already holds fill its ``limit``:
    a prompt it shares with another category, read here first this time and there first before."""
    other_parts: int = 0
    """Records that belong to other parts of a run split with ``--part`` (their conversion rejects
    are in ``rejected`` already: counted here too, the "to ask" step subtracted them twice)."""
    yielded: int = 0
    """Items handed to the pipeline in this run (records to ask and new conversion rejects)."""
    exhausted: bool = False
    """The stream has ended (source read or limit reached): ``yielded`` is this run's exact total."""

    def steps(self) -> list[tuple[str, int]]:
        """Rows left after each step, in order."""
        after_filter = self.read - self.filtered.total()
        after_convert = after_filter - self.rejected.total()
        after_quota = after_convert - self.not_sampled
        after_dedup = after_quota - self.duplicates
        return [
            ("read", self.read),
            ("after filters", after_filter),
            ("converted", after_convert),
            ("after quota", after_quota),
            ("after dedup", after_dedup),
            (
                "to ask (not done yet)",
                after_dedup - self.already_done - self.other_parts - self.passed_by_limit,
            ),
        ]


@dataclass(frozen=True)
class Reject:
    """A reject produced before any request (stage ``convert``), to be written as it is."""

    row: dict[str, Any]


@dataclass(frozen=True)
class Ask:
    """A record to ask, with its dedup key (its rows' ``prompt_hash``), hashed once when claimed."""

    record: PromptRecord
    prompt_hash: str


def dedup_key(record: PromptRecord, category: CategoryConfig, version: int = KEY_VERSION) -> str:
    """What is asked: the first turn in ``first_turn`` mode, every user/system turn otherwise.

    ``version``: the run's key version (its ``DedupIndex``'s), a new run's by default."""
    if category.mode == "first_turn":
        turns = first_turn(record.messages)
    else:
        turns = [m for m in record.messages if m.get("role") in ("system", "user")]
    return prompt_key(turns, record.tools, version=version)


def prepared(record: PromptRecord, category: CategoryConfig) -> PromptRecord:
    """Apply the category's system prompt override and tool policy to a converted record."""
    changes: dict[str, Any] = {}
    if category.system_prompt is not None:
        rest = [m for m in record.messages if m.get("role") != "system"]
        changes["messages"] = [{"role": "system", "content": category.system_prompt}, *rest]
    if not category.send_tools and record.tools:
        changes["tools"] = None
    return dataclasses.replace(record, **changes) if changes else record


def source_rows(category: CategoryConfig) -> Rows:
    return iter_rows(category.source, split=category.split, subset=category.subset)


class CategoryStream:
    """The category's rows turned into records and rejects (one reusable conversion step)."""

    def __init__(self, category: CategoryConfig) -> None:
        self.category = category
        self.dataset = dataset_label(category.source)
        self.filter = row_filter(category.format, category.filters)

    def convert(self, index: int, row: dict[str, Any]) -> PromptRecord | Reject | str:
        """A record, a conversion reject, or the reason a filter dropped the row.

        Any failure on one row is that row's reject: only an unreadable source stops a category.
        """
        if self.category.columns:
            row = {**row, **{want: row[have] for want, have in self.category.columns.items() if have in row}}
        category = self.category
        try:
            if self.filter is not None and "__invalid__" not in row:
                reason = self.filter.reject_reason(row)
                if reason is not None:
                    return reason
            record = to_record(
                row,
                index=index,
                category=category.name,
                dataset=self.dataset,
                split=category.split,
                fmt=category.format,
            )
            return prepared(record, category)
        except ConversionError as error:
            reason = error.reason
        except Exception as error:  # a converter's blind spot must not stop the category
            reason = f"cannot convert: {type(error).__name__}: {error}"[:MAX_UNEXPECTED_REASON]
        return Reject(
            reject_row(
                record_id=raw_row_id(row),
                category=category.name,
                source={"dataset": self.dataset, "split": category.split, "row": index},
                stage="convert",
                reason=reason,
                detail=str(row),
            )
        )

    def quota_ids(self, rows: Rows) -> set[str]:
        """For a count quota: the ids of the ``count`` records with the smallest seeded hashes."""
        quota = self.category.quota
        assert quota is not None and quota.count is not None
        seed = quota.seed

        def scored() -> Iterator[tuple[float, str]]:
            for index, row in rows:
                item = self.convert(index, row)
                if isinstance(item, PromptRecord):
                    yield sample_score(seed, item.id), item.id

        return {rid for _, rid in heapq.nsmallest(quota.count, scored())}


def category_items(
    category: CategoryConfig,
    state: CategoryState,
    counts: StreamCounts,
    rows: Rows | None = None,
    *,
    dedup: DedupIndex | None = None,
    rows_again: Callable[[], Rows] | None = None,
    part: Part | None = None,
) -> Iterator[Ask | Reject]:
    """Records still to ask, and conversion rejects not yet recorded, in source order.

    ``rows_again`` re-opens the source for a count quota's extra pass (defaults to re-reading it).
    With ``part``, only the items whose id is the part's are handed out, but every part walks the
    whole stream: dedup claims and the ``limit`` count every part's records, so each part takes
    exactly its share of what one unsplit run would take, with no word from the others.

    The ``limit`` counts the records already held first: categories stream side by side, so which
    one claims a prompt two of them hold is whichever reads it first, and that may change from one
    start to the next. Counted as met in source order, a prompt claimed elsewhere before (and not
    answered there) became one more record ahead of those already held: ``limit`` + 1 rows.
    """
    mine = part.owns if part is not None else (lambda _: True)
    stream = CategoryStream(category)
    opened = rows if rows is not None else source_rows(category)
    quota = category.quota
    chosen: set[str] | None = None
    if quota is not None and quota.count is not None:
        chosen = stream.quota_ids(opened)
        opened = rows_again() if rows_again is not None else source_rows(category)
    index_ = dedup if dedup is not None else DedupIndex()
    seen_ids: set[str] = set()
    room = None if category.limit is None else category.limit - state.records_done
    for index, row in opened:
        if category.limit is not None and counts.taken >= category.limit:
            counts.exhausted = True
            return
        counts.read += 1
        item = stream.convert(index, row)
        if isinstance(item, str):
            counts.filtered[item] += 1
            continue
        if isinstance(item, Reject):
            rid = item.row["id"]
            if rid in seen_ids:
                counts.duplicates += 1
                continue
            seen_ids.add(rid)
            counts.rejected[item.row["reason"]] += 1
            check_early_rejects(category, counts)
            if mine(rid) and rid not in state.done_ids:
                counts.yielded += 1
                yield item
            continue
        counts.converted += 1
        if (chosen is not None and item.id not in chosen) or (
            quota is not None
            and quota.fraction is not None
            and sample_score(quota.seed, item.id) >= quota.fraction
        ):
            counts.not_sampled += 1
            continue
        if item.id in seen_ids:
            counts.duplicates += 1
            continue
        seen_ids.add(item.id)
        if item.id in state.done_ids:  # its prompt's dedup key was claimed when the done-set was read
            counts.taken += 1
            if mine(item.id):
                counts.already_done += 1
            else:
                counts.other_parts += 1
            continue
        if room is not None and room <= 0:  # unclaimed, so the category that held it may take it
            counts.passed_by_limit += 1
            continue
        key = dedup_key(item, category, index_.version)
        owner = index_.claim(key, category.name)
        if owner is not None:
            counts.duplicates += 1
            if owner != category.name:
                counts.duplicates_across[owner] += 1
            continue
        counts.taken += 1
        if room is not None:
            room -= 1
        if not mine(item.id):
            counts.other_parts += 1
            continue
        counts.yielded += 1
        yield Ask(item, key)
    counts.exhausted = True
    say_if_none_converted(category, counts)


def check_early_rejects(category: CategoryConfig, counts: StreamCounts) -> None:
    """Raise ``MostlyRejected`` once ``EARLY_ROWS`` rows reached conversion and nearly all failed."""
    rejected = counts.rejected.total()
    if counts.converted + rejected != EARLY_ROWS or rejected < EARLY_REJECT_SHARE * EARLY_ROWS:
        return
    raise MostlyRejected(f"{rejected} of the first {EARLY_ROWS} rows {_failed_conversion(category, counts)}")


def say_if_none_converted(category: CategoryConfig, counts: StreamCounts) -> None:
    """A source shorter than ``EARLY_ROWS`` of which no row converted ends its stream with a warning:
    a ShareGPT file read as ``messages`` ended as a run of rejects, its summary saying how to load
    the (empty) data. Not a stop: the rejects are written, nothing is left to ask."""
    rejected = counts.rejected.total()
    if counts.converted or not rejected or rejected >= EARLY_ROWS:  # a longer one stopped at its EARLY_ROWS
        return
    log.warning(
        "category %s: all %d rows %s",
        category.name,
        rejected,
        _failed_conversion(category, counts),
        extra=SAY,
    )


def _failed_conversion(category: CategoryConfig, counts: StreamCounts) -> str:
    reasons = "; ".join(f"{reason} ({n})" for reason, n in counts.rejected.most_common(3))
    return (
        f"failed conversion as format {category.format!r} (first reasons: {reasons}); check the "
        f"category's `format` and `columns` (`datagen prompts preview {category.name}` shows a few rows)"
    )


def take(items: Iterator[Ask | Reject], size: int) -> list[Ask | Reject]:
    """The next shard of at most ``size`` items (an empty list when the stream is done)."""
    return list(islice(items, size))
