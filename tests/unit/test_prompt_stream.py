from __future__ import annotations

from flows.config import CategoryConfig
from flows.prompt_stream import Reject, StreamCounts, category_items, take
from flows.store import CategoryState
from prompts.records import PromptRecord


def _rows(n: int, start: int = 0) -> list[tuple[int, dict]]:
    return [
        (i, {"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}"}]})
        for i in range(start, start + n)
    ]


CATEGORY = CategoryConfig(name="chat", source="unused.jsonl", format="messages")


def test_stream_skips_done_ids_counts_them_and_respects_the_limit() -> None:
    counts = StreamCounts()
    limited = CATEGORY.model_copy(update={"limit": 6})
    state = CategoryState(row_ids={"r1", "r2"}, final_reject_ids={"r3"})
    items = list(category_items(limited, state, counts, rows=_rows(20)))
    assert [i.id for i in items if isinstance(i, PromptRecord)] == ["r0", "r4", "r5"]
    assert (counts.read, counts.converted, counts.already_done) == (6, 6, 3)


def test_retryable_rejects_are_asked_again() -> None:
    state = CategoryState(retryable_reject_ids={"r0"})
    items = list(category_items(CATEGORY, state, StreamCounts(), rows=_rows(2)))
    assert [i.id for i in items if isinstance(i, PromptRecord)] == ["r0", "r1"]


def test_duplicate_rows_are_asked_once_and_counted() -> None:
    counts = StreamCounts()
    rows = _rows(3) + _rows(3)
    items = list(category_items(CATEGORY, CategoryState(), counts, rows=rows))
    assert len(items) == 3 and counts.duplicates == 3


def test_unconvertible_rows_become_rejects_once_with_a_reason_and_stable_id() -> None:
    counts = StreamCounts()
    rows = [
        *_rows(1),
        (1, {"messages": [{"role": "assistant", "content": "no question"}]}),
        (2, {"__invalid__": "line 3: Expecting value"}),
    ]
    items = list(category_items(CATEGORY, CategoryState(), counts, rows=rows))
    rejects = [i for i in items if isinstance(i, Reject)]
    assert len(rejects) == 2
    assert all(r.row["stage"] == "convert" for r in rejects)
    assert rejects[1].row["reason"] == "invalid input: line 3: Expecting value"
    assert rejects[1].row["source"]["row"] == 2
    # a resumed run that already recorded them does not record them again
    done = CategoryState(final_reject_ids={r.row["id"] for r in rejects})
    again = list(category_items(CATEGORY, done, StreamCounts(), rows=rows))
    assert not [i for i in again if isinstance(i, Reject)]
    assert counts.rejected == 2


def test_take_cuts_shards_lazily() -> None:
    items = category_items(CATEGORY, CategoryState(), StreamCounts(), rows=_rows(5))
    assert [len(take(items, 2)) for _ in range(4)] == [2, 2, 1, 0]
