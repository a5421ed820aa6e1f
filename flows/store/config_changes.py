"""What changed between two fingerprinted configs, in words, for the refusal to mix two datasets.

A hash alone said only "another config": the user had to guess which of the prompts, the sampling or
the model had moved (a value edited by hand, a bundled category file overridden by a ``categories/``
folder beside the config, a model renamed on the server). The manifest keeps what the fingerprint
hashed, and the refusal names each field that differs.
"""

from __future__ import annotations

import reprlib
from typing import Any

_short = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_short.maxstring = _short.maxother = 60


def describe_changes(old: Any, new: Any, *, at_most: int = 6) -> list[str]:
    """One line per field that differs (``path: old -> new``), the first ``at_most`` of them."""
    lines: list[str] = []
    _compare(old, new, "", lines)
    if len(lines) > at_most:
        lines[at_most:] = [f"... and {len(lines) - at_most} more"]
    return lines


def _compare(old: Any, new: Any, path: str, out: list[str]) -> None:
    if old == new:
        return
    old_named, new_named = _by_name(old), _by_name(new)
    if old_named is not None and new_named is not None:  # categories: by name, not by position
        if set(old_named) == set(new_named) and list(old_named) != list(new_named):
            out.append(f"{path or 'list'}: order {list(old_named)} -> {list(new_named)}")
        old, new = old_named, new_named
        keyed = "{path}[{key}]"
    elif isinstance(old, dict) and isinstance(new, dict):
        keyed = "{path}.{key}" if path else "{key}"
    else:
        out.append(f"{path or 'value'}: {_short.repr(old)} -> {_short.repr(new)}")
        return
    for key in dict.fromkeys([*old, *new]):
        where = keyed.format(path=path, key=key)
        if key not in old:
            out.append(f"{where}: added")
        elif key not in new:
            out.append(f"{where}: removed")
        else:
            _compare(old[key], new[key], where, out)


def _by_name(value: Any) -> dict[str, Any] | None:
    """A list of dicts that each have a unique ``name`` (the categories), as a dict by name."""
    if not isinstance(value, list) or not all(isinstance(item, dict) and "name" in item for item in value):
        return None
    named = {str(item["name"]): item for item in value}
    return named if len(named) == len(value) else None
