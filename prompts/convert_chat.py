"""Converters for the chat layouts: OpenAI ``messages`` (also UltraChat, either layout), ShareGPT, Magpie.

All three end in the same normalisation (``finish_prompt``) so a prompt looks the same whatever
layout it came from, and therefore hashes to the same content id:

- empty turns are dropped (an assistant turn that carries tool calls is never empty);
- consecutive user, assistant or system turns are merged with a blank line, because many chat
  templates insist on alternating roles (tool results and tool-calling turns are never merged:
  each pairs with a specific call);
- turns before the first user turn other than the system prompt are dropped: a conversation that
  opens with the assistant's greeting is common in ShareGPT dumps and the greeting is not part of
  the question (this is normal normalisation, not a reject);
- everything after the last user turn is dropped: those are the old answers the target model is
  about to regenerate. Unless they call tools: ``tool_replay`` replays the recorded results of the
  calls the regenerated answer repeats, and the recorded answers are never sent nor stored
  (``flows.run.regen``). Dropped, a one-question tool conversation (the usual kind) could only
  end at its first call, "tool call diverged: expected no call";
- a conversation with no user turn left is rejected (``ConversionError("no user turn")``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from prompts.errors import ConversionError
from prompts.formats import Converted, register
from prompts.records import Message, ToolSchema

_MESSAGE_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}

_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_SHAREGPT_FUNCTION_CALL = "function_call"

_MERGEABLE = {"system", "user", "assistant"}


# --- content and tool normalisation -------------------------------------------------------------


def text_content(content: Any) -> str:
    """Content as one string: OpenAI text parts are joined by newlines; other part types are rejected.

    A dropped image or audio part would silently change what the question asks, so it is a reject.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                texts.append(str(part.get("text") or ""))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ConversionError(f"non-text content part: {kind}")
        return "\n".join(t for t in texts if t)
    raise ConversionError(f"unsupported content type: {type(content).__name__}")


def json_arguments(arguments: Any) -> str:
    """Tool-call arguments as a JSON string (the contract), re-encoding objects given as objects.

    Strings must already be JSON: templates and parsers downstream ``json.loads`` them.
    """
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError:
            raise ConversionError("tool call arguments are not valid JSON") from None
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def tool_call(name: Any, arguments: Any, call_id: str) -> dict[str, Any]:
    """One OpenAI ``tool_calls`` entry."""
    if not isinstance(name, str) or not name:
        raise ConversionError("tool call without a function name")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json_arguments(arguments)},
    }


def parse_tools(raw: Any) -> list[ToolSchema] | None:
    """A ``tools`` column (JSON string or list) as OpenAI tool schemas; bare function schemas are wrapped."""
    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ConversionError("tools column is not valid JSON") from None
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise ConversionError("tools column is not a list of objects")
    tools = [dict(t) if "function" in t else {"type": "function", "function": dict(t)} for t in raw]
    return tools or None


def _message_tool_calls(raw: Any, first_index: int) -> list[dict[str, Any]]:
    """Normalise an OpenAI message's ``tool_calls``; calls without an id get ``call_<n>``."""
    if not isinstance(raw, list):
        raise ConversionError("tool_calls is not a list")
    calls = []
    for offset, call in enumerate(raw):
        if not isinstance(call, Mapping):
            raise ConversionError("tool call is not an object")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise ConversionError("tool call without a function")
        call_id = str(call.get("id") or f"call_{first_index + offset}")
        calls.append(tool_call(function.get("name"), function.get("arguments"), call_id))
    return calls


# --- the shared turn normalisation ---------------------------------------------------------------


def _is_empty(message: Message) -> bool:
    return message["role"] != "tool" and not message["content"].strip() and not message.get("tool_calls")


def _mergeable(a: Message, b: Message) -> bool:
    return (
        a["role"] == b["role"]
        and a["role"] in _MERGEABLE
        and not a.get("tool_calls")
        and not b.get("tool_calls")
        and a.get("name") == b.get("name")
    )


def finish_prompt(messages: Iterable[Message]) -> list[Message]:
    """Apply the module-level normalisation rules; the result ends with a user turn, or with the
    recorded tool calls (and their results and answers) that followed it."""
    merged: list[Message] = []
    for message in messages:
        if _is_empty(message):
            continue
        if merged and _mergeable(merged[-1], message):
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n\n" + message["content"]}
        else:
            merged.append(message)
    user_positions = [i for i, m in enumerate(merged) if m["role"] == "user"]
    if not user_positions:
        raise ConversionError("no user turn")
    first, last = user_positions[0], user_positions[-1]
    preamble = [m for m in merged[:first] if m["role"] == "system"]
    tail = merged[last + 1 :]
    return preamble + merged[first : last + 1] + (tail if any(m.get("tool_calls") for m in tail) else [])


# --- formats -------------------------------------------------------------------------------------


