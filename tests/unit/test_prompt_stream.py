from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from flows.config import CategoryConfig
from flows.run.prompt_stream import (
    EARLY_ROWS,
    Ask,
    MostlyRejected,
    Reject,
    StreamCounts,
    category_items,
    take,
)
from flows.store.parts import Part
from flows.store.run_store import CategoryState, RunStore
from prompts.dedup import DedupIndex


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
    assert _ids(items) == ["r0", "r4", "r5"]
    assert (counts.read, counts.converted, counts.already_done) == (6, 6, 3)


def test_a_resume_builds_its_done_set_once_not_once_per_source_row() -> None:
    """The done-set was built anew for each row the stream read: a resume's walk of the source took
    time quadratic in the rows done (20,000 done rows: 8 s; a million: hours before any request)."""

    class CountedUnion(set[str]):
        unions = 0

        def __or__(self, other: object) -> set[str]:
            CountedUnion.unions += 1
            return set(self).union(other)  # type: ignore[arg-type]

    state = CategoryState(row_ids=CountedUnion(f"r{i}" for i in range(100)))
    items = list(category_items(CATEGORY, state, StreamCounts(), rows=_rows(200)))
    assert _ids(items) == [f"r{i}" for i in range(100, 200)]
    assert CountedUnion.unions <= 1


def test_retryable_rejects_are_asked_again() -> None:
    state = CategoryState(retryable_reject_ids={"r0"})
    items = list(category_items(CATEGORY, state, StreamCounts(), rows=_rows(2)))
    assert _ids(items) == ["r0", "r1"]


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
    assert counts.rejected.total() == 2


def test_take_cuts_shards_lazily() -> None:
    items = category_items(CATEGORY, CategoryState(), StreamCounts(), rows=_rows(5))
    assert [len(take(items, 2)) for _ in range(4)] == [2, 2, 1, 0]


def _ids(items: list) -> list[str]:
    return [i.record.id for i in items if isinstance(i, Ask)]


def test_fraction_quota_is_stable_whatever_the_order() -> None:
    sampled = CategoryConfig.model_validate({**CATEGORY.model_dump(), "quota": {"fraction": 0.5, "seed": 7}})
    forward = _ids(list(category_items(sampled, CategoryState(), StreamCounts(), rows=_rows(200))))
    backward = _ids(list(category_items(sampled, CategoryState(), StreamCounts(), rows=_rows(200)[::-1])))
    assert sorted(forward) == sorted(backward)
    assert 70 < len(forward) < 130
    other_seed = CategoryConfig.model_validate(
        {**sampled.model_dump(), "quota": {"fraction": 0.5, "seed": 8}}
    )
    assert set(
        _ids(list(category_items(other_seed, CategoryState(), StreamCounts(), rows=_rows(200))))
    ) != set(forward)


def test_count_quota_takes_exactly_count_rows_stably() -> None:
    sampled = CategoryConfig.model_validate({**CATEGORY.model_dump(), "quota": {"count": 10, "seed": 1}})
    counts = StreamCounts()
    first = _ids(
        list(category_items(sampled, CategoryState(), counts, rows=_rows(100), rows_again=lambda: _rows(100)))
    )
    shuffled = _rows(100)[50:] + _rows(100)[:50]
    second = _ids(
        list(
            category_items(
                sampled, CategoryState(), StreamCounts(), rows=shuffled, rows_again=lambda: shuffled
            )
        )
    )
    assert len(first) == 10 and sorted(first) == sorted(second)
    assert counts.not_sampled == 90


