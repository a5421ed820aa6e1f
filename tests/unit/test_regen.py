from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from flows.client.errors import PermanentRequestError, TransientRequestError
from flows.client.responses import Generation, Usage
from flows.client.sampling import SamplingParams
from flows.run.regen import (
    Replay,
    Reply,
    Stop,
    Turn,
    call_names,
    first_turn,
    follow_up,
    history_message,
    regenerate,
    retie_results,
    split_turns,
)
from prompts.convert_chat import convert_messages, convert_sharegpt
from prompts.convert_glaive import convert_glaive
from prompts.records import Message, PromptRecord, SourceRef

SAMPLING = SamplingParams(max_tokens=64)


def _call(name: str, call_id: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _gen(
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    *,
    finish: str = "stop",
    usage: Usage | None = None,
    latency_s: float = 1.0,
    ttft_s: float | None = 0.1,
    attempts: int = 1,
    model: str = "m",
) -> Generation:
    return Generation(
        message={"role": "assistant", "content": content, "reasoning_content": None, "tool_calls": calls},
        finish_reason=finish,
        usage=usage or Usage(prompt_tokens=10, completion_tokens=5),
        model=model,
        latency_s=latency_s,
        ttft_s=ttft_s,
        attempts=attempts,
    )


def _answer(content: str) -> Message:
    """The stored/sent form of ``_gen(content)``: unset fields dropped."""
    return {"role": "assistant", "content": content}


def _call_answer(*calls: dict[str, Any]) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


class ScriptedGenerator:
    """Returns (or raises) the scripted items in order and records a copy of every request."""

    def __init__(self, *script: Generation | Exception) -> None:
        self.script = list(script)
        self.sent: list[list[Message]] = []
        self.tools: list[Any] = []

    async def generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> Generation:
        assert sampling is SAMPLING
        self.sent.append(copy.deepcopy(messages))
        self.tools.append(tools)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def _record(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> PromptRecord:
    return PromptRecord(
        id="r", category="c", source=SourceRef("d", "train", 0), messages=messages, tools=tools
    )


def _glaive(index: int) -> PromptRecord:
    lines = (
        (Path(__file__).parent.parent / "fixtures" / "prompts" / "glaive.jsonl")
        .read_text("utf-8")
        .splitlines()
    )
    converted = convert_glaive(json.loads(lines[index]))
    return _record(converted.messages, converted.tools)


def _three_turns() -> PromptRecord:
    row = {
        "id": "s1",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "old a1"},
            {"from": "human", "value": "q2"},
            {"from": "gpt", "value": "old a2"},
            {"from": "human", "value": "q3"},
            {"from": "gpt", "value": "old a3"},
        ],
    }
    return _record(convert_sharegpt(row).messages)


SYSTEM = {"role": "system", "content": "Be brief."}
Q1, Q2, Q3 = ({"role": "user", "content": f"q{i}"} for i in (1, 2, 3))

# glaive.jsonl rows: 0 = one calendar call; 2 = two user turns, convert_currency then get_local_time;
# 3 = tools offered, recorded answer is text.
CAL_ARGS = '{"title": "Recital", "date": "2024-06-14"}'


# --- first_turn ----------------------------------------------------------------------------------


async def test_first_turn_sends_system_and_first_user_and_stores_the_answer() -> None:
    client = ScriptedGenerator(_gen("a1"))
    result = await regenerate(_three_turns(), client, SAMPLING)
    assert client.sent == [[SYSTEM, Q1]]
    assert result.messages == [SYSTEM, Q1, _answer("a1")]
    assert result.stop_reason is None
    assert len(result.generations) == 1


async def test_first_turn_sends_the_tools_and_keeps_a_tool_call_answer_without_a_stop() -> None:
    record = _glaive(0)
    answer = _gen(calls=[_call("add_calendar_reminder", "c1", CAL_ARGS)], finish="tool_calls")
    client = ScriptedGenerator(answer)
    result = await regenerate(record, client, SAMPLING, "first_turn")
    assert client.tools == [record.tools]
    assert result.messages == [
        record.messages[0],
        _call_answer(_call("add_calendar_reminder", "c1", CAL_ARGS)),
    ]
    assert result.stop_reason is None
    assert result.finish_reason == "tool_calls"


