"""The format registry: source-row layouts by name, and the step from a row to a ``PromptRecord``.

Converters only know a row layout (``Mapping -> Converted``); ids, provenance and category are
added here once, so every format gets the same stable-id rule and the same invalid-row handling.
Converter modules register themselves on import; ``BUILTIN_MODULES`` are imported the first time
anyone asks the registry, so callers never depend on having imported the right module first (and
converter modules may import this one without a cycle).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prompts.errors import ConversionError
from prompts.records import Message, PromptRecord, SourceRef, ToolSchema, stable_id
from prompts.validate import check_text, check_tools

INVALID_KEY = "__invalid__"
"""Key of the marker row a reader yields for an unparsable input line (value: where and why)."""


@dataclass(frozen=True)
class Converted:
    """What a converter returns for one source row."""

    messages: list[Message]
    tools: list[ToolSchema] | None
    source_id: str | None


Converter = Callable[[Mapping[str, Any]], Converted]

BUILTIN_MODULES: tuple[str, ...] = (
    "prompts.convert_chat",
    "prompts.convert_glaive",
    "prompts.convert_opencodeinstruct",
)

_REGISTRY: dict[str, Converter] = {}


def _load_builtins() -> None:
    """Import the bundled converter modules (idempotent: Python caches imported modules)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def register(name: str) -> Callable[[Converter], Converter]:
    """Register a converter under ``name``; a second registration of a name is a programming error."""

    def decorator(fn: Converter) -> Converter:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"format {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorator


def get_converter(name: str) -> Converter:
    """The converter for ``name``; an unknown name lists the known ones (usually a config typo)."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(known_formats())
        raise KeyError(f"unknown prompt format {name!r}; known formats: {known}") from None


def known_formats() -> list[str]:
    """Registered format names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def to_record(
    row: Mapping[str, Any],
    *,
    index: int,
    category: str,
    dataset: str,
    split: str,
    fmt: str,
    overrides: dict[str, Any] | None = None,
) -> PromptRecord:
    """Convert one source row into a record; raises ``ConversionError`` (the caller records a reject).

    Reader markers for unparsable lines are turned into a ``ConversionError`` here, so bad input
    follows the same reject path as an unusable row instead of being skipped.
    """
    if INVALID_KEY in row:
        raise ConversionError(f"invalid input: {row[INVALID_KEY]}")
    converted = get_converter(fmt)(row)
    check_tools(converted.tools)
    check_text(converted.messages, converted.tools, converted.source_id)
    return PromptRecord(
        id=stable_id(converted.source_id, converted.messages, converted.tools),
        category=category,
        source=SourceRef(dataset=dataset, split=split, row=index),
        messages=converted.messages,
        tools=converted.tools,
        overrides=dict(overrides or {}),
    )
