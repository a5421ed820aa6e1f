"""Converter for glaive-function-calling-v2 rows (``system`` and ``chat`` text columns).

Glaive packs a whole tool-calling conversation into two strings: the function definitions are
JSON objects pasted after a boilerplate sentence in ``system``, and ``chat`` is a transcript with
``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` markers where calls are written as
``<functioncall> {"name": ..., "arguments": '<JSON object in single quotes>'}``. Templates and the
server want OpenAI ``tools``, ``tool_calls`` and ``tool`` messages instead, so this module rebuilds
them; the JSON is located by brace matching (``prompts.braces``), never by regexes or quote
rewriting, which would corrupt apostrophes inside arguments.

The FULL conversation is returned (system, user, assistant tool calls, tool results, answers):
which part to send for regeneration is the caller's decision, not the format's. Glaive rows have
no id, so ``source_id`` is None and the record id is the content hash.

Rows that cannot be faithfully rebuilt are rejected with a ``ConversionError`` naming the problem:
malformed function JSON, an unparsable call, a call to a function that is not defined, a function
response with no call to answer, or a conversation without a user turn. Reasons never quote row
content (function names, values), so the rejects table groups them into a handful of kinds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

from prompts.braces import ScanError, extract_objects, loads_object, parse_lenient_object, skip_whitespace
from prompts.convert_chat import tool_call
from prompts.errors import ConversionError
from prompts.formats import Converted, register
from prompts.records import Message, ToolSchema

FUNCTIONS_PREAMBLE = (
    "You are a helpful assistant with access to the following functions. Use them if required -"
)
NO_FUNCTIONS_PREAMBLE = "You are a helpful assistant, with no access to external functions."
_SYSTEM_PREFIX = "SYSTEM:"
_END_OF_TEXT = "<|endoftext|>"
_CALL_MARKER = "<functioncall>"
_FUNCTION_RESPONSE = "FUNCTION RESPONSE"
# Splitting a transcript on speaker markers is line-oriented text, not JSON: a regex is the right tool.
_TURN_MARKER = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):", re.MULTILINE)
_ROLES = {"USER": "user", "ASSISTANT": "assistant"}


def _text_column(row: Mapping[str, Any], key: str, *, required: bool) -> str:
    value = row.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ConversionError(f"missing {key!r} column" if value is None else f"{key!r} is not a string")
    return value


# --- system text -> system prompt + tools --------------------------------------------------------


def _tool_schema(function: dict[str, Any], number: int) -> ToolSchema:
    """One glaive function definition as an OpenAI tool; empty parameters become an empty object schema."""
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConversionError(f"function definition {number} has no name")
    description = function.get("description", "")
    parameters = function.get("parameters")
    if parameters is None or parameters == {}:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise ConversionError(f"function definition {number} has a malformed description or parameters")
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def parse_system(system: str) -> tuple[str, list[ToolSchema] | None]:
    """Split glaive's system text into the remaining system prompt ("" if none) and the tools.

    The boilerplate sentences are glaive's scaffolding, not an instruction worth regenerating with,
    so they are dropped; anything written around them is kept.
    """
    text = system.strip().removeprefix(_SYSTEM_PREFIX)
    before, found, after = text.partition(FUNCTIONS_PREAMBLE)
    tools: list[ToolSchema] = []
    if found:
        try:
            functions, stop = extract_objects(after)
        except ScanError as exc:
            raise ConversionError(f"malformed function JSON: {exc}") from None
        tools = [_tool_schema(function, number) for number, function in enumerate(functions, 1)]
        rest = after[stop:]
    else:
        before, _, rest = text.partition(NO_FUNCTIONS_PREAMBLE)
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) < len(names):
        raise ConversionError("duplicate function name")
    # Text with no letter or digit (a stray "," or "]" from an unusual paste) is no instruction.
    parts = (part.strip() for part in (before, rest))
    remaining = "\n\n".join(part for part in parts if any(char.isalnum() for char in part))
    return remaining, tools or None


# --- chat transcript -> messages -----------------------------------------------------------------


def _turn_text(text: str) -> str:
    """A turn's text, trimmed, without the ``<|endoftext|>`` that ends it.

    Only the marker at the end goes: the same characters inside a turn are someone's words (a
    question about that very token), and removing them everywhere changed the question silently.
    """
    text = text.strip()
    while text.endswith(_END_OF_TEXT):
        text = text.removesuffix(_END_OF_TEXT).rstrip()
    return text


def split_turns(chat: str) -> list[tuple[str, str]]:
    """``(speaker, text)`` pairs in order; each text trimmed, its closing ``<|endoftext|>`` removed."""
    parts = _TURN_MARKER.split(chat)
    if _turn_text(parts[0]):
        raise ConversionError("chat text before the first turn marker")
    return [(parts[i], _turn_text(parts[i + 1])) for i in range(1, len(parts), 2)]


def _parse_calls(text: str) -> list[dict[str, Any]]:
    """The ``<functioncall> {...}`` objects that make up ``text`` (one or more, nothing else)."""
    calls: list[dict[str, Any]] = []
    pos = 0
    while pos < len(text):
        if not text.startswith(_CALL_MARKER, pos):
            raise ConversionError("unparsable function call: text after the call")
        try:
            call, pos = parse_lenient_object(text, skip_whitespace(text, pos + len(_CALL_MARKER)))
        except ScanError as exc:
            raise ConversionError(f"unparsable function call: {exc}") from None
        calls.append(call)
        pos = skip_whitespace(text, pos)
        if text.startswith(_END_OF_TEXT, pos):  # a call ended like a turn, before the next call
            pos = skip_whitespace(text, pos + len(_END_OF_TEXT))
    return calls


def _call_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as an object: single-quoted (already parsed), a JSON string, or absent."""
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads_object(arguments)
        except ScanError as exc:
            raise ConversionError(f"unparsable function call arguments: {exc}") from None
    if not isinstance(arguments, dict):
        raise ConversionError("function call arguments are not an object")
    return arguments