def test_first_turn_helper_keeps_leading_messages_up_to_the_first_user_but_no_recorded_answer() -> None:
    greeting = {"role": "assistant", "content": "Hi!"}  # the recording's, not the target model's
    assert first_turn([SYSTEM, greeting, Q1, _answer("x"), Q2]) == [SYSTEM, Q1]
    with pytest.raises(ValueError, match="no user turn"):
        first_turn([SYSTEM])


# --- all_turns -----------------------------------------------------------------------------------


async def test_all_turns_sends_each_user_turn_after_the_regenerated_history() -> None:
    client = ScriptedGenerator(_gen("a1"), _gen("a2"), _gen("a3"))
    result = await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    a1, a2, a3 = _answer("a1"), _answer("a2"), _answer("a3")
    assert client.sent == [
        [SYSTEM, Q1],
        [SYSTEM, Q1, a1, Q2],
        [SYSTEM, Q1, a1, Q2, a2, Q3],
    ]
    assert result.messages == [SYSTEM, Q1, a1, Q2, a2, Q3, a3]
    assert result.stop_reason is None


async def test_all_turns_skips_recorded_tool_calls_and_results() -> None:
    record = _glaive(2)
    client = ScriptedGenerator(_gen("a1"), _gen("a2"))
    result = await regenerate(record, client, SAMPLING, "all_turns")
    user1, user2 = record.messages[0], record.messages[4]
    assert client.sent == [[user1], [user1, _answer("a1"), user2]]
    assert result.messages == [user1, _answer("a1"), user2, _answer("a2")]
    assert result.stop_reason is None


async def test_all_turns_stops_at_a_regenerated_tool_call() -> None:
    record = _glaive(2)
    client = ScriptedGenerator(_gen(calls=[_call("convert_currency", "c1")], finish="tool_calls"))
    result = await regenerate(record, client, SAMPLING, "all_turns")
    assert len(client.sent) == 1
    assert result.stop_reason == "tool call in all_turns mode: convert_currency (use tool_replay)"
    assert result.messages == [record.messages[0], _call_answer(_call("convert_currency", "c1"))]


# --- tool_replay ---------------------------------------------------------------------------------


async def test_tool_replay_replays_the_recorded_result_tied_to_the_new_call_id() -> None:
    record = _glaive(0)
    new_call = _call("add_calendar_reminder", "call_new", CAL_ARGS)  # arguments differ from the recording
    client = ScriptedGenerator(_gen(calls=[new_call], finish="tool_calls"), _gen("Done."))
    result = await regenerate(record, client, SAMPLING, "tool_replay")
    user = record.messages[0]
    replayed = {
        "role": "tool",
        "tool_call_id": "call_new",
        "name": "add_calendar_reminder",
        "content": '{"status": "ok", "reminder_id": 7731}',
    }
    assert client.sent == [[user], [user, _call_answer(new_call), replayed]]
    assert client.tools == [record.tools, record.tools]
    assert result.messages == [user, _call_answer(new_call), replayed, _answer("Done.")]
    assert result.stop_reason is None
    assert result.finish_reason == "stop"


async def test_tool_replay_walks_every_user_turn_and_every_call() -> None:
    record = _glaive(2)
    currency, clock = _call("convert_currency", "n1"), _call("get_local_time", "n2")
    client = ScriptedGenerator(_gen(calls=[currency]), _gen("a1"), _gen(calls=[clock]), _gen("a2"))
    result = await regenerate(record, client, SAMPLING, "tool_replay")
    user1, result1, user2, result2 = (record.messages[i] for i in (0, 2, 4, 6))
    tied1 = {**result1, "tool_call_id": "n1"}
    tied2 = {**result2, "tool_call_id": "n2"}
    assert client.sent[3] == [
        user1,
        _call_answer(currency),
        tied1,
        _answer("a1"),
        user2,
        _call_answer(clock),
        tied2,
    ]
    assert [len(sent) for sent in client.sent] == [1, 3, 5, 7]
    assert result.messages == [*client.sent[3], _answer("a2")]
    assert result.stop_reason is None


