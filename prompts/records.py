"""The canonical prompt record every converter produces and every flow consumes.

Messages stay plain OpenAI chat dicts (``role``, ``content``, ``tool_calls`` with JSON-string
``arguments``, ``tool_call_id``, ``name``) because that is exactly what the endpoint takes and what
the output rows store: no translation layer to keep in sync.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
ToolSchema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a prompt came from, so a bad output row can be traced back to its input row."""

    dataset: str
    split: str
    row: int


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt ready to send: id, category, provenance, chat messages, tools, overrides."""

    id: str
    category: str
    source: SourceRef
    messages: list[Message]
    tools: list[ToolSchema] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def content_hash(messages: list[Message], tools: list[ToolSchema] | None = None) -> str:
    """A stable id from the prompt content alone: same content, same id, whatever the row order."""
    canonical = json.dumps(
        {"messages": messages, "tools": tools or None},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "h" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def stable_id(source_id: Any, messages: list[Message], tools: list[ToolSchema] | None = None) -> str:
    """The source's own id when it has a usable one, else the content hash."""
    if source_id is not None and str(source_id).strip():
        return str(source_id).strip()
    return content_hash(messages, tools)
