from __future__ import annotations

import json
from typing import Any

import pytest

from flows.client.responses import Generation, Usage
from flows.client.sampling import SamplingParams
from flows.run.quality import quality_flags
from flows.run.regen import Regenerated
from flows.run.rows import output_row, raw_row_id, reject_row, sent_system_prompt
from prompts.records import PromptRecord, SourceRef

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _call(name: str, arguments: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_flags_truncated_empty_and_tool_problems() -> None:
    assert quality_flags({"content": "ok"}, "stop", None) == []
    assert quality_flags({"content": "partial"}, "length", None) == ["truncated"]
    assert quality_flags({"content": "  "}, "stop", None) == ["empty"]
    ok = {"content": None, "tool_calls": [_call("get_weather", '{"city": "Oslo"}')]}
    assert quality_flags(ok, "tool_calls", TOOLS) == []
    bad_args = {"content": None, "tool_calls": [_call("get_weather", '{"city": ')]}
    assert quality_flags(bad_args, "tool_calls", TOOLS) == ["bad_tool_arguments"]
    unknown = {"content": None, "tool_calls": [_call("launch_rocket", "{}")]}
    assert quality_flags(unknown, "tool_calls", TOOLS) == ["unknown_tool"]


@pytest.mark.parametrize("finish", ["repetition", "content_filter"])
def test_an_answer_stopped_for_another_reason_is_flagged(finish: str) -> None:
    """vLLM's "repetition" stops an answer that loops: not a continuation for a drafter to learn."""
    message = {"role": "assistant", "content": "again and again and again"}
    assert quality_flags(message, finish, None) == ["odd_finish"]
    assert quality_flags(message, "stop", None) == []


def test_output_row_follows_the_contract() -> None:
    record = PromptRecord(
        id="p1",
        category="chat",
        source=SourceRef("ds", "train", 7),
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
    )
    generation = Generation(
        message={
            "role": "assistant",
            "content": "hello",
            "reasoning_content": "greet back",
            "tool_calls": None,
        },
        finish_reason="length",
        usage=Usage(prompt_tokens=4, completion_tokens=9, reasoning_tokens=3, cached_tokens=1),
        model="m",
        latency_s=1.5,
        ttft_s=0.2,
        attempts=2,
    )
    sampling = SamplingParams(max_tokens=9, chat_template_kwargs={"thinking": True})
    regenerated = Regenerated(messages=[*record.messages, generation.message], generations=[generation])
    row = output_row(record, regenerated, sampling, "http://127.0.0.1:1", "key1")
    assert row["id"] == "p1" and row["category"] == "chat" and row["prompt_hash"] == "key1"
    assert row["stop_reason"] is None and row["requests"] == 1
    assert row["source"] == {"dataset": "ds", "split": "train", "row": 7}
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert row["system_prompt"] == ""
    assert row["messages"][1]["reasoning_content"] == "greet back"
    assert set(row["messages"][0]) == {
        "role",
        "content",
        "reasoning_content",
        "tool_calls",
        "tool_call_id",
        "name",
    }
    assert json.loads(row["tools"]) == TOOLS
    assert row["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 9,
        "reasoning_tokens": 3,
        "cached_tokens": 1,
    }
    assert json.loads(row["sampling"])["chat_template_kwargs"] == {"thinking": True}
    assert (row["attempts"], row["latency_s"], row["ttft_s"]) == (2, 1.5, 0.2)
    assert row["flags"] == ["truncated"]
    assert row["created_at"].tzinfo is not None


def test_reject_row_truncates_detail_and_raw_ids_are_stable() -> None:
    row = reject_row(
        record_id="x",
        category="c",
        source={"dataset": "d", "split": "s", "row": 1},
        stage="convert",
        reason="no user turn",
        detail="y" * 5000,
    )
    assert len(row["detail"]) == 2000 and row["retryable"] is False
    assert raw_row_id({"a": 1, "b": [2]}) == raw_row_id({"b": [2], "a": 1})
    assert raw_row_id({"a": 1}) != raw_row_id({"a": 2})


def test_flags_cover_every_regenerated_turn_once() -> None:
    record = PromptRecord(
        id="p",
        category="c",
        source=SourceRef("d", "s", 0),
        messages=[{"role": "user", "content": "q"}],
        tools=TOOLS,
    )
    usage = Usage(prompt_tokens=1, completion_tokens=1, reasoning_tokens=0, cached_tokens=0)
    bad_call = Generation(
        message={"role": "assistant", "content": None, "tool_calls": [_call("get_weather", "{oops")]},
        finish_reason="tool_calls",
        usage=usage,
        model="m",
        latency_s=0.1,
        ttft_s=0.1,
        attempts=1,
    )
    cut = Generation(
        message={"role": "assistant", "content": "partial", "tool_calls": None},
        finish_reason="length",
        usage=usage,
        model="m",
        latency_s=0.1,
        ttft_s=0.1,
        attempts=1,
    )
    regenerated = Regenerated(messages=[], generations=[bad_call, bad_call, cut], stop_reason="truncated")
    row = output_row(record, regenerated, SamplingParams(max_tokens=4), "http://x")
    assert row["flags"] == ["bad_tool_arguments", "truncated"]
    assert row["requests"] == 3 and row["stop_reason"] == "truncated"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "hi"}], ""),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], "Be brief."),
        ([{"role": "system", "content": None}, {"role": "user", "content": "hi"}], ""),
    ],
)
def test_the_row_records_the_system_prompt_that_was_sent(
    messages: list[dict[str, Any]], expected: str
) -> None:
    assert sent_system_prompt(messages) == expected


def test_a_row_asked_with_the_room_left_beside_its_prompt_says_so() -> None:
    record = PromptRecord(
        id="r", category="c", source=SourceRef("d", "t", 0), messages=[{"role": "user", "content": "q"}]
    )
    generation = Generation(
        message={"role": "assistant", "content": "a", "reasoning_content": None, "tool_calls": None},
        finish_reason="stop",
        usage=Usage(prompt_tokens=850, completion_tokens=40),
        model="m",
        latency_s=1.0,
        ttft_s=None,
        attempts=1,
        max_tokens=174,
    )
    row = output_row(
        record,
        Regenerated([*record.messages, generation.message], [generation]),
        SamplingParams(max_tokens=600),
        "e",
    )
    assert json.loads(row["sampling"])["max_tokens"] == 174 and row["flags"] == []
