"""Shape checks on a converted record, so a malformed row is a reject with a reason, not a crash.

Converters accept what a format allows; this checks what every later step relies on (dedup keys
read ``tools[i].function.name``; the endpoint wants JSON-schema objects). One bad row must never
stop its category: the reason names the tool and the problem, short and stable for counting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prompts.errors import ConversionError


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_tools(tools: Sequence[Any] | None) -> None:
    """Raise ``ConversionError`` unless every tool is an OpenAI function tool with a named function."""
    for number, tool in enumerate(tools or [], start=1):
        where = f"tool {number}"
        if not isinstance(tool, Mapping):
            raise ConversionError(f"{where} is a {_kind(tool)}, not an object")
        if tool.get("type", "function") != "function":
            raise ConversionError(f"{where} has type {str(tool.get('type'))[:40]!r}, not 'function'")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ConversionError(f"{where}: function is a {_kind(function)}, not an object")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConversionError(f"{where}: function has no name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ConversionError(f"{where}: parameters is a {_kind(parameters)}, not an object")


def check_text(messages: Sequence[Any], tools: Sequence[Any] | None, source_id: Any = None) -> None:
    """Raise ``ConversionError`` where a text cannot be written as UTF-8.

    JSON allows an escaped lone surrogate (``"\\ud800"`` without its pair) and a local JSONL file may
    hold one; Python reads it into a string that no UTF-8 encoder accepts, so the prompt's hash, the
    request and the parquet shard each raised, and the first of them stopped the whole category at
    that row on every resume. Found here, it is one reject with its reason.
    """
    parts = [
        ("the id", source_id),
        *((f"message {n}", m) for n, m in enumerate(messages, 1)),
        ("the tools", tools),
    ]
    for where, value in parts:
        if not _encodes(value):
            raise ConversionError(
                f"{where}: text is not valid Unicode (a lone surrogate, such as a JSON \\ud800 escape "
                "without its pair)"
            )


def _encodes(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, Mapping):
        return all(_encodes(key) and _encodes(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return all(_encodes(item) for item in value)
    return True
