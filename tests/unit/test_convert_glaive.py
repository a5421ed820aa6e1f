"""glaive-function-calling-v2 converter and the brace-matching JSON scanner it relies on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from prompts.braces import ScanError, extract_objects, object_end, parse_lenient_object
from prompts.convert_glaive import convert_glaive
from prompts.errors import ConversionError
from prompts.formats import get_converter, to_record
from prompts.records import content_hash

FIXTURES = Path(__file__).parent.parent / "fixtures" / "prompts"
ROWS: list[dict[str, Any]] = [
    json.loads(line) for line in (FIXTURES / "glaive.jsonl").read_text(encoding="utf-8").splitlines()
]
PREAMBLE = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
)
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(content: str | None, *specs: tuple[str, str, str]) -> dict[str, Any]:
    """An assistant tool-call message from ``(id, name, arguments JSON)`` triples."""
    tool_calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in specs
    ]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}


def tool(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def row(system: str, chat: str) -> dict[str, Any]:
    return {"system": system, "chat": chat}


def call_id(r: dict[str, Any], n: int) -> str:
    """The documented id contract: ``call_`` + 12 hex of sha256(JSON [system, chat]) + ``_<n>``."""
    digest = hashlib.sha256(json.dumps([r["system"], r["chat"]]).encode("utf-8")).hexdigest()
    return f"call_{digest[:12]}_{n}"


def reject(r: dict[str, Any]) -> str:
    with pytest.raises(ConversionError) as info:
        convert_glaive(r)
    return info.value.reason


LOCAL_TIME = function(
    "get_local_time",
    "Get the current local time in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
)
ECHO_DEF = '{"name": "echo", "description": "Echo text", "parameters": {"type": "object", "properties": {}}}'
ECHO = function("echo", "Echo text", EMPTY_SCHEMA)


# --- the six fixture rows ------------------------------------------------------------------------


def test_fixture_single_call_keeps_apostrophes_and_pairs_the_response() -> None:
    converted = convert_glaive(ROWS[0])
    cid = "call_224a2db82ac7_0"
    assert converted.messages == [
        user("Can you remind me about Maya's recital on 2024-06-14 at 18:30?"),
        calls(
            None,
            (
                cid,
                "add_calendar_reminder",
                '{"title": "Maya\'s recital", "date": "2024-06-14", "time": "18:30"}',
            ),
        ),
        tool(cid, "add_calendar_reminder", '{"status": "ok", "reminder_id": 7731}'),
        assistant("Done! I've added \"Maya's recital\" to your calendar for June 14, 2024 at 18:30."),
    ]
    assert converted.tools == [
        function(
            "add_calendar_reminder",
            "Add a reminder to the user's calendar",
            {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "description": "Short title of the reminder"},
                    "date": {"type": "string", "format": "date", "description": "Date in YYYY-MM-DD"},
                    "time": {"type": "string", "description": "Time in HH:MM (24h)"},
                },
                "required": ["title", "date"],
            },
        )
    ]
    assert converted.source_id is None


def test_fixture_without_functions_has_no_tools_and_no_system_message() -> None:
    converted = convert_glaive(ROWS[1])
    assert converted.messages == [
        user("What is the difference between a list and a tuple in Python?"),
        assistant(
            "A list is mutable, so you can add, remove or change items after creating it. A tuple is "
            "immutable: once created, its contents cannot change. Tuples are hashable when their items "
            "are, so they can be dictionary keys."
        ),
        user("So which one should I use for coordinates?"),
        assistant(
            "A tuple is usually the better fit for a fixed pair like (x, y), because the coordinate "
            "should not change by accident and it can be used as a key."
        ),
    ]
    assert converted.tools is None
    assert converted.source_id is None


def test_fixture_two_functions_two_calls_with_responses() -> None:
    converted = convert_glaive(ROWS[2])
    first, second = "call_291d9d11f80b_0", "call_291d9d11f80b_1"
    assert converted.messages == [
        user("I'm flying to Tokyo next week. How much is 250 dollars in yen?"),
        calls(
            None, (first, "convert_currency", '{"amount": 250, "from_currency": "USD", "to_currency": "JPY"}')
        ),
        tool(first, "convert_currency", '{"converted_amount": 37612.5, "rate": 150.45}'),
        assistant("250 USD is about 37,612 JPY at a rate of 150.45 yen per dollar."),
        user("Thanks. And what time is it there right now?"),
        calls(None, (second, "get_local_time", '{"city": "Tokyo"}')),
        tool(second, "get_local_time", '{"city": "Tokyo", "local_time": "2024-03-02T07:15:00+09:00"}'),
        assistant("It is currently 7:15 in the morning in Tokyo (Saturday, March 2)."),
    ]
    assert converted.tools == [
        function(
            "convert_currency",
            "Convert an amount from one currency to another",
            {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "Amount to convert"},
                    "from_currency": {"type": "string", "description": "ISO code of the source currency"},
                    "to_currency": {"type": "string", "description": "ISO code of the target currency"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        ),
        LOCAL_TIME,
    ]


def test_fixture_functions_offered_but_not_called() -> None:
    converted = convert_glaive(ROWS[3])
    assert converted.messages == [
        user("Can you book me a table for two at an Italian restaurant tonight?"),
        assistant(
            "I'm sorry, but I can't make restaurant reservations. I can only look up the current local "
            "time in a city. Is there a city whose time you'd like to know?"
        ),
    ]
    assert converted.tools == [LOCAL_TIME]


def test_fixture_unicode_empty_parameters_and_empty_arguments() -> None:
    converted = convert_glaive(ROWS[4])
    first, second = "call_6cc3e1cf263e_0", "call_6cc3e1cf263e_1"
    assert converted.messages == [
        user("「おはようございます、カフェはどこですか？」をフランス語に翻訳してください 🙏"),
        calls(
            None,
            (
                first,
                "translate_text",
                '{"text": "おはようございます、カフェはどこですか？", "target_language": "French"}',
            ),
        ),
        tool(first, "translate_text", '{"translated_text": "Bonjour, où est le café ?"}'),
        assistant("フランス語では「Bonjour, où est le café ?」です。☕"),
        user("Give me something motivating too."),
        calls(None, (second, "get_random_quote", "{}")),
        tool(second, "get_random_quote", '{"quote": "Small steps every day add up.", "author": "Unknown"}'),
        assistant('Here\'s one: "Small steps every day add up."'),
    ]
    assert converted.tools == [
        function(
            "translate_text",
            "Translate text into a target language",
            {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "Text to translate"},
                    "target_language": {"type": "string", "description": "Target language name or code"},
                },
                "required": ["text", "target_language"],
            },
        ),
        function("get_random_quote", "Return a random inspirational quote", EMPTY_SCHEMA),
    ]


def test_fixture_malformed_function_json_is_rejected_with_the_json_error() -> None:
    assert (
        reject(ROWS[5])
        == "malformed function JSON: object 1: Expecting property name enclosed in double quotes"
    )


def test_fixture_call_ids_are_the_documented_row_hash() -> None:
    assert call_id(ROWS[0], 0) == "call_224a2db82ac7_0"
    assert call_id(ROWS[2], 1) == "call_291d9d11f80b_1"


# --- system text ---------------------------------------------------------------------------------


def test_other_system_text_around_the_functions_is_kept() -> None:
    system = (
        "SYSTEM: You are Captain Byte.\n"
        "You are a helpful assistant with access to the following functions. Use them if required -\n"
        f"{ECHO_DEF}\n\nAlways answer in French.\n"
    )
    converted = convert_glaive(row(system, "USER: hi\nASSISTANT: salut"))
    assert converted.messages == [
        {"role": "system", "content": "You are Captain Byte.\n\nAlways answer in French."},
        user("hi"),
        assistant("salut"),
    ]
    assert converted.tools == [ECHO]


def test_no_functions_boilerplate_is_dropped_and_the_rest_kept() -> None:
    system = "SYSTEM: You are a helpful assistant, with no access to external functions. Keep it short."
    converted = convert_glaive(row(system, "USER: hi"))
    assert converted.messages == [{"role": "system", "content": "Keep it short."}, user("hi")]
    assert converted.tools is None


def test_custom_system_prompt_without_boilerplate_is_kept_whole() -> None:
    converted = convert_glaive(row('SYSTEM: Reply in JSON like {"a": 1}.', "USER: hi"))
    assert converted.messages == [{"role": "system", "content": 'Reply in JSON like {"a": 1}.'}, user("hi")]
    assert converted.tools is None


@pytest.mark.parametrize("system", [None, "", "  \n"])
def test_missing_or_blank_system_gives_no_system_message(system: str | None) -> None:
    converted = convert_glaive({"system": system, "chat": "USER: hi"})
    assert converted.messages == [user("hi")]
    assert converted.tools is None


def test_boilerplate_with_no_function_objects_gives_no_tools() -> None:
    converted = convert_glaive(row(PREAMBLE, "USER: hi"))
    assert converted.messages == [user("hi")]
    assert converted.tools is None


def test_nested_braces_and_escaped_quotes_in_back_to_back_definitions() -> None:
    tricky = (
        '{"name": "render", "description": "Fill {placeholders} like {\\"a\\": \\"}\\"} and \\\\", '
        '"parameters": {"type": "object", "properties": {"tpl": {"type": "string", "default": "{{x}}"}}}}'
        '{"name": "echo", "description": "Echo text"}'
    )
    converted = convert_glaive(row(PREAMBLE + tricky, "USER: hi"))
    assert converted.tools == [
        function(
            "render",
            'Fill {placeholders} like {"a": "}"} and \\',
            {"type": "object", "properties": {"tpl": {"type": "string", "default": "{{x}}"}}},
        ),
        function("echo", "Echo text", EMPTY_SCHEMA),
    ]


@pytest.mark.parametrize(
    ("definition", "description"),
    [
        ('{"name": "ping", "description": "Ping", "parameters": {}}', "Ping"),
        ('{"name": "ping", "description": "Ping", "parameters": null}', "Ping"),
        ('{"name": "ping"}', ""),
    ],
)
def test_empty_or_missing_parameters_become_an_empty_object_schema(definition: str, description: str) -> None:
    tools = convert_glaive(row(PREAMBLE + definition, "USER: hi")).tools
    assert tools == [function("ping", description, EMPTY_SCHEMA)]


@pytest.mark.parametrize(
    ("definitions", "reason"),
    [
        (
            '{"name": "a", "parameters": {"type": "object"',
            "malformed function JSON: object 1: unbalanced braces",
        ),
        (
            ECHO_DEF + ' {"name": "b",}',
            "malformed function JSON: object 2: Expecting property name enclosed in double quotes",
        ),
        ('{"description": "no name"}', "function definition 1 has no name"),
        (
            '{"name": "a", "parameters": []}',
            "function definition 1 has a malformed description or parameters",
        ),
        (
            '{"name": "a", "description": 5}',
            "function definition 1 has a malformed description or parameters",
        ),
        (ECHO_DEF + ECHO_DEF, "duplicate function name"),
    ],
)
def test_bad_function_definitions_are_rejected(definitions: str, reason: str) -> None:
    assert reject(row(PREAMBLE + definitions, "USER: hi")) == reason


# Three definitions pasted the ways glaive-function-calling-v2 pastes them. Indented multi-line JSON
# as in the dataset, so separators sit next to newlines like the real rows.
_TRIO = [
    function("echo", "Echo text", EMPTY_SCHEMA),
    LOCAL_TIME,
    function(
        "convert_currency",
        "Convert an amount between currencies",
        {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
    ),
]
_TRIO_DEFS = [json.dumps(tool["function"], indent=4) for tool in _TRIO]
_GLAIVE_LAYOUTS = {
    "blank-line separated": "\n\n".join(_TRIO_DEFS) + "\n\n",
    "comma separated": ",\n".join(_TRIO_DEFS),
    "comma and blank line": ",\n\n".join(_TRIO_DEFS),
    "trailing comma and blank lines": ",\n".join(_TRIO_DEFS) + ",\n\n\n",
    "list in brackets": "[\n" + ",\n".join(_TRIO_DEFS) + "\n]\n",
    "list in brackets, trailing comma": "[" + ",".join(_TRIO_DEFS) + ",]",
}
_CALL_THE_THIRD = (
    "USER: How much is 100 dollars?\n"
    'ASSISTANT: <functioncall> {"name": "convert_currency", "arguments": \'{"amount": 100}\'}\n'
    "FUNCTION RESPONSE: 92 euros\n"
    "ASSISTANT: About 92 euros."
)


@pytest.mark.parametrize("layout", sorted(_GLAIVE_LAYOUTS))
def test_every_definition_layout_gives_every_function_and_no_stray_text(layout: str) -> None:
    r = row(PREAMBLE + _GLAIVE_LAYOUTS[layout], _CALL_THE_THIRD)
    converted = convert_glaive(r)
    assert converted.tools == _TRIO
    cid = call_id(r, 0)
    assert converted.messages == [
        user("How much is 100 dollars?"),
        calls(None, (cid, "convert_currency", '{"amount": 100}')),
        tool(cid, "convert_currency", "92 euros"),
        assistant("About 92 euros."),
    ]


@pytest.mark.parametrize("layout", sorted(_GLAIVE_LAYOUTS))
def test_prose_after_any_definition_layout_stays_the_system_prompt(layout: str) -> None:
    system = PREAMBLE + _GLAIVE_LAYOUTS[layout] + "\nAlways answer in French."
    converted = convert_glaive(row(system, "USER: hi\nASSISTANT: salut"))
    assert converted.tools == _TRIO
    assert converted.messages[0] == {"role": "system", "content": "Always answer in French."}


def test_a_bracket_of_prose_is_not_taken_for_a_list() -> None:
    converted = convert_glaive(row(PREAMBLE + ECHO_DEF + "\n[Note] Be brief.", "USER: hi"))
    assert converted.tools == [ECHO]
    assert converted.messages[0] == {"role": "system", "content": "[Note] Be brief."}


def test_an_unclosed_list_of_definitions_is_rejected() -> None:
    reason = reject(row(PREAMBLE + "[" + ECHO_DEF + ", Be brief.", "USER: hi"))
    assert reason == "malformed function JSON: list of objects without its closing ']'"


# --- chat transcript -----------------------------------------------------------------------------


def test_markers_split_only_at_line_starts_and_endoftext_is_removed() -> None:
    chat = "USER: What does ASSISTANT: mean here?<|endoftext|>\n\n\nASSISTANT:   A label. <|endoftext|>\n\n\n"
    assert convert_glaive(row("", chat)).messages == [
        user("What does ASSISTANT: mean here?"),
        assistant("A label."),
    ]


def test_endoftext_is_removed_only_where_it_ends_a_turn() -> None:
    """Glaive ends turns with ``<|endoftext|>``; the same text inside a question (a user asking about
    the token) is the user's words, and removing it there changed the question silently."""
    chat = (
        "USER: Why does my tokenizer print <|endoftext|> after every sample?\n\n\n"
        "ASSISTANT: It marks the end of a document: <|endoftext|> is GPT-2's separator. <|endoftext|>\n\n\n"
    )
    assert convert_glaive(row("", chat)).messages == [
        user("Why does my tokenizer print <|endoftext|> after every sample?"),
        assistant("It marks the end of a document: <|endoftext|> is GPT-2's separator."),
    ]