class _Transcript:
    """Builds messages turn by turn, numbering calls and pairing each response with its call."""

    def __init__(self, tool_names: list[str], call_prefix: str) -> None:
        self.tool_names = tool_names
        self.call_prefix = call_prefix
        self.messages: list[Message] = []
        self.calls_made = 0
        self.unanswered: deque[tuple[str, str]] = deque()

    def add(self, speaker: str, text: str) -> None:
        if speaker == _FUNCTION_RESPONSE:
            if not self.unanswered:
                raise ConversionError("FUNCTION RESPONSE without a preceding function call")
            call_id, name = self.unanswered.popleft()
            self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": text})
            return
        # A response answers only the calls of the turn right before it, never an older one.
        self.unanswered.clear()
        if not text:
            return
        content, marker, calls = text.partition(_CALL_MARKER)
        if speaker == "USER" or not marker:
            self.messages.append({"role": _ROLES[speaker], "content": text})
            return
        self.messages.append(
            {
                "role": "assistant",
                "content": content.strip() or None,
                "tool_calls": [self._tool_call(call) for call in _parse_calls(marker + calls)],
            }
        )

    def _tool_call(self, call: dict[str, Any]) -> dict[str, Any]:
        name = call.get("name")
        if not isinstance(name, str) or name not in self.tool_names:
            raise ConversionError("call to a function not in the tools")
        call_id = f"{self.call_prefix}_{self.calls_made}"
        self.calls_made += 1
        self.unanswered.append((call_id, name))
        return tool_call(name, _call_arguments(call), call_id)


def _call_prefix(system: str, chat: str) -> str:
    """``call_<row hash>``: call ids must be stable across runs because they are part of the content id."""
    digest = hashlib.sha256(json.dumps([system, chat]).encode("utf-8")).hexdigest()
    return f"call_{digest[:12]}"


@register("glaive")
def convert_glaive(row: Mapping[str, Any]) -> Converted:
    """A glaive-function-calling-v2 row as the full OpenAI conversation plus its tools."""
    system = _text_column(row, "system", required=False)
    chat = _text_column(row, "chat", required=True)
    system_text, tools = parse_system(system)
    transcript = _Transcript([tool["function"]["name"] for tool in tools or ()], _call_prefix(system, chat))
    for speaker, text in split_turns(chat):
        transcript.add(speaker, text)
    if not any(message["role"] == "user" for message in transcript.messages):
        raise ConversionError("no USER turn")
    preamble: list[Message] = [{"role": "system", "content": system_text}] if system_text else []
    return Converted(messages=preamble + transcript.messages, tools=tools, source_id=None)
