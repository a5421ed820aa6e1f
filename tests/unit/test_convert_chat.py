"""Chat converters (messages/UltraChat, ShareGPT, Magpie), the format registry and stable ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prompts.convert_chat import convert_magpie, convert_messages, convert_sharegpt, parse_tools
from prompts.errors import ConversionError
from prompts.formats import INVALID_KEY, Converted, get_converter, known_formats, register, to_record
from prompts.records import PromptRecord, SourceRef, content_hash

FIXTURES = Path(__file__).parent.parent / "fixtures" / "prompts"


def _fixture_rows(name: str) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines()]
    return {row.get("id") or row["prompt_id"]: row for row in rows}


SHAREGPT = _fixture_rows("sharegpt.jsonl")
ULTRACHAT = _fixture_rows("ultrachat.jsonl")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


# --- ShareGPT fixture rows ---------------------------------------------------------------------


def test_sharegpt_single_turn_drops_the_old_answer() -> None:
    converted = convert_sharegpt(SHAREGPT["Qx7Lm2A_0"])
    assert converted == Converted(
        messages=[user("Explain what a Bloom filter is in two sentences.")], tools=None, source_id="Qx7Lm2A_0"
    )


def test_sharegpt_system_and_multi_turn_keep_history_up_to_the_last_user_turn() -> None:
    assert convert_sharegpt(SHAREGPT["Rk93Pzz_4"]).messages == [
        system("You are a terse assistant that answers in one line."),
        user("Capital of Australia?"),
        assistant("Canberra."),
        user("And its population, roughly?"),
    ]


def test_sharegpt_leading_assistant_greeting_is_dropped() -> None:
    assert convert_sharegpt(SHAREGPT["u8TfQ1c_12"]).messages == [user("Write a haiku about autumn rain.")]


def test_sharegpt_unicode_is_kept_verbatim_and_chatgpt_is_an_assistant() -> None:
    row = SHAREGPT["Zz01kkA_0"]
    assert convert_sharegpt(row).messages == [
        user("¿Cuál es la diferencia entre «ser» y «estar»? También: 東京 vs 京都 — which is older? 🤔")
    ]
    with_history = {"conversations": [*row["conversations"], {"from": "human", "value": "¿Y?"}]}
    assert convert_sharegpt(with_history).messages[1]["role"] == "assistant"


def test_sharegpt_very_long_prompt_is_untouched() -> None:
    row = SHAREGPT["Lp0ngG3_0"]
    text = row["conversations"][0]["value"]
    assert len(text) == 13456
    assert convert_sharegpt(row).messages == [user(text)]


def test_sharegpt_consecutive_user_turns_merge_and_bard_is_an_assistant() -> None:
    assert convert_sharegpt(SHAREGPT["Ed9eCas_2"]).messages == [
        user("first part of my question...\n\n...and the second part: how do I reverse a linked list?"),
        assistant(
            "Walk the list once, keeping prev and current pointers, and point each node's next at prev "
            "before moving on."
        ),
        user("thanks"),
    ]


# --- ShareGPT edge cases -----------------------------------------------------------------------


def test_sharegpt_role_aliases_empty_values_and_the_conversation_key() -> None:
    row = {
        "conversation": [
            {"from": "system", "value": "Be brief."},
            {"from": "user", "value": "Hi"},
            {"from": "bing", "value": ""},
            {"from": "assistant", "value": None},
            {"from": "human", "value": "   "},
            {"from": "gpt", "value": "Hello."},
            {"from": "human", "value": "Bye"},
            {"from": "chatgpt", "value": "Goodbye."},
        ]
    }
    assert convert_sharegpt(row) == Converted(
        messages=[system("Be brief."), user("Hi"), assistant("Hello."), user("Bye")],
        tools=None,
        source_id=None,
    )


def test_sharegpt_unknown_role_is_rejected_naming_it() -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "narrator", "value": "x"}]}
    with pytest.raises(ConversionError) as excinfo:
        convert_sharegpt(row)
    assert excinfo.value.reason == "unknown role: narrator"


@pytest.mark.parametrize(
    "turns",
    [
        [],
        [{"from": "gpt", "value": "Hello! How can I help?"}],
        [{"from": "system", "value": "Be nice."}, {"from": "gpt", "value": "Hi."}],
        [{"from": "human", "value": ""}, {"from": "gpt", "value": "Hi."}],
    ],
)
def test_sharegpt_without_a_user_turn_is_rejected(turns: list[dict[str, Any]]) -> None:
    with pytest.raises(ConversionError) as excinfo:
        convert_sharegpt({"id": "x", "conversations": turns})
    assert excinfo.value.reason == "no user turn"


def test_sharegpt_turns_in_role_content_shape_convert_like_from_value_turns() -> None:
    from_value = {
        "id": "s1",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Capital of Australia?"},
            {"from": "gpt", "value": "Canberra."},
            {"from": "human", "value": "Population?"},
            {"from": "gpt", "value": "About 470,000."},
        ],
    }
    role_content = {
        "id": "s1",
        "conversations": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of Australia?"},
            {"role": "assistant", "content": "Canberra."},
            {"role": "user", "content": "Population?"},
            {"role": "assistant", "content": "About 470,000."},
        ],
    }
    expected = [
        system("Be brief."),
        user("Capital of Australia?"),
        assistant("Canberra."),
        user("Population?"),
    ]
    assert convert_sharegpt(from_value).messages == expected
    assert convert_sharegpt(role_content) == convert_sharegpt(from_value)


def test_sharegpt_role_content_tool_turns_keep_their_calls_and_pair_results() -> None:
    call = {"type": "function", "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}
    row = {
        "conversations": [
            {"role": "user", "content": "Time in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "09:00"},
            {"role": "user", "content": "Thanks, and now?"},
        ]
    }
    messages = convert_sharegpt(row).messages
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"city": "Oslo"}'}
    assert messages[2] == {
        "role": "tool",
        "content": "09:00",
        "tool_call_id": messages[1]["tool_calls"][0]["id"],
    }


def test_sharegpt_role_content_unknown_role_is_rejected_naming_it() -> None:
    row = {"conversations": [{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}]}
    with pytest.raises(ConversionError) as excinfo:
        convert_sharegpt(row)
    assert excinfo.value.reason == "unknown role: narrator"


def test_sharegpt_missing_conversations_is_rejected() -> None:
    with pytest.raises(ConversionError, match="no conversations list"):
        convert_sharegpt({"id": "x", "text": "hello"})


OSLO_CALL = [
    {"from": "human", "value": "Weather in Oslo?"},
    {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
    {"from": "observation", "value": '{"temp_c": 3}'},
    {"from": "gpt", "value": "It is 3 °C in Oslo."},
]
"""A one-question ShareGPT tool conversation: the call, its recorded result, the recorded answer."""


def test_sharegpt_function_call_and_observation_become_a_linked_tool_exchange() -> None:
    row = {
        "id": "fc1",
        "system": "You can call tools.",
        "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]),
        "conversations": [
            *OSLO_CALL,
            {"from": "human", "value": "And tomorrow?"},
            {"from": "gpt", "value": "Colder."},
        ],
    }
    assert convert_sharegpt(row) == Converted(
        messages=[
            system("You can call tools."),
            user("Weather in Oslo?"),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "content": '{"temp_c": 3}', "tool_call_id": "call_0"},
            assistant("It is 3 °C in Oslo."),
            user("And tomorrow?"),
        ],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        source_id="fc1",
    )


def test_a_tool_exchange_after_the_last_user_turn_is_kept_for_tool_replay() -> None:
    """The usual tool conversation is one question; dropped with the old answers, tool_replay had no
    recorded call to follow. A tail without calls is still dropped (the old answers)."""
    messages = convert_sharegpt({"conversations": OSLO_CALL}).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    plain = {"messages": [user("q"), assistant("old answer"), assistant("more")]}
    assert convert_messages(plain).messages == [user("q")]


def test_sharegpt_unparsable_function_call_stays_as_assistant_text() -> None:
    row = {
        "conversations": [
            {"from": "human", "value": "Call it"},
            {"from": "function_call", "value": "get_weather(city='Oslo')"},
            {"from": "function", "value": "3"},
            {"from": "human", "value": "ok?"},
        ]
    }
    assert convert_sharegpt(row).messages == [
        user("Call it"),
        assistant("get_weather(city='Oslo')"),
        {"role": "tool", "content": "3"},
        user("ok?"),
    ]


def test_sharegpt_system_column_does_not_override_a_system_turn() -> None:
    row = {
        "system": "column",
        "conversations": [{"from": "system", "value": "turn"}, {"from": "human", "value": "q"}],
    }
    assert convert_sharegpt(row).messages == [system("turn"), user("q")]


# --- messages / UltraChat ----------------------------------------------------------------------


def test_ultrachat_fixture_rows_convert_exactly() -> None:
    expected = {
        "71c49bf5": [user("How do tides work, and why are there usually two high tides a day?")],
        "aba7c4dd": [
            user("Write a short product description for a reusable bamboo water bottle."),
            assistant(
                "Meet the Grove bottle: a light, leak-proof bamboo shell around a double-walled steel core "
                "that keeps drinks cold for 24 hours."
            ),
            user("Can you make it sound more playful?"),
        ],
        "63a6d4b4": [
            user(
                "Quels sont les avantages du vélo électrique pour les trajets domicile-travail ? "
                "Réponds en français, s'il te plaît."
            )
        ],
        "4151765a": [
            user("Give me three tips for learning to touch type."),
            assistant(
                "1. Keep your fingers on the home row.\n2. Practice slowly and accurately before speeding up."
                "\n3. Do short daily sessions instead of long weekly ones."
            ),
            user("Which free tools would you recommend?"),
            assistant(
                "Look for a typing tutor with lessons that adapt to your mistakes and track accuracy, and "
                "pair it with plain-text practice of things you actually write."
            ),
            user("Thanks!"),
        ],
        "5143999c": [user("What's 17 × 23? Show the steps.")],
    }
    for prompt_id, row in ULTRACHAT.items():
        converted = convert_messages(row)
        assert converted.source_id == prompt_id
        assert converted.tools is None
        if prompt_id[:8] in expected:
            assert converted.messages == expected[prompt_id[:8]]
        else:  # the very long meeting-notes prompt
            assert converted.messages == [user(row["prompt"])]
            assert len(row["prompt"]) == 18996


def test_original_ultrachat_data_lists_convert_as_alternating_turns() -> None:
    """stingning/ultrachat (the 1.5M original) has ``{"id", "data": [user, assistant, user, ...]}``:
    plain strings, the user first. Read as ``messages`` every row was a reject ("no messages list"),
    and no ``columns`` mapping could help, so the set could not be used at all."""
    data = ["How do tides work?", "The Moon pulls the oceans.", "And the Sun?", "Less so."]
    row = {"id": "7", "data": data}
    converted = convert_messages(row)
    assert converted.source_id == "7"
    assert converted.messages == [
        user("How do tides work?"),
        assistant("The Moon pulls the oceans."),
        user("And the Sun?"),
    ]
    # the same conversation in the 200k layout is the same prompt (same content, same dedup)
    roles = ["user", "assistant", "user"]
    as_messages = {"messages": [{"role": r, "content": t} for r, t in zip(roles, data[:3], strict=True)]}
    assert convert_messages(as_messages).messages == converted.messages


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (["fine", 3], "data item 2 is a int, not a string"),
        ("one string", "no messages list"),
        ([], "no user turn"),
    ],
)
def test_ultrachat_data_lists_that_cannot_be_read_are_rejects_with_a_reason(data: Any, reason: str) -> None:
    with pytest.raises(ConversionError, match=reason):
        convert_messages({"id": "1", "data": data})


def test_messages_content_parts_tool_calls_and_tools_column() -> None:
    row = {
        "id": 42,
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Add 2"}, {"type": "text", "text": "and 3"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                    {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"a": 0}'}},
                ],
                "weight": 1,
            },
            {"role": "tool", "content": "5", "tool_call_id": "call_0", "name": "add"},
            {"role": "tool", "content": "0", "tool_call_id": "c9", "name": "add"},
            {"role": "user", "content": "So?"},
            {"role": "assistant", "content": "5."},
        ],
    }
    assert convert_messages(row) == Converted(
        messages=[
            system("Use tools."),
            user("Add 2\nand 3"),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    },
                    {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"a": 0}'}},
                ],
            },
            {"role": "tool", "content": "5", "tool_call_id": "call_0", "name": "add"},
            {"role": "tool", "content": "0", "tool_call_id": "c9", "name": "add"},
            user("So?"),
        ],
        tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}],
        source_id="42",
    )


def test_messages_prompt_id_wins_over_id_and_blank_ids_are_ignored() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert convert_messages({"prompt_id": "p", "id": "i", "messages": msgs}).source_id == "p"
    assert convert_messages({"prompt_id": " ", "id": "i", "messages": msgs}).source_id == "i"
    assert convert_messages({"id": "", "messages": msgs}).source_id is None


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "only a prompt"}, "no messages list"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown role: narrator"),
        ({"messages": ["hi"]}, "message is not an object"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "non-text content part: image_url",
        ),
        ({"messages": [{"role": "user", "content": 7}]}, "unsupported content type: int"),
        ({"messages": [{"role": "assistant", "content": "Hi there"}]}, "no user turn"),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]},
                ]
            },
            "tool call arguments are not valid JSON",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
            "tool call without a function name",
        ),
        (
            {"tools": "[not json", "messages": [{"role": "user", "content": "q"}]},
            "tools column is not valid JSON",
        ),
        (
            {"tools": '{"a": 1}', "messages": [{"role": "user", "content": "q"}]},
            "tools column is not a list of objects",
        ),
    ],
)
def test_messages_unusable_rows_are_rejected_with_a_stable_reason(row: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConversionError) as excinfo:
        convert_messages(row)
    assert excinfo.value.reason == reason


def test_parse_tools_treats_empty_as_none() -> None:
    assert parse_tools(None) is None
    assert parse_tools("") is None
    assert parse_tools("[]") is None
    assert parse_tools([]) is None


def test_messages_assistant_tool_call_turns_and_tool_results_never_merge() -> None:
    call = {"function": {"name": "f", "arguments": "{}"}}
    row = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "a", "tool_call_id": "call_0"},
            {"role": "tool", "content": "", "tool_call_id": "call_1"},
            {"role": "user", "content": "r"},
        ]
    }
    messages = convert_messages(row).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "tool", "tool", "user"]
    assert [m["tool_calls"][0]["id"] for m in messages[1:3]] == ["call_0", "call_1"]


# --- magpie ------------------------------------------------------------------------------------


def test_magpie_instruction_and_conversations() -> None:
    row = {"uuid": "u-1", "instruction": "Name a prime.", "response": "7"}
    assert convert_magpie(row) == Converted(messages=[user("Name a prime.")], tools=None, source_id="u-1")
    multi = {
        "conversations": [
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "7"},
            {"from": "human", "value": "Another?"},
            {"from": "gpt", "value": "11"},
        ]
    }
    assert convert_magpie(multi) == Converted(
        messages=[user("Name a prime."), assistant("7"), user("Another?")], tools=None, source_id=None
    )
    with pytest.raises(ConversionError, match="no user turn"):
        convert_magpie({"instruction": "  ", "response": "7"})


# --- registry and to_record --------------------------------------------------------------------


def test_registry_knows_the_chat_formats_and_names_them_on_a_typo() -> None:
    assert {"messages", "sharegpt", "magpie"} <= set(known_formats())
    assert get_converter("sharegpt") is convert_sharegpt
    with pytest.raises(KeyError) as excinfo:
        get_converter("sharegtp")
    assert "unknown prompt format 'sharegtp'" in str(excinfo.value)
    assert "magpie, messages" in str(excinfo.value)


def test_register_refuses_a_second_converter_under_a_taken_name() -> None:
    with pytest.raises(ValueError, match="'messages' is already registered"):
        register("messages")(lambda row: Converted(messages=[], tools=None, source_id=None))


def test_to_record_builds_the_canonical_record() -> None:
    record = to_record(
        SHAREGPT["Rk93Pzz_4"],
        index=1,
        category="A1_sharegpt",
        dataset="sharegpt",
        split="train",
        fmt="sharegpt",
        overrides={"max_tokens": 512},
    )
    assert record == PromptRecord(
        id="Rk93Pzz_4",
        category="A1_sharegpt",
        source=SourceRef(dataset="sharegpt", split="train", row=1),
        messages=convert_sharegpt(SHAREGPT["Rk93Pzz_4"]).messages,
        tools=None,
        overrides={"max_tokens": 512},
    )


def test_to_record_turns_a_reader_marker_into_a_reject() -> None:
    with pytest.raises(ConversionError) as excinfo:
        to_record(
            {INVALID_KEY: "x.jsonl line 17: Expecting value"},
            index=3,
            category="c",
            dataset="x",
            split="train",
            fmt="sharegpt",
        )
    assert excinfo.value.reason == "invalid input: x.jsonl line 17: Expecting value"


def _ids(rows: list[dict[str, Any]], fmt: str) -> dict[str, str]:
    """Record id per row content, with rows placed at the given positions."""
    out = {}
    for index, row in enumerate(rows):
        record = to_record(row, index=index, category="c", dataset="d", split="train", fmt=fmt)
        out[json.dumps(row, sort_keys=True)] = record.id
    return out


def test_ids_are_stable_across_reordering_and_filtering() -> None:
    rows = [{k: v for k, v in row.items() if k != "id"} for row in SHAREGPT.values()]  # no source ids
    rows += list(SHAREGPT.values())  # with source ids
    forward = _ids(rows, "sharegpt")
    backward = _ids(list(reversed(rows)), "sharegpt")
    filtered = _ids(rows[::3], "sharegpt")
    assert forward == backward
    assert all(forward[key] == value for key, value in filtered.items())
    assert len(set(forward.values())) == len(rows)


def test_id_is_the_content_hash_when_the_row_has_none() -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "old answer"}]}
    record = to_record(row, index=0, category="c", dataset="d", split="train", fmt="sharegpt")
    assert record.id == content_hash([user("hi")])
    assert record.id.startswith("h") and len(record.id) == 25
    # the same prompt in another layout (old answers differ) hashes the same
    same = to_record(
        {"messages": [user("hi")]}, index=9, category="c", dataset="e", split="x", fmt="messages"
    )
    assert same.id == record.id
