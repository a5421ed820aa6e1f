"""Exports of a finished (or killed) run: SpecForge JSONL, ``save_to_disk``, optional push to the Hub.

Both formats stream the run's finished shards batch by batch (one parquet record batch in memory
at a time, never the whole run) and write under a temporary name that is renamed into place only
when complete, so a crash never leaves a half export that looks whole. Flagged rows (truncated,
empty, bad tool arguments...) are left out unless asked for: they teach a drafter wrong
continuations. A row id seen twice in one category (only possible when two processes raced on the
same run) is exported once.

The SpecForge shape, checked against sgl-project/SpecForge (``specforge/data/preprocessing.py``,
``specforge/data/parse.py``, ``scripts/regenerate_train_data.py``, ``docs/basic_usage/data_preparation.md``):

- one JSON object a line, ``{"id", "conversations": [{"role", "content", ...}], "tools"}``, read with
  ``load_dataset("json", ...)`` (training) or ``Dataset.from_generator`` over the lines
  (``prepare_hidden_states.py``). ``build_eagle3_dataset`` pops ``conversations``, ``id`` and ``tools``
  and passes *every other top-level key* to the chat template as a keyword (``HarmonyParser.parse``
  takes none and fails), so nothing else is written: no ``status``, no ``system_prompt``.
- ``tools`` is on every row, a JSON string ("[]" when none; it is ``json.loads``-ed): parsed tool
  schemas of different shapes would be merged by Arrow into one struct padded with nulls, and a
  column present on only some rows is dropped or fails the offline loader.
- Messages have the same keys everywhere (see ``specforge_message``): ``role``, ``content``,
  ``reasoning_content`` (with ``field``), ``tool_calls`` (``{"id", "type", "function": {"name",
  "arguments"}}``, ``arguments`` a JSON string, which its ``_sanitize_message`` parses),
  ``tool_call_id`` and ``name`` (the thinking parser passes them to templates such as Kimi K2's).
- Reasoning: SpecForge's own regeneration (``--reasoning save``) stores it as ``reasoning_content``
  beside a content free of ``<think>`` markers, and its ``ThinkingParser`` (chat templates with
  ``parser_type="thinking"``: qwen3-thinking, kimi-k2-thinking, deepseek...) hands that field to the
  model's chat template. That is the default here (``field``). The general parser keeps only role,
  content and tool_calls, so with a non-thinking template reasoning is trained only if ``inline``d
  into the content (as ``<think>\\n...\\n</think>\\n\\n``, the Qwen3/DeepSeek-R1 form); ``drop``
  trains the visible answer only.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flows.store.location import local_path
from flows.store.parts import part_of_file
from flows.store.run_store import TMP_PREFIX, RunStore, atomic_file, fsync_dir

if TYPE_CHECKING:  # datasets costs about a second to import: only the HF export needs it
    from datasets import Dataset

EXPORTS_DIR = "exports"
BATCH_ROWS = 1024
"""Rows per parquet record batch: bounds memory whatever the shard size."""

SPECFORGE_COLUMNS = ["id", "category", "messages", "tools", "flags"]


class ExportFormat(StrEnum):
    SPECFORGE = "specforge"
    HF = "hf"


class Reasoning(StrEnum):
    """Where an assistant turn's reasoning goes in a SpecForge export (see the module docstring)."""

    FIELD = "field"
    INLINE = "inline"
    DROP = "drop"


class ExportError(RuntimeError):
    """The export cannot be made as asked (not a run, unknown category, unreadable shard)."""


@dataclass(frozen=True)
class Selection:
    """Which rows go out: the training split (no flags) unless ``include_flagged``."""

    categories: tuple[str, ...] | None = None
    include_flagged: bool = False


@dataclass
class ExportTally:
    """What went out and what was left out, and why."""

    rows_by_category: Counter[str] = field(default_factory=Counter)
    left_out_by_flag: Counter[str] = field(default_factory=Counter)
    """A row with two flags counts under both."""
    left_out_rows: int = 0
    duplicates: int = 0
    without_system: Counter[str] = field(default_factory=Counter)
    """Exported rows per category whose conversation has no system turn (see ``trainer_templates``)."""
    rows_by_part: Counter[str] = field(default_factory=Counter)
    """Exported rows per part (``"2/4"``) of a run split with ``--part``; empty for a whole run."""
    with_reasoning: int = 0
    """Exported rows with a reasoning chain in any turn (counted by the SpecForge export, whose
    advice on templates depends on it)."""

    @property
    def rows(self) -> int:
        return sum(self.rows_by_category.values())