async def test_tool_replay_stops_when_the_call_diverges() -> None:
    record = _glaive(2)
    wrong = _call("get_local_time", "n1", '{"city": "Tokyo"}')
    client = ScriptedGenerator(_gen(calls=[wrong], finish="tool_calls"), _gen("never sent"))
    result = await regenerate(record, client, SAMPLING, "tool_replay")
    assert len(client.sent) == 1
    assert result.stop_reason == "tool call diverged: expected convert_currency, got get_local_time"
    assert result.messages == [record.messages[0], _call_answer(wrong)]


async def test_tool_replay_stops_when_no_call_comes_where_one_was_recorded() -> None:
    client = ScriptedGenerator(_gen("I cannot do that."))
    result = await regenerate(_glaive(0), client, SAMPLING, "tool_replay")
    assert len(client.sent) == 1
    assert result.stop_reason == "tool call diverged: expected add_calendar_reminder, got no call"


async def test_tool_replay_stops_when_a_call_comes_where_none_was_recorded() -> None:
    client = ScriptedGenerator(_gen(calls=[_call("get_local_time", "n1")]))
    result = await regenerate(_glaive(3), client, SAMPLING, "tool_replay")
    assert len(client.sent) == 1
    assert result.stop_reason == "tool call diverged: expected no call, got get_local_time"


async def test_tool_replay_stops_when_the_recording_has_no_result_for_a_matching_call() -> None:
    record = _record([Q1, _call_answer(_call("f", "old"))], [{"type": "function", "function": {"name": "f"}}])
    client = ScriptedGenerator(_gen(calls=[_call("f", "new")]))
    result = await regenerate(record, client, SAMPLING, "tool_replay")
    assert result.stop_reason == "no recorded tool results to replay for f"
    assert len(client.sent) == 1


# --- truncation, bounds, errors, totals -----------------------------------------------------------


async def test_a_truncated_answer_stops_the_conversation() -> None:
    client = ScriptedGenerator(_gen("a1 cut", finish="length"), _gen("never sent"))
    result = await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    assert len(client.sent) == 1
    assert result.stop_reason == "truncated"
    assert result.finish_reason == "length"
    assert result.messages == [SYSTEM, Q1, _answer("a1 cut")]


async def test_a_truncated_tool_call_stops_before_replaying() -> None:
    cut = _call("add_calendar_reminder", "c1", '{"title": "Rec')
    client = ScriptedGenerator(_gen(calls=[cut], finish="length"))
    result = await regenerate(_glaive(0), client, SAMPLING, "tool_replay")
    assert len(client.sent) == 1
    assert result.stop_reason == "truncated"


async def test_a_truncated_last_answer_completes_the_conversation() -> None:
    client = ScriptedGenerator(_gen("a1"), _gen("a2"), _gen("a3 cut", finish="length"))
    result = await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    assert result.stop_reason is None
    assert result.finish_reason == "length"


async def test_usage_latency_and_attempts_are_summed_over_requests() -> None:
    client = ScriptedGenerator(
        _gen("a1", usage=Usage(10, 5, 1, 0), latency_s=1.5, ttft_s=0.2, attempts=1, model="m1"),
        _gen("a2", usage=Usage(20, 6, 2, 8), latency_s=2.0, ttft_s=0.3, attempts=3, model="m2"),
        _gen(
            "a3", usage=Usage(30, 7, 3, 16), latency_s=0.5, ttft_s=None, attempts=1, model="m3", finish="eos"
        ),
    )
    result = await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    assert result.usage == Usage(prompt_tokens=60, completion_tokens=18, reasoning_tokens=6, cached_tokens=24)
    assert result.latency_s == 4.0
    assert result.ttft_s == 0.2
    assert result.attempts == 5
    assert result.model == "m3"
    assert result.finish_reason == "eos"


