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
