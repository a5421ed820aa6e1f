"""Data-quality gates on regenerated answers.

A flagged row is kept (it cost GPU time and shows what the model does) but left out of the training
split by default: a truncated answer or a tool call with unparsable arguments teaches a drafter the
wrong continuation.
"""

from __future__ import annotations

import json
from typing import Any

TRUNCATED = "truncated"
EMPTY = "empty"
BAD_TOOL_ARGUMENTS = "bad_tool_arguments"
UNKNOWN_TOOL = "unknown_tool"
ODD_FINISH = "odd_finish"
"""An answer that ended for a reason other than its end, its length or its tool calls: vLLM's
"repetition" (stopped while looping), an engine's own reason: not a continuation to learn."""
ENDED = frozenset({"stop", "length", "tool_calls"})


def _tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    names = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def _arguments_parse(arguments: Any) -> bool:
    if not isinstance(arguments, str):
        return False
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def quality_flags(
    message: dict[str, Any], finish_reason: str, tools: list[dict[str, Any]] | None
) -> list[str]:
    """Flags for one regenerated assistant turn, in a fixed order."""
    flags: list[str] = []
    if finish_reason == "length":
        flags.append(TRUNCATED)
    elif finish_reason not in ENDED:
        flags.append(ODD_FINISH)
    calls = message.get("tool_calls") or []
    content = (message.get("content") or "").strip()
    if not content and not calls:
        flags.append(EMPTY)
    if any(not _arguments_parse(call.get("function", {}).get("arguments")) for call in calls):
        flags.append(BAD_TOOL_ARGUMENTS)
    known = _tool_names(tools)
    if calls and any(call.get("function", {}).get("name") not in known for call in calls):
        flags.append(UNKNOWN_TOOL)
    return flags
