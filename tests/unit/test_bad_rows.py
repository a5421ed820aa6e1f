"""One malformed row is one reject with a reason; the rows after it are still asked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from flows.config import CategoryConfig
from flows.run.prompt_stream import Ask, Reject, StreamCounts, category_items
from flows.store.run_store import CategoryState
from prompts import formats

CATEGORY = CategoryConfig(name="chat", source="unused.jsonl", format="messages")
GOOD = {"messages": [{"role": "user", "content": "after the bad one"}]}


def _outcome(bad: dict[str, Any], category: CategoryConfig = CATEGORY) -> tuple[list[str], int]:
    """Reject reasons of a stream of one bad row then one good row, and how many records came out."""
    items = list(category_items(category, CategoryState(), StreamCounts(), rows=[(0, bad), (1, GOOD)]))
    reasons = [i.row["reason"] for i in items if isinstance(i, Reject)]
    return reasons, sum(isinstance(i, Ask) for i in items)


def _with_tools(tools: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "weather?"}], "tools": tools}


@pytest.mark.parametrize(
    ("tools", "reason"),
    [
        ([{"type": "function", "function": "get_weather"}], "tool 1: function is a str, not an object"),
        ([{"type": "function", "function": {"parameters": {}}}], "tool 1: function has no name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
            "tool 1: parameters is a str",
        ),
        ([{"type": "retrieval", "function": {"name": "f"}}], "tool 1 has type 'retrieval'"),
        (["get_weather"], "tools column is not a list of objects"),
        ('{"not": "a list"}', "tools column is not a list of objects"),
        ("[{broken", "tools column is not valid JSON"),
    ],
)
def test_a_tool_schema_that_is_not_an_object_is_a_reject_naming_it(tools: Any, reason: str) -> None:
    reasons, records = _outcome(_with_tools(tools))
    assert len(reasons) == 1 and reasons[0].startswith(reason)
    assert records == 1


def test_a_converter_crashing_on_one_row_rejects_that_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = formats.get_converter("messages")

    def fragile(row: Mapping[str, Any]) -> formats.Converted:
        if "boom" in row:
            raise AttributeError("'str' object has no attribute 'get'")
        return real(row)

    monkeypatch.setitem(formats._REGISTRY, "messages", fragile)
    reasons, records = _outcome({"boom": True})
    assert reasons == ["cannot convert: AttributeError: 'str' object has no attribute 'get'"]
    assert records == 1