@dataclass
class ExportResult:
    format: ExportFormat
    path: Path
    tally: ExportTally
    categories: list[str]
    reasoning: Reasoning | None = None
    trainer_template: str | None = None


def default_out(run_dir: str | Path, fmt: ExportFormat) -> Path:
    """``<run>/exports/...`` for a local run; a run at a URL needs ``--out`` (exports are written locally)."""
    local = local_path(str(run_dir))
    if local is None:
        raise ExportError(f"{run_dir} is not a local folder: say where the export goes with --out")
    return local / EXPORTS_DIR / ("specforge.jsonl" if fmt is ExportFormat.SPECFORGE else "hf")


# -- pure conversion --------------------------------------------------------------------------------
def inline_reasoning(reasoning: str, content: str) -> str:
    """The Qwen3/DeepSeek-R1 rendering of a thought before the answer."""
    thought, answer = reasoning.strip("\n"), content.lstrip("\n")
    return f"<think>\n{thought}\n</think>\n\n{answer}"


def _specforge_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call with every key a string ("" for a missing id, as SpecForge's sanitiser defaults it)."""
    function = call.get("function") or {}
    return {
        "id": call.get("id") or "",
        "type": call.get("type") or "function",
        "function": {"name": function.get("name") or "", "arguments": function.get("arguments") or "{}"},
    }


def specforge_message(message: dict[str, Any], reasoning: Reasoning) -> dict[str, Any]:
    """One stored message in SpecForge's shape, with the SAME keys and value types on every message.

    Why uniform: SpecForge's offline path (``Dataset.from_generator`` in ``prepare_hidden_states.py``)
    fixes the Arrow schema from the first ~1,000 rows, so a later message with a key the first ones
    lacked (``tool_calls`` after a run of plain chats) or a string where they had nulls fails the
    whole load ("Couldn't cast array"). Missing values are therefore "" and ``tool_calls`` is ``[]``,
    never absent or null; templates test them by truthiness, so "" and ``[]`` render like no value.
    A null content (an assistant turn with only tool calls) becomes "", as SpecForge coerces it.
    """
    content = message.get("content") or ""
    thought = message.get("reasoning_content") or ""
    if thought and reasoning is Reasoning.INLINE:
        content = inline_reasoning(thought, content)
    out: dict[str, Any] = {"role": message["role"], "content": content}
    if reasoning is Reasoning.FIELD:
        out["reasoning_content"] = thought
    out["tool_calls"] = [_specforge_call(call) for call in message.get("tool_calls") or ()]
    out["tool_call_id"] = message.get("tool_call_id") or ""
    out["name"] = message.get("name") or ""
    return out


def specforge_record(row: dict[str, Any], reasoning: Reasoning) -> dict[str, Any]:
    """``{"id", "conversations", "tools"}``: ``tools`` on every row ("[]" when none), because
    SpecForge's loaders drop the column (or fail with ``KeyError: 'tools'``) when only some rows have it.
    """
    return {
        "id": row["id"],
        "conversations": [specforge_message(m, reasoning) for m in row["messages"] or []],
        "tools": row.get("tools") or "[]",
    }


# -- reading the run --------------------------------------------------------------------------------
def open_run(run_dir: str | Path) -> RunStore:
    """The run's store (a local folder or a URL); every part's shards are read."""
    store = RunStore(run_dir)
    if store.read_manifest() is None:
        raise ExportError(f"{run_dir} is not a run directory (no manifest.json)")
    return store


def resolve_categories(store: RunStore, wanted: Iterable[str] | None) -> list[str]:
    """The categories to export, in a stable order; an unknown name is an error, not an empty export."""
    available = store.categories_on_disk()
    if wanted is None:
        return available
    chosen = list(dict.fromkeys(wanted))
    unknown = [name for name in chosen if name not in available]
    if unknown:
        raise ExportError(f"unknown categories {unknown}; this run has {available}")
    return chosen


def _iter_batches(store: RunStore, path: str, columns: list[str] | None) -> Iterator[list[dict[str, Any]]]:
    try:
        for batch in store.parquet_file(path).iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield batch.to_pylist()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as error:
        # the resume reads only the ids, which may be whole beside a damaged answer: moved aside here,
        # the shard's rows are asked again by the next start
        target = store.quarantine(path, error)
        raise ExportError(
            f"shard {path} cannot be read ({error}); it is moved to {target}: run the run again "
            "(the same `datagen run` command) to redo its rows, then export again"
        ) from error


def iter_selected_rows(
    store: RunStore,
    categories: list[str],
    selection: Selection,
    tally: ExportTally,
    columns: list[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows to export, category by category, shard by shard; ``tally`` counts as they pass."""
    for category in categories:
        seen: set[str] = set()
        for path in store.shard_files(store.data_dir(category)):
            part = part_of_file(posixpath.basename(path))
            for rows in _iter_batches(store, path, columns):
                for row in rows:
                    flags = row.get("flags") or []
                    if flags and not selection.include_flagged:
                        tally.left_out_rows += 1
                        tally.left_out_by_flag.update(flags)
                        continue
                    if row["id"] in seen:
                        tally.duplicates += 1
                        continue
                    seen.add(row["id"])
                    tally.rows_by_category[category] += 1
                    if part is not None:
                        tally.rows_by_part[part] += 1
                    yield row


# -- writing ----------------------------------------------------------------------------------------
def write_lines_atomically(lines: Iterable[str], path: Path) -> None:
    """Stream lines to a temporary file, fsync, rename: the file is whole or absent (or the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as handle:
        handle.writelines(lines)


def _swap_in_dir(tmp: Path, path: Path) -> None:
    """Put a finished directory in place of ``path``; the old export is deleted only afterwards."""
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.old.")) / path.name
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old.parent)


def export_specforge(
    run_dir: str | Path,
    out: Path | None = None,
    selection: Selection | None = None,
    reasoning: Reasoning = Reasoning.FIELD,
    trainer_template: str | None = None,
) -> ExportResult:
    """The rows as SpecForge JSONL; ``trainer_template`` (a SpecForge template name) is only recorded
    in the result, so the summary can compare the rows' system prompts with what it will insert."""
    selection = selection or Selection()
    store = open_run(run_dir)
    categories = resolve_categories(store, selection.categories)
    path = out or default_out(run_dir, ExportFormat.SPECFORGE)
    tally = ExportTally()
    rows = iter_selected_rows(store, categories, selection, tally, SPECFORGE_COLUMNS)

    def lines() -> Iterator[str]:
        for row in rows:
            record = specforge_record(row, reasoning)
            if not record["conversations"] or record["conversations"][0]["role"] != "system":
                tally.without_system[row["category"]] += 1
            if any(m.get("reasoning_content") for m in row["messages"] or ()):
                tally.with_reasoning += 1
            yield json.dumps(record, ensure_ascii=False) + "\n"

    write_lines_atomically(lines(), path)
    return ExportResult(
        ExportFormat.SPECFORGE,
        path,
        tally,
        categories,
        reasoning=reasoning,
        trainer_template=trainer_template,
    )


def _build_dataset(rows: Iterator[dict[str, Any]], cache_dir: Path) -> Dataset:
    """A memory-mapped ``Dataset`` with the declared features, built in a private cache.

    ``from_generator`` writes Arrow as rows arrive (constant memory) but refuses an empty
    generator, hence the peek. The explicit fingerprint skips hashing the generator's closure.
    """
    from datasets import Dataset

    from flows.store.schema import ROW_FEATURES

    first = next(rows, None)
    if first is None:
        return Dataset.from_dict({name: [] for name in ROW_FEATURES}, features=ROW_FEATURES)
    return Dataset.from_generator(
        lambda: chain([first], rows), features=ROW_FEATURES, cache_dir=str(cache_dir), fingerprint="export"
    )


def export_hf(
    run_dir: str | Path, out: Path | None = None, selection: Selection | None = None
) -> ExportResult:
    """``save_to_disk`` of the selected rows with the declared features."""
    selection = selection or Selection()
    store = open_run(run_dir)
    categories = resolve_categories(store, selection.categories)
    path = out or default_out(run_dir, ExportFormat.HF)
    path.parent.mkdir(parents=True, exist_ok=True)
    tally = ExportTally()
    work = Path(tempfile.mkdtemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}."))
    try:
        dataset = _build_dataset(iter_selected_rows(store, categories, selection, tally), work / "cache")
        # An empty dataset saved with the default sharding has zero shards, which load_from_disk
        # cannot read back (datasets 5.2); one empty shard round-trips.
        dataset.save_to_disk(str(work / "dataset"), num_shards=None if len(dataset) else 1)
        _swap_in_dir(work / "dataset", path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ExportResult(ExportFormat.HF, path, tally, categories)


def push_export(path: Path, repo_id: str, private: bool = False) -> None:
    """Push a saved export to the Hub. The token comes from HF_TOKEN or ``hf auth login`` and is never
    passed or printed here; ``private=None`` without --private lets the Hub's default apply."""
    from datasets import load_from_disk

    load_from_disk(str(path)).push_to_hub(repo_id, private=True if private else None)