def test_endoftext_between_two_calls_of_one_turn_ends_the_first_call() -> None:
    chat = (
        "USER: hi\n"
        'ASSISTANT: <functioncall> {"name": "echo", "arguments": \'{"text": "a"}\'} <|endoftext|>\n'
        '<functioncall> {"name": "echo", "arguments": \'{"text": "b"}\'} <|endoftext|>\n'
    )
    r = row(PREAMBLE + ECHO_DEF, chat)
    assert convert_glaive(r).messages == [
        user("hi"),
        calls(None, (call_id(r, 0), "echo", '{"text": "a"}'), (call_id(r, 1), "echo", '{"text": "b"}')),
    ]


def test_empty_turns_are_dropped() -> None:
    chat = "USER: hi\nASSISTANT: <|endoftext|>\nUSER: still there?\nASSISTANT:"
    assert convert_glaive(row("", chat)).messages == [user("hi"), user("still there?")]


def test_apostrophes_braces_and_escaped_quotes_inside_single_quoted_arguments() -> None:
    chat = (
        "USER: say it\n"
        "ASSISTANT: <functioncall> "
        '{"name": "echo", "arguments": \'{"text": "it\'s {not} a \\"}\\" problem", "n": {"k": [1, 2]}}\'}'
        " <|endoftext|>\n"
        'FUNCTION RESPONSE: {"echo": "ok"}'
    )
    r = row(PREAMBLE + ECHO_DEF, chat)
    converted = convert_glaive(r)
    cid = call_id(r, 0)
    assert converted.messages == [
        user("say it"),
        calls(None, (cid, "echo", '{"text": "it\'s {not} a \\"}\\" problem", "n": {"k": [1, 2]}}')),
        tool(cid, "echo", '{"echo": "ok"}'),
    ]