async def test_max_requests_bounds_the_conversation() -> None:
    currency, clock = _call("convert_currency", "n1"), _call("get_local_time", "n2")
    client = ScriptedGenerator(_gen(calls=[currency]), _gen("a1"), _gen(calls=[clock]), _gen("a2"))
    result = await regenerate(_glaive(2), client, SAMPLING, "tool_replay", max_requests=2)
    assert len(client.sent) == 2
    assert result.stop_reason == "max_requests reached (2)"
    assert result.messages[-1] == _answer("a1")  # the next user turn is not stored unanswered


async def test_max_requests_after_a_call_leaves_the_results_unsent() -> None:
    currency = _call("convert_currency", "n1")
    client = ScriptedGenerator(_gen(calls=[currency]))
    result = await regenerate(_glaive(2), client, SAMPLING, "tool_replay", max_requests=1)
    assert result.stop_reason == "max_requests reached (1)"
    assert result.messages[-1] == _call_answer(currency)


async def test_a_transient_error_on_a_later_turn_propagates_unchanged() -> None:
    error = TransientRequestError("server unavailable (503)", status=503, attempts=6)
    client = ScriptedGenerator(_gen("a1"), error)
    with pytest.raises(TransientRequestError) as raised:
        await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    assert raised.value is error


async def test_a_later_turn_over_the_context_keeps_the_turns_answered() -> None:
    """The history grows each turn; the 400 of the turn that outgrew the context threw away the
    answers already paid for."""
    error = PermanentRequestError("prompt longer than the context", status=400)
    client = ScriptedGenerator(_gen("a1"), error)
    result = await regenerate(_three_turns(), client, SAMPLING, "all_turns")
    assert result.messages == [SYSTEM, Q1, _answer("a1")]
    assert result.stop_reason == "refused: prompt longer than the context"
    with pytest.raises(PermanentRequestError):  # the first turn refused: nothing to keep, a reject
        await regenerate(_three_turns(), ScriptedGenerator(error), SAMPLING, "all_turns")


async def test_bad_mode_and_bound_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown regeneration mode 'every_turn'"):
        await regenerate(_three_turns(), ScriptedGenerator(), SAMPLING, "every_turn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_requests must be >= 1, got 0"):
        await regenerate(_three_turns(), ScriptedGenerator(), SAMPLING, "all_turns", max_requests=0)


# --- pure message logic -------------------------------------------------------------------------


def test_split_turns_groups_replies_and_their_tool_results() -> None:
    messages = _glaive(2).messages
    assert split_turns(messages) == [
        Turn([messages[0]], [Reply(messages[1], [messages[2]]), Reply(messages[3])]),
        Turn([messages[4]], [Reply(messages[5], [messages[6]]), Reply(messages[7])]),
    ]


def test_split_turns_sends_mid_conversation_prompts_and_drops_a_trailing_non_user_tail() -> None:
    note = {"role": "system", "content": "Now answer in French."}
    orphan = {"role": "tool", "tool_call_id": "x", "content": "{}"}
    old = _answer("old")
    assert split_turns([Q1, old, note, orphan, Q2, old, note]) == [
        Turn([Q1], [Reply(old)]),
        Turn([note, orphan, Q2], [Reply(old)]),
    ]


async def test_all_turns_never_sends_or_stores_a_recorded_answer_after_a_mid_conversation_system() -> None:
    note = {"role": "system", "content": "Now answer in French."}
    old1, old2 = _answer("OLD ANSWER 1"), _answer("OLD ANSWER 2")
    assert split_turns([Q1, old1, note, old2, Q2]) == [
        Turn([Q1], [Reply(old1), Reply(old2)]),
        Turn([note, Q2]),
    ]
    record = _record([Q1, old1, note, old2, Q2])
    client = ScriptedGenerator(_gen("a1"), _gen("a2"))
    result = await regenerate(record, client, SAMPLING, "all_turns")
    assert client.sent[1] == [Q1, _answer("a1"), note, Q2]
    assert [m["content"] for m in result.messages if m["role"] == "assistant"] == ["a1", "a2"]


