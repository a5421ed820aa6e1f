"""The model stand-in: prompt token estimates, answer shapes, tool-call arguments, token text."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from sglang_launch.simulator.answers import (
    THINK_END,
    AnswerCursor,
    AnswerPlan,
    AnswerRequest,
    AnswerSettings,
    estimate_prompt_tokens,
    plan_answer,
    sample_value,
)
from sglang_launch.simulator.config import SimConfig

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "detailed": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "number"}},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def plan(
    max_new: int = 100,
    settings: AnswerSettings | None = None,
    messages: list[dict[str, Any]] = USER,
    **kw: Any,
) -> AnswerPlan:
    return plan_answer(AnswerRequest(messages, max_new, **kw), settings or AnswerSettings())


def test_prompt_tokens_are_four_chars_per_token_plus_the_template() -> None:
    assert estimate_prompt_tokens([{"role": "user", "content": "hello there"}], None) == 3 + 4 + 3
    two = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 401}]
    assert estimate_prompt_tokens(two, None) == 3 + (4 + 100) + (4 + 101)
    parts = [{"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}]
    assert estimate_prompt_tokens(parts, None) == 3 + 4 + 1
    with_tools = estimate_prompt_tokens(USER, [WEATHER])
    assert with_tools == estimate_prompt_tokens(USER, None) + 10 + math.ceil(len(json.dumps([WEATHER])) / 4)
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]
    assert estimate_prompt_tokens(calls, None) == 3 + 4 + math.ceil(
        len(json.dumps(calls[0]["tool_calls"])) / 4
    )


def test_the_same_request_always_gets_the_same_answer() -> None:
    a, b = plan(), plan()
    assert a == b
    assert AnswerCursor(a).advance(a.output_tokens) == AnswerCursor(b).advance(b.output_tokens)
    other_seed = plan(settings=AnswerSettings(seed=1))
    assert AnswerCursor(other_seed).advance(100) != AnswerCursor(a).advance(100)


def test_answers_run_to_max_tokens_unless_they_stop_early() -> None:
    always = AnswerSettings(stop_probability=1.0)
    stopped = plan(100, always)
    assert stopped.finish_reason == "stop" and 1 <= stopped.output_tokens < 100
    assert stopped.matched_stop == 151645
    assert plan(100, always, ignore_eos=True).finish_reason == "length"
    never = plan(100, AnswerSettings(stop_probability=0.0))
    assert (never.finish_reason, never.output_tokens, never.matched_stop) == ("length", 100, None)


def test_about_the_configured_share_of_answers_stop_early() -> None:
    plans = [plan(100, messages=[{"role": "user", "content": f"question {i}"}]) for i in range(1000)]
    stops = sum(p.finish_reason == "stop" for p in plans)
    assert 70 <= stops <= 130  # stop_probability 0.1, seeded


def test_answers_may_stop_at_an_exponential_length_a_long_tail_past_the_cap_runs_to_it() -> None:
    """Reasoning chains: most end short, a few run ten times as long; one longer than the cap runs to it."""
    tail = AnswerSettings(stop_probability=1.0, stop_length_mean=500.0)
    questions = [[{"role": "user", "content": f"question {i}"}] for i in range(2000)]
    plans = [plan(4096, tail, messages) for messages in questions]
    stopped = [p.output_tokens for p in plans if p.finish_reason == "stop"]
    assert 470 < sum(stopped) / len(stopped) < 530
    assert sum(n > 1500 for n in stopped) / len(plans) == pytest.approx(math.exp(-3), abs=0.015)
    capped = [
        p for p in (plan(1000, tail, messages) for messages in questions) if p.finish_reason == "length"
    ]
    assert len(capped) / len(questions) == pytest.approx(math.exp(-2), abs=0.03)
    assert {p.output_tokens for p in capped} == {1000}


def test_reasoning_comes_first_and_counts_in_the_completion() -> None:
    p = plan(100, AnswerSettings(stop_probability=0.0, reasoning=True, reasoning_fraction=0.3))
    assert (p.reasoning_tokens, p.content_tokens, p.output_tokens) == (30, 70, 100)
    assert p.reported_reasoning_tokens == 30
    text = AnswerCursor(p).advance(100)
    assert text.reasoning and text.content and not text.tool_started
    assert plan(100, AnswerSettings(reasoning=True), thinking=False).reasoning_tokens == 0


def test_unseparated_reasoning_stays_in_the_content_closed_by_think_end() -> None:
    p = plan(100, AnswerSettings(stop_probability=0.0, reasoning=True), separate_reasoning=False)
    text = AnswerCursor(p).advance(100)
    assert text.reasoning == "" and THINK_END in text.content
    assert p.reported_reasoning_tokens == 0


def test_rendering_in_runs_gives_the_same_text_as_at_once() -> None:
    for settings, kw in [
        (AnswerSettings(reasoning=True, stop_probability=0.0), {}),
        (AnswerSettings(reasoning=True, stop_probability=0.0), {"separate_reasoning": False}),
        (AnswerSettings(tool_calls=True, reasoning=True), {"tools": [WEATHER], "tool_choice": "required"}),
    ]:
        p = plan(120, settings, **kw)
        whole = AnswerCursor(p).advance(p.output_tokens)
        cursor, runs = AnswerCursor(p), []
        rng = random.Random(7)
        while cursor.position < p.output_tokens:
            runs.append(cursor.advance(rng.randint(1, 9)))
        assert "".join(r.reasoning for r in runs) == whole.reasoning
        assert "".join(r.content for r in runs) == whole.content
        assert "".join(r.tool_arguments for r in runs) == whole.tool_arguments
        assert sum(r.tool_started for r in runs) == (1 if p.tool_call else 0)


def test_a_tool_call_answer_has_arguments_built_from_the_schema() -> None:
    p = plan(200, AnswerSettings(tool_calls=True), tools=[WEATHER], tool_choice="required")
    assert p.finish_reason == "tool_calls" and p.tool_call is not None
    assert (
        p.tool_call.name == "get_weather" and p.tool_call.id.startswith("call_") and len(p.tool_call.id) == 29
    )
    args = json.loads(p.tool_call.arguments)
    assert list(args) == ["city", "unit", "days", "detailed", "hours"]
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["days"], int) and isinstance(args["detailed"], bool)
    assert all(isinstance(h, float) for h in args["hours"])
    assert p.content_tokens == 0 and p.output_tokens == p.tool_call.tokens
    raw = f'<tool_call>\n{{"name": "get_weather", "arguments": {p.tool_call.arguments}}}\n</tool_call>'
    assert p.tool_call.tokens == math.ceil(len(raw) / 4)


@pytest.mark.parametrize(
    ("tool_choice", "probability", "expected"),
    [
        ("none", 1.0, None),
        ("auto", 0.0, None),
        ("auto", 1.0, "get_weather"),
        (None, 1.0, "get_weather"),
        ("required", 0.0, "get_weather"),
        ({"type": "function", "function": {"name": "get_time"}}, 0.0, "get_time"),
        ({"type": "function", "function": {"name": "missing"}}, 1.0, None),
    ],
)
def test_tool_choice_decides_whether_and_which_tool_is_called(
    tool_choice: object, probability: float, expected: str | None
) -> None:
    settings = AnswerSettings(tool_calls=True, tool_call_probability=probability)
    tools = [WEATHER] if expected != "get_time" else [WEATHER, TIME]
    p = plan(200, settings, tools=tools, tool_choice=tool_choice)
    assert (p.tool_call.name if p.tool_call else None) == expected


def test_no_tool_call_without_the_knob_or_without_room() -> None:
    assert plan(200, AnswerSettings(), tools=[WEATHER], tool_choice="required").tool_call is None
    tiny = plan(5, AnswerSettings(tool_calls=True), tools=[WEATHER], tool_choice="required")
    assert tiny.tool_call is None and tiny.finish_reason in ("stop", "length")
    broken = plan(200, AnswerSettings(tool_calls=True), tools=[{"type": "function"}], tool_choice="required")
    assert broken.tool_call is None


def test_streamed_tool_call_opens_with_id_and_name_then_carries_argument_slices() -> None:
    p = plan(200, AnswerSettings(tool_calls=True), tools=[WEATHER], tool_choice="required")
    assert p.tool_call is not None
    cursor = AnswerCursor(p)
    first = cursor.advance(1)
    assert first.tool_started and first.tool_arguments == ""
    rest = [cursor.advance(1) for _ in range(p.output_tokens - 1)]
    assert not any(r.tool_started for r in rest)
    assert "".join(r.tool_arguments for r in rest) == p.tool_call.arguments


def test_sample_value_follows_json_schema_types() -> None:
    rng = random.Random(0)
    assert sample_value({"type": ["null", "integer"]}, rng) in range(101)
    assert sample_value({"type": "null"}, rng) is None
    assert sample_value({"enum": ["a"]}, rng) == "a"
    assert sample_value({"properties": {"x": {"type": "boolean"}}}, rng).keys() == {"x"}
    assert isinstance(sample_value("not a schema", rng), str)


def test_settings_come_from_the_simulator_config() -> None:
    knobs = {"stop_probability": 0.3, "stop_length_mean": 800.0, "reasoning": True, "tool_calls": True}
    cfg = SimConfig(**knobs, tool_call_probability=0.9, seed=5)
    assert AnswerSettings.from_config(cfg) == AnswerSettings(**knobs, tool_call_probability=0.9, seed=5)