def test_dedup_normalised_text_within_and_across_categories() -> None:
    rows = [
        (0, {"id": "a", "messages": [{"role": "user", "content": "What is  2+2?"}]}),
        (1, {"id": "b", "messages": [{"role": "user", "content": "What is 2+2? "}]}),
        (2, {"id": "c", "messages": [{"role": "user", "content": "what is 2+2?"}]}),
    ]
    index = DedupIndex()
    counts = StreamCounts()
    assert _ids(list(category_items(CATEGORY, CategoryState(), counts, rows=rows, dedup=index))) == ["a", "c"]
    assert counts.duplicates == 1
    other = CategoryConfig(name="other", source="x.jsonl", format="messages")
    other_counts = StreamCounts()
    rows_b = [(0, {"id": "z", "messages": [{"role": "user", "content": "What is 2+2?"}]})]
    assert _ids(list(category_items(other, CategoryState(), other_counts, rows=rows_b, dedup=index))) == []
    assert other_counts.duplicates_across == {"chat": 1}


def test_filters_are_counted_by_reason_before_conversion() -> None:
    cat = CategoryConfig(
        name="code", source="x.jsonl", format="opencodeinstruct", filters={"min_average_test_score": 0.5}
    )
    rows = [
        (i, {"id": f"o{i}", "input": f"write f{i}", "output": "", "average_test_score": score})
        for i, score in enumerate(["0.9", "0.1", "oops"])
    ]
    counts = StreamCounts()
    assert _ids(list(category_items(cat, CategoryState(), counts, rows=rows))) == ["o0"]
    assert counts.filtered.total() == 2
    assert [n for _, n in counts.steps()][:3] == [3, 1, 1]


def test_system_prompt_override_and_tools_off() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    rows = [
        (
            0,
            {
                "id": "s",
                "tools": tools,
                "messages": [{"role": "system", "content": "old"}, {"role": "user", "content": "hi"}],
            },
        )
    ]
    cat = CategoryConfig(
        name="c", source="x.jsonl", format="messages", system_prompt="Be brief.", send_tools=False
    )
    (item,) = list(category_items(cat, CategoryState(), StreamCounts(), rows=rows))
    assert isinstance(item, Ask)
    record = item.record
    assert record.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert record.tools is None


def _role_content_rows(n: int, column: str) -> list[tuple[int, dict]]:
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    return [(i, {"id": f"s{i}", column: [{**turns[0], "content": f"q{i}"}, turns[1]]}) for i in range(n)]


def test_a_category_maps_column_names_to_the_formats() -> None:
    sharegpt = CategoryConfig(
        name="sg", source="unused.jsonl", format="sharegpt", columns={"conversations": "dialogue"}
    )
    items = list(
        category_items(sharegpt, CategoryState(), StreamCounts(), rows=_role_content_rows(3, "dialogue"))
    )
    assert [(i.record.id, i.record.messages) for i in items if isinstance(i, Ask)] == [
        (f"s{n}", [{"role": "user", "content": f"q{n}"}]) for n in range(3)
    ]


