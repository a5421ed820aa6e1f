"""Brace-matching JSON extraction for text that embeds JSON objects in prose.

Why not regexes: JSON objects nest, and their strings may hold braces, quotes and apostrophes
(``"Maya's {big} day"``), so only a scanner that tracks string state finds where an object ends.
Why not ``json.loads`` on a cleaned-up string: glaive writes tool-call arguments as a JSON object
wrapped in *single* quotes, and the usual fix (replace every ``'`` with ``"``) corrupts every
apostrophe inside the arguments. The lenient parser here recognises that one quirk structurally
(a ``'`` followed by a brace-matched object followed by ``'``) and parses everything else as JSON.

Errors are ``ScanError`` with a short, position-free message, because callers put the message into
a rejects table where identical problems must group together.
"""

from __future__ import annotations

import json
from typing import Any

_WHITESPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


class ScanError(ValueError):
    """Text that is not the JSON (or glaive-quoted JSON) it should be; the message is short and stable."""


def skip_whitespace(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not JSON whitespace (``len(text)`` at the end)."""
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def object_end(text: str, start: int) -> int:
    """The index just past the ``}`` that closes the ``{`` at ``text[start]``.

    Braces inside double-quoted strings (with backslash escapes) do not count. Single quotes are
    ordinary characters, so apostrophes in JSON strings are harmless.
    """
    if text[start : start + 1] != "{":
        raise ScanError("expected '{'")
    depth = 0
    in_string = False
    pos = start
    while pos < len(text):
        char = text[pos]
        if in_string:
            if char == "\\":
                pos += 1  # the escaped character can never end the string
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    raise ScanError("unbalanced braces")


def loads_object(text: str) -> dict[str, Any]:
    """``json.loads`` that insists on an object and reports errors without positions."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScanError(exc.msg) from None
    if not isinstance(value, dict):
        raise ScanError("not a JSON object")
    return value


def extract_objects(text: str, start: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Parse a run of JSON objects from ``start``, in every layout glaive pastes definitions in.

    Objects may be separated by whitespace, by a comma, or both (``}\n\n{``, ``},\n{``), the last
    one may carry a trailing comma, and the whole run may be wrapped in ``[ ]``: separators and
    brackets are consumed, so none of them is left over as stray text for the caller.
    Returns the objects and the index where the run stopped (the first non-whitespace character
    that does not continue it, or the end), so the caller can keep whatever text follows.
    An object that does not parse raises ``ScanError`` naming its 1-based position in the run.
    """
    objects: list[dict[str, Any]] = []
    pos = skip_whitespace(text, start)
    # A "[" opens a list only when an object follows: prose such as "[Note] ..." is left alone.
    inner = skip_whitespace(text, pos + 1)
    bracketed = text[pos : pos + 1] == "[" and text[inner : inner + 1] == "{"
    if bracketed:
        pos = inner
    while text[pos : pos + 1] == "{":
        number = len(objects) + 1
        try:
            end = object_end(text, pos)
            objects.append(loads_object(text[pos:end]))
        except ScanError as exc:
            raise ScanError(f"object {number}: {exc}") from None
        pos = skip_whitespace(text, end)
        if text[pos : pos + 1] == ",":
            pos = skip_whitespace(text, pos + 1)
    if bracketed:
        if text[pos : pos + 1] != "]":
            raise ScanError("list of objects without its closing ']'")
        pos = skip_whitespace(text, pos + 1)
    return objects, pos


def _expect(text: str, pos: int, char: str) -> int:
    """The index past ``char`` at ``pos`` (after whitespace), or ``ScanError``."""
    pos = skip_whitespace(text, pos)
    if text[pos : pos + 1] != char:
        raise ScanError(f"expected {char!r}")
    return pos + 1


def _lenient_value(text: str, pos: int) -> tuple[Any, int]:
    """One value: a single-quoted JSON object (glaive's arguments) or any plain JSON value."""
    if text[pos : pos + 1] == "'":
        inner = skip_whitespace(text, pos + 1)
        end = object_end(text, inner)
        return loads_object(text[inner:end]), _expect(text, end, "'")
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise ScanError(exc.msg) from None


def parse_lenient_object(text: str, start: int) -> tuple[dict[str, Any], int]:
    """Parse the object at ``text[start]`` whose values may be single-quoted JSON objects.

    ``{"name": "f", "arguments": '{"title": "Maya's recital"}'}`` gives
    ``{"name": "f", "arguments": {"title": "Maya's recital"}}``: the quoted object is found by brace
    matching, so quotes inside it are never rewritten. Keys must be JSON strings; returns the
    object and the index just past its closing brace.
    """
    pos = skip_whitespace(text, _expect(text, start, "{"))
    result: dict[str, Any] = {}
    if text[pos : pos + 1] == "}":
        return result, pos + 1
    while True:
        key, pos = _lenient_value(text, pos)
        if not isinstance(key, str):
            raise ScanError("object key is not a string")
        pos = skip_whitespace(text, _expect(text, pos, ":"))
        result[key], pos = _lenient_value(text, pos)
        pos = skip_whitespace(text, pos)
        separator = text[pos : pos + 1]
        if separator == "}":
            return result, pos + 1
        if separator != ",":
            raise ScanError("expected ',' or '}'")
        pos = skip_whitespace(text, pos + 1)
