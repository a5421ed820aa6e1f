"""Named categories: one TOML file per category under ``prompts/categories/``.

A run config picks a category by name (``use = "B1_glaive"``, or just ``name = "B1_glaive"`` with no
``source``) and may override any of its settings; tables (generation, quota, filters) merge key by key.
Files next to the run config in a ``categories/`` folder take precedence over the bundled ones.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

BUNDLED = Path(str(resources.files("prompts") / "categories"))
WRITTEN_SOURCE = "_source_as_written"
"""Beside a local ``source`` made absolute, the path as written (relative to its file): what the run's
fingerprint counts, so a project moved or cloned elsewhere resumes its runs."""


def search_path(extra: Sequence[Path] = ()) -> list[Path]:
    return [*extra, BUNDLED]


def category_file(name: str, extra: Sequence[Path] = ()) -> Path | None:
    for folder in search_path(extra):
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate
    return None


def known_categories(extra: Sequence[Path] = ()) -> list[str]:
    names: set[str] = set()
    for folder in search_path(extra):
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.toml"))
    return sorted(names)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``; nested tables merge, everything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_category(path: Path) -> dict[str, Any]:
    """A category file's table, its local ``source`` made absolute (relative to the file)."""
    return _load(path)[0]


def _load(path: Path) -> tuple[dict[str, Any], str | None]:
    """``load_category``'s table, and its local ``source`` as written when it was made absolute."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    data.setdefault("name", path.stem)
    source = data.get("source")
    if isinstance(source, str) and not Path(source).is_absolute() and (path.parent / source).exists():
        data["source"] = str((path.parent / source).resolve())
        return data, source
    return data, None


def expand(entry: dict[str, Any], extra: Sequence[Path] = ()) -> dict[str, Any]:
    """A run config's category entry with its named category file underneath (if it names one)."""
    name = entry.get("use") or (entry.get("name") if "source" not in entry else None)
    if not isinstance(name, str):
        return entry
    path = category_file(name, extra)
    if path is None:
        if "use" in entry:
            known = ", ".join(known_categories(extra)) or "none"
            raise LookupError(f"no category file named {name!r} (known: {known})")
        return entry
    override = {k: v for k, v in entry.items() if k != "use"}
    base, written = _load(path)
    if written is not None and "source" not in override:  # (an entry's own source is its own)
        base[WRITTEN_SOURCE] = written
    return deep_merge(base, override)