def test_text_before_the_call_becomes_the_content() -> None:
    chat = (
        'USER: hi\nASSISTANT: Let me check that for you. <functioncall> {"name": "echo", "arguments": \'{}\'}'
    )
    r = row(PREAMBLE + ECHO_DEF, chat)
    assert convert_glaive(r).messages == [
        user("hi"),
        calls("Let me check that for you.", (call_id(r, 0), "echo", "{}")),
    ]


def test_several_calls_in_one_turn_are_answered_in_order() -> None:
    chat = (
        "USER: both please\n"
        'ASSISTANT: <functioncall> {"name": "echo", "arguments": \'{"text": "a"}\'}\n'
        '<functioncall> {"name": "get_local_time", "arguments": \'{"city": "Oslo"}\'}\n'
        "FUNCTION RESPONSE: a\n"
        "FUNCTION RESPONSE: 09:00\n"
        "ASSISTANT: Done."
    )
    local_time_def = json.dumps(LOCAL_TIME["function"])
    r = row(PREAMBLE + ECHO_DEF + "\n\n" + local_time_def, chat)
    first, second = call_id(r, 0), call_id(r, 1)
    assert convert_glaive(r).messages == [
        user("both please"),
        calls(None, (first, "echo", '{"text": "a"}'), (second, "get_local_time", '{"city": "Oslo"}')),
        tool(first, "echo", "a"),
        tool(second, "get_local_time", "09:00"),
        assistant("Done."),
    ]