def _source_id(row: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return None


def _openai_message(raw: Any, call_count: int) -> Message:
    if not isinstance(raw, Mapping):
        raise ConversionError("message is not an object")
    role = _MESSAGE_ROLES.get(str(raw.get("role")))
    if role is None:
        raise ConversionError(f"unknown role: {raw.get('role')}")
    message: Message = {"role": role, "content": text_content(raw.get("content"))}
    if role == "assistant" and raw.get("tool_calls"):
        message["tool_calls"] = _message_tool_calls(raw["tool_calls"], call_count)
    if role == "tool" and raw.get("tool_call_id"):
        message["tool_call_id"] = str(raw["tool_call_id"])
    if isinstance(raw.get("name"), str) and raw["name"]:
        message["name"] = raw["name"]
    return message


_ALTERNATING_ROLES = ("user", "assistant")


def _alternating_turns(data: list[Any]) -> list[Message]:
    """UltraChat's original ``data`` column: plain strings, user and assistant in turn, the user first."""
    messages: list[Message] = []
    for number, text in enumerate(data, 1):
        if not isinstance(text, str):
            raise ConversionError(f"data item {number} is a {type(text).__name__}, not a string")
        messages.append({"role": _ALTERNATING_ROLES[(number - 1) % 2], "content": text})
    return messages


@register("messages")
def convert_messages(row: Mapping[str, Any]) -> Converted:
    """OpenAI ``messages`` rows (UltraChat 200k too: its ``prompt`` column repeats the first user turn),
    or the original UltraChat's ``data`` list of alternating user/assistant strings."""
    raw = row.get("messages")
    if raw is None and isinstance(row.get("data"), list):
        return Converted(
            messages=finish_prompt(_alternating_turns(row["data"])),
            tools=None,
            source_id=_source_id(row, "id"),
        )
    if not isinstance(raw, list):
        raise ConversionError("no messages list")
    messages: list[Message] = []
    call_count = 0
    for item in raw:
        message = _openai_message(item, call_count)
        call_count += len(message.get("tool_calls", ()))
        messages.append(message)
    return Converted(
        messages=finish_prompt(messages),
        tools=parse_tools(row.get("tools")),
        source_id=_source_id(row, "prompt_id", "id"),
    )


def _sharegpt_function_call(value: str, call_id: str) -> Message:
    """A ShareGPT ``function_call`` turn as an assistant tool call, or as plain text if unparsable.

    Unparsable calls stay as the assistant's text rather than rejecting the row: the turn is
    history the model reads, and its text still says what was called.
    """
    try:
        payload = json.loads(value)
        if not isinstance(payload, dict):
            raise ConversionError("function_call is not an object")
        call = tool_call(payload.get("name"), payload.get("arguments"), call_id)
    except ValueError:  # ConversionError is a ValueError too
        return {"role": "assistant", "content": value}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _sharegpt_messages(turns: Any) -> list[Message]:
    if not isinstance(turns, list):
        raise ConversionError("no conversations list")
    messages: list[Message] = []
    pending_calls: list[str] = []
    call_count = 0
    for turn in turns:
        if not isinstance(turn, Mapping):
            raise ConversionError("conversation turn is not an object")
        if "from" not in turn and "role" in turn:
            # The OpenAI turn shape inside a ShareGPT list (SpecForge's processed data, many Hub sets).
            message = _openai_message(turn, call_count)
            new_ids = [c["id"] for c in message.get("tool_calls", ())]
            call_count += len(new_ids)
            pending_calls.extend(new_ids)
            if message["role"] == "tool" and "tool_call_id" not in message and pending_calls:
                message["tool_call_id"] = pending_calls.pop(0)
            elif message["role"] == "tool" and message.get("tool_call_id") in pending_calls:
                pending_calls.remove(message["tool_call_id"])
            messages.append(message)
            continue
        speaker = str(turn.get("from"))
        value = text_content(turn.get("value"))
        if speaker == _SHAREGPT_FUNCTION_CALL:
            message = _sharegpt_function_call(value, f"call_{call_count}")
            new_ids = [c["id"] for c in message.get("tool_calls", ())]
            call_count += len(new_ids)
            pending_calls.extend(new_ids)
        elif speaker in _SHAREGPT_ROLES:
            message = {"role": _SHAREGPT_ROLES[speaker], "content": value}
            if message["role"] == "tool" and pending_calls:
                message["tool_call_id"] = pending_calls.pop(0)
        else:
            raise ConversionError(f"unknown role: {speaker}")
        messages.append(message)
    return messages


@register("sharegpt")
def convert_sharegpt(row: Mapping[str, Any]) -> Converted:
    """ShareGPT rows: ``conversations`` (or ``conversation``) of ``{"from", "value"}`` turns, or of
    OpenAI ``{"role", "content"}`` turns (both shapes occur under the ShareGPT name on the Hub).

    A tool turn answers the oldest unanswered ``function_call`` (its ``tool_call_id``); an optional
    ``system`` column becomes the system prompt when the conversation has none.
    """
    turns = row.get("conversations", row.get("conversation"))
    messages = _sharegpt_messages(turns)
    system = text_content(row.get("system"))
    if system.strip() and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system})
    return Converted(
        messages=finish_prompt(messages),
        tools=parse_tools(row.get("tools")),
        source_id=_source_id(row, "id"),
    )


@register("magpie")
def convert_magpie(row: Mapping[str, Any]) -> Converted:
    """Magpie rows: ``instruction`` (its ``response`` is the old answer) or ShareGPT ``conversations``."""
    source_id = _source_id(row, "uuid", "id")
    if "conversations" in row:
        messages = _sharegpt_messages(row["conversations"])
    else:
        messages = [{"role": "user", "content": text_content(row.get("instruction"))}]
    return Converted(messages=finish_prompt(messages), tools=None, source_id=source_id)