async def test_a_recorded_glaive_greeting_is_neither_sent_nor_stored() -> None:
    row = {
        "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
        "chat": "ASSISTANT: Hello! How can I help you today? <|endoftext|>\n\nUSER: What is 2+2?\n\n\n"
        "ASSISTANT: 4 <|endoftext|>",
    }
    converted = convert_glaive(row)
    record = _record(converted.messages, converted.tools)
    result = await regenerate(record, ScriptedGenerator(_gen("four")), SAMPLING, "first_turn")
    assert converted.messages[0] == {"role": "assistant", "content": "Hello! How can I help you today?"}
    assert result.messages == [{"role": "user", "content": "What is 2+2?"}, _answer("four")]


@pytest.mark.parametrize("layout", ["sharegpt", "messages"])
async def test_tool_replay_replays_a_one_question_tool_conversation_of_the_chat_layouts(layout: str) -> None:
    recorded_call = {
        "id": "old_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"},
    }
    if layout == "sharegpt":
        converted = convert_sharegpt(
            {
                "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]),
                "conversations": [
                    {"from": "human", "value": "Weather in Oslo?"},
                    {
                        "from": "function_call",
                        "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                    },
                    {"from": "observation", "value": '{"temp_c": 3}'},
                    {"from": "gpt", "value": "It is 3 C in Oslo."},
                ],
            }
        )
    else:
        converted = convert_messages(
            {
                "messages": [
                    {"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": None, "tool_calls": [recorded_call]},
                    {"role": "tool", "tool_call_id": "old_0", "content": '{"temp_c": 3}'},
                    {"role": "assistant", "content": "It is 3 C in Oslo."},
                ],
                "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            }
        )
    record = _record(converted.messages, converted.tools)
    call = _call("get_weather", "new_0", '{"city": "Oslo"}')
    client = ScriptedGenerator(_gen(None, [call]), _gen("3 C."))
    result = await regenerate(record, client, SAMPLING, "tool_replay")
    assert result.stop_reason is None
    assert client.sent[1][-1] == {"role": "tool", "content": '{"temp_c": 3}', "tool_call_id": "new_0"}
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert "It is 3 C" not in json.dumps(result.messages)  # the recorded answer: neither sent nor stored


def test_retie_results_by_recorded_id_then_by_position() -> None:
    recorded = Reply(
        _call_answer(_call("a", "old_a"), _call("b", "old_b")),
        [
            {"role": "tool", "tool_call_id": "old_b", "name": "b", "content": "B"},
            {"role": "tool", "tool_call_id": "old_a", "name": "a", "content": "A"},
        ],
    )
    answer = _call_answer(_call("a", "new_a"), _call("b", "new_b"))
    assert retie_results(recorded, answer) == [
        {"role": "tool", "tool_call_id": "new_b", "name": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "new_a", "name": "a", "content": "A"},
    ]
    untied = Reply(recorded.message, [{"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}])
    assert [r["tool_call_id"] for r in retie_results(untied, answer)] == ["new_a", "new_b"]


def test_follow_up_matches_names_in_order_and_count() -> None:
    recorded = [Reply(_call_answer(_call("a", "o1"), _call("b", "o2")), [{"role": "tool", "content": "A"}])]
    swapped = _call_answer(_call("b", "n1"), _call("a", "n2"))
    fewer = _call_answer(_call("a", "n1"))
    same = _call_answer(_call("a", "n1", '{"x": 1}'), _call("b", "n2"))
    assert follow_up(recorded, 0, swapped, replay_tools=True) == Stop(
        "tool call diverged: expected a + b, got b + a"
    )
    assert follow_up(recorded, 0, fewer, replay_tools=True) == Stop(
        "tool call diverged: expected a + b, got a"
    )
    assert follow_up(recorded, 0, same, replay_tools=True) == Replay(
        [{"role": "tool", "content": "A", "tool_call_id": "n1"}]
    )
    assert follow_up(recorded, 1, _answer("done"), replay_tools=True) is None
    assert follow_up(recorded, 0, _answer("done"), replay_tools=False) is None


def test_history_message_drops_unset_fields_but_keeps_null_content() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "reasoning_content": None,
        "tool_calls": [_call("f", "1")],
    }
    assert history_message(message) == {"role": "assistant", "content": None, "tool_calls": [_call("f", "1")]}
    assert call_names(message) == ["f"]
    assert call_names(_answer("x")) == []