@pytest.mark.parametrize(
    "arguments",
    ['\'{"text": "x"}\'', '{"text": "x"}', '"{\\"text\\": \\"x\\"}"', '  \'  {"text": "x"}  \'  '],
)
def test_arguments_as_quoted_object_plain_object_or_json_string(arguments: str) -> None:
    chat = 'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": ' + arguments + "}"
    r = row(PREAMBLE + ECHO_DEF, chat)
    assert convert_glaive(r).messages[1] == calls(None, (call_id(r, 0), "echo", '{"text": "x"}'))


def test_call_without_arguments_gets_an_empty_object() -> None:
    r = row(PREAMBLE + ECHO_DEF, 'USER: hi\nASSISTANT: <functioncall> {"name": "echo"}')
    assert convert_glaive(r).messages[1] == calls(None, (call_id(r, 0), "echo", "{}"))


def test_user_turn_mentioning_functioncall_stays_text() -> None:
    converted = convert_glaive(row("", "USER: what is <functioncall> {x}?"))
    assert converted.messages == [user("what is <functioncall> {x}?")]


def test_call_ids_are_stable_and_differ_between_rows() -> None:
    a = row(PREAMBLE + ECHO_DEF, 'USER: a\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'{}\'}')
    b = row(PREAMBLE + ECHO_DEF, 'USER: b\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'{}\'}')
    assert convert_glaive(a) == convert_glaive(a)
    assert convert_glaive(a).messages[1]["tool_calls"][0]["id"] == call_id(a, 0)
    assert call_id(a, 0) != call_id(b, 0)