def test_a_short_source_of_which_no_row_converts_ends_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under ``EARLY_ROWS`` rows the early stop never came: a ShareGPT file read as ``messages`` made
    a run of rejects and a summary on how to load the empty data, and nothing said why."""
    wrong = CategoryConfig(name="sg", source="unused.jsonl", format="sharegpt")  # rows hold "dialogue"
    items = list(
        category_items(wrong, CategoryState(), StreamCounts(), rows=_role_content_rows(40, "dialogue"))
    )
    assert len(items) == 40 and all(isinstance(item, Reject) for item in items)  # every reject written
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line == (
        "category sg: all 40 rows failed conversion as format 'sharegpt' (first reasons: no conversations "
        "list (40)); check the category's `format` and `columns` (`datagen prompts preview sg` shows a few "
        "rows)"
    )
    caplog.clear()
    good = CategoryConfig(name="sg", source="unused.jsonl", format="sharegpt")
    list(category_items(good, CategoryState(), StreamCounts(), rows=_role_content_rows(3, "conversations")))
    assert not caplog.records


def test_a_category_of_nearly_all_rejects_stops_after_the_first_rows_with_one_line() -> None:
    wrong = CategoryConfig(name="sg", source="unused.jsonl", format="sharegpt")  # rows hold "dialogue"
    counts = StreamCounts()
    rows = _role_content_rows(5000, "dialogue")
    with pytest.raises(MostlyRejected) as info:
        take(category_items(wrong, CategoryState(), counts, rows=rows), 10_000)
    assert counts.read == EARLY_ROWS
    assert str(info.value) == (
        "1000 of the first 1000 rows failed conversion as format 'sharegpt' (first reasons: "
        "no conversations list (1000)); check the category's `format` and `columns` "
        "(`datagen prompts preview sg` shows a few rows)"
    )


def test_a_category_with_many_rejects_below_the_share_runs_to_the_end() -> None:
    bad = [(i, {"conversations": f"not a list {i}"}) for i in range(940)]  # 94% of the first 1000 rows
    counts = StreamCounts()
    sharegpt = CategoryConfig(name="sg", source="unused.jsonl", format="sharegpt")
    items = take(
        category_items(
            sharegpt, CategoryState(), counts, rows=bad + _role_content_rows(2000, "conversations")
        ),
        10_000,
    )
    assert (counts.read, counts.rejected.total(), len(items)) == (2940, 940, 2940)


def _part_ids(
    category: CategoryConfig, rows: list, part: Part, state: CategoryState | None = None
) -> list[str]:
    return _ids(
        list(category_items(category, state or CategoryState(), StreamCounts(), rows=rows, part=part))
    )


def test_parts_split_the_stream_of_one_whole_run_limit_and_dedup_included() -> None:
    """K parts, each knowing nothing of the others, ask exactly what one whole run asks, once."""
    limited = CATEGORY.model_copy(update={"limit": 30})
    copies = [(100 + i, {"id": f"copy{i}", "messages": row["messages"]}) for i, row in _rows(10)]
    rows = _rows(5) + copies + _rows(35, start=5)  # copy0-4 repeat r0-4; r5-9 repeat copy5-9
    whole = _ids(list(category_items(limited, CategoryState(), StreamCounts(), rows=rows)))
    parts = [_part_ids(limited, rows, Part(i, 3)) for i in (1, 2, 3)]
    union = [rid for ids in parts for rid in ids]
    assert sorted(union) == sorted(whole) and len(union) == len(set(union)) == 30
    assert all(parts)  # each part has its share
    assert {f"copy{i}" for i in range(5, 10)} <= set(union) and not {"copy0", "r5"} & set(union)


def test_a_part_counts_what_it_leaves_to_the_others_and_resumes_from_the_union() -> None:
    counts = StreamCounts()
    rows = _rows(20)
    mine = _part_ids(CATEGORY, rows, Part(1, 2))
    done_elsewhere = {f"r{i}" for i in range(20)} - set(mine)
    state = CategoryState(row_ids=set(mine[:2]) | done_elsewhere)
    again = list(category_items(CATEGORY, state, counts, rows=rows, part=Part(1, 2)))
    assert _ids(again) == mine[2:]
    assert (counts.already_done, counts.other_parts, counts.yielded) == (
        2,
        len(done_elsewhere),
        len(mine) - 2,
    )
    assert dict(counts.steps())["to ask (not done yet)"] == len(mine) - 2


def test_conversion_rejects_are_written_by_their_own_part_only() -> None:
    rows = [
        (i, {"note": f"bad{i}", "messages": [{"role": "assistant", "content": f"no question {i}"}]})
        for i in range(20)
    ]

    def reject_ids(part: Part | None) -> list[str]:
        items = category_items(CATEGORY, CategoryState(), StreamCounts(), rows=rows, part=part)
        return [i.row["id"] for i in items if isinstance(i, Reject)]

    one, two = reject_ids(Part(1, 2)), reject_ids(Part(2, 2))
    assert sorted(one + two) == sorted(reject_ids(None)) and len(one + two) == 20 and one and two


def test_the_to_ask_step_of_a_part_with_conversion_rejects_is_what_it_asks() -> None:
    """Another part's conversion rejects were subtracted twice (as rejects and as the other parts'):
    part 1/2 of 40 rows, 10 of them unconvertible, said 13 to ask and asked 17."""
    rows = [
        (i, {"messages": [{"role": "assistant", "content": f"no question {i}"}]})
        if i % 4 == 0
        else (i, {"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}"}]})
        for i in range(40)
    ]
    counts = StreamCounts()
    items = list(category_items(CATEGORY, CategoryState(), counts, rows=rows, part=Part(1, 2)))
    asked = sum(isinstance(item, Ask) for item in items)
    assert dict(counts.steps())["to ask (not done yet)"] == asked and counts.other_parts == 30 - asked


@pytest.mark.parametrize("with_id", [True, False])
def test_a_row_with_a_lone_surrogate_is_one_reject_and_its_category_goes_on(
    with_id: bool, tmp_path: Path
) -> None:
    """A JSON escape without its pair (valid JSON, not valid Unicode) stopped the category at that row
    on every resume: the prompt's hash could not encode it, nor, for a row without an id, its reject's."""
    bad = json.loads('{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}')
    if with_id:
        bad["id"] = "x1"
    rows = [(0, _rows(1)[0][1]), (1, bad), (2, _rows(1, start=2)[0][1])]
    items = list(category_items(CATEGORY, CategoryState(), StreamCounts(), rows=rows))
    assert _ids(items) == ["r0", "r2"]
    (reject,) = [item.row for item in items if isinstance(item, Reject)]
    assert reject["reason"].startswith("message 1: text is not valid Unicode")
    store = RunStore(tmp_path / "run")  # and the reject itself can be written
    writer = store.reject_writer("chat", flush_rows=10, flush_seconds=60)
    writer.write([reject])
    assert store.category_state("chat").final_reject_ids == {reject["id"]}


def test_a_resume_keeps_a_limited_category_to_its_limit_when_a_shared_prompt_changes_hands() -> None:
    """Categories stream side by side, each in its own thread (``Pipeline.run_category``), so which one
    claims a prompt they share is a race. Here 'general' claimed it in the first start and was killed
    before answering; 'chat' (limit 3) skipped it and answered three others. On resume nothing on disk
    says 'general' had it, and 'chat' met it first: a fourth row in a category of limit 3."""
    shared = [{"role": "user", "content": "the question both sets hold"}]
    chat = CATEGORY.model_copy(update={"limit": 3})
    chat_rows = [(i, {"id": f"c{i}", "messages": row["messages"]}) for i, row in _rows(4)]
    chat_rows.insert(1, (9, {"id": "c-shared", "messages": shared}))
    general = CategoryConfig(name="general", source="unused.jsonl", format="messages")
    general_rows = [(0, {"id": "g-shared", "messages": shared})]

    first = DedupIndex()
    assert _ids(
        list(category_items(general, CategoryState(), StreamCounts(), rows=general_rows, dedup=first))
    )
    answered = [i for i in category_items(chat, CategoryState(), StreamCounts(), rows=chat_rows, dedup=first)]
    assert _ids(answered) == ["c0", "c1", "c2"]  # all answered; general's request died with the process

    held = CategoryState(
        row_ids=set(_ids(answered)), prompt_hashes={i.prompt_hash for i in answered if isinstance(i, Ask)}
    )
    resumed = DedupIndex()
    for key in held.prompt_hashes:  # what Categories.load_states claims
        resumed.claim(key, chat.name)
    counts = StreamCounts()
    chat_again = _ids(list(category_items(chat, held, counts, rows=chat_rows, dedup=resumed)))
    general_again = _ids(
        list(category_items(general, CategoryState(), StreamCounts(), rows=general_rows, dedup=resumed))
    )

    assert len(held.row_ids) + len(chat_again) == 3
    assert (chat_again, general_again) == ([], ["g-shared"])  # the shared prompt is asked once, in general
    assert (counts.already_done, counts.exhausted) == (3, True)