ECHO_CALL = 'ASSISTANT: <functioncall> {"name": "echo", "arguments": \'{}\'}\n'


@pytest.mark.parametrize(
    ("system", "chat", "reason"),
    [
        (
            PREAMBLE + ECHO_DEF,
            "USER: hi\nFUNCTION RESPONSE: 42",
            "FUNCTION RESPONSE without a preceding function call",
        ),
        (
            PREAMBLE + ECHO_DEF,
            "USER: hi\n" + ECHO_CALL + "FUNCTION RESPONSE: 1\nFUNCTION RESPONSE: 2",
            "FUNCTION RESPONSE without a preceding function call",
        ),
        (
            PREAMBLE + ECHO_DEF,
            "USER: hi\n" + ECHO_CALL + "USER: and?\nFUNCTION RESPONSE: late",
            "FUNCTION RESPONSE without a preceding function call",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'{"a": 1\'}',
            "unparsable function call: Expecting ',' delimiter",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'{"a": "1}\'}',
            "unparsable function call: unbalanced braces",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name" "echo", "arguments": \'{}\'}',
            "unparsable function call: expected ':'",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo" "arguments": \'{}\'}',
            "unparsable function call: expected ',' or '}'",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'{}\'} and more',
            "unparsable function call: text after the call",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": \'[1]\'}',
            "unparsable function call: expected '{'",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": "[1]"}',
            "unparsable function call arguments: not a JSON object",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": "{oops"}',
            "unparsable function call arguments: Expecting property name enclosed in double quotes",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "echo", "arguments": 3}',
            "function call arguments are not an object",
        ),
        (
            PREAMBLE + ECHO_DEF,
            'USER: hi\nASSISTANT: <functioncall> {"name": "get_weather", "arguments": \'{}\'}',
            "call to a function not in the tools",
        ),
        ("", "USER: hi\n" + ECHO_CALL, "call to a function not in the tools"),
        (
            PREAMBLE + ECHO_DEF,
            "USER: hi\nASSISTANT: <functioncall> {\"arguments\": '{}'}",
            "call to a function not in the tools",
        ),
        ("", "ASSISTANT: Hello! How can I help?", "no USER turn"),
        ("", "USER:   <|endoftext|>\nASSISTANT: anyone?", "no USER turn"),
        ("", "Hello there\nUSER: hi", "chat text before the first turn marker"),
    ],
)
def test_unusable_conversations_are_rejected_with_a_reason(system: str, chat: str, reason: str) -> None:
    assert reject(row(system, chat)) == reason


@pytest.mark.parametrize(
    ("r", "reason"),
    [
        ({"system": ""}, "missing 'chat' column"),
        ({"chat": 5}, "'chat' is not a string"),
        ({"system": 1, "chat": "USER: x"}, "'system' is not a string"),
    ],
)
def test_bad_columns_are_rejected(r: dict[str, Any], reason: str) -> None:
    assert reject(r) == reason


# --- registry ------------------------------------------------------------------------------------


def test_registered_as_glaive_and_ids_are_content_hashes() -> None:
    assert get_converter("glaive") is convert_glaive
    record = to_record(ROWS[0], index=0, category="B1_glaive", dataset="glaive", split="train", fmt="glaive")
    converted = convert_glaive(ROWS[0])
    assert record.id == content_hash(converted.messages, converted.tools)
    assert record.messages == converted.messages
    assert record.tools == converted.tools


# --- the scanner on its own ----------------------------------------------------------------------


def test_object_end_skips_braces_and_escaped_quotes_inside_strings() -> None:
    text = 'x {"a": "}{\\"}", "b": {"c": "it\'s"}} tail'
    assert text[2 : object_end(text, 2)] == '{"a": "}{\\"}", "b": {"c": "it\'s"}}'


@pytest.mark.parametrize(("text", "message"), [("x", "expected '{'"), ('{"a": "}', "unbalanced braces")])
def test_object_end_errors(text: str, message: str) -> None:
    with pytest.raises(ScanError, match=f"^{message}$"):
        object_end(text, 0)


def test_extract_objects_stops_at_the_first_non_object() -> None:
    text = ' {"a": 1}\n{"b": {"c": 2}}  trailing {"d": 3}'
    objects, stop = extract_objects(text)
    assert objects == [{"a": 1}, {"b": {"c": 2}}]
    assert text[stop:] == 'trailing {"d": 3}'


def test_extract_objects_consumes_commas_and_brackets_between_objects() -> None:
    text = '[{"a": 1},\n\n {"b": 2},]  rest'
    objects, stop = extract_objects(text)
    assert objects == [{"a": 1}, {"b": 2}]
    assert text[stop:] == "rest"


def test_extract_objects_names_the_bad_object() -> None:
    with pytest.raises(ScanError, match=r"^object 2: Expecting property name enclosed in double quotes$"):
        extract_objects('{"a": 1} {1}')


def test_parse_lenient_object_returns_the_end_index() -> None:
    text = "{ } rest"
    assert parse_lenient_object(text, 0) == ({}, 3)
    text = "{\"n\": 'not json'}"
    with pytest.raises(ScanError, match=r"^expected '{'$"):
        parse_lenient_object(text, 0)
    with pytest.raises(ScanError, match=r"^object key is not a string$"):
        parse_lenient_object("{1: 2}", 0)
    with pytest.raises(ScanError, match=r"^expected ',' or '}'$"):
        parse_lenient_object('{"a": 1', 0)
