"""`datagen prompts preview`: what a category would send, before any GPU time is spent.

A preview runs the real stream (``category_items``: filters, conversion, quota, dedup) over the
first rows of the source, so the counts it shows are the ones a run would see on those rows, not a
second implementation that could drift. It reads a capped number of rows so it stays quick on a
million-row file or a Hub stream; quota and dedup are therefore decided over those rows only.

The report is plain data (``Preview``) built by a pure function over a row source; the CLI renders
it (tables or JSON). Loading a tokenizer is the one piece of I/O here, kept in ``load_measure``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows.config import CategoryConfig, ConfigError, load_config
from flows.run.prompt_stream import Ask, MostlyRejected, Rows, StreamCounts, category_items, source_rows
from flows.run.regen import first_turn
from flows.store.run_store import CategoryState
from prompts.categories import category_file, known_categories, load_category
from prompts.dedup import DedupIndex
from prompts.filters import row_filter, rows_after_each_step
from prompts.records import Message, PromptRecord

EXAMPLE_CHARS = 300
"""Characters of each message shown in an example: enough to recognise a prompt, short enough to scan."""

_HUB_OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}
TOKENIZER_FILE = "tokenizer.json"
HUB_TIMEOUT_S = 5.0
"""How long a preview waits for the Hub when a tokenizer is not in the local cache: a working network
answers well within it, and a machine without one is not held up."""


@dataclass(frozen=True)
class Measure:
    """How a prompt's length is counted: ``unit`` names what ``count`` returns; ``note`` tells the reader
    which tokenizer was used, or why lengths fell back to characters."""

    unit: str
    count: Callable[[str], int]
    note: str | None = None


CHARACTERS = Measure("characters", len)


@dataclass(frozen=True)
class LengthStats:
    """Prompt-length distribution over the taken prompts (nearest-rank percentiles)."""

    unit: str
    count: int
    min: int
    median: float
    p90: int
    p99: int
    max: int


@dataclass(frozen=True)
class ExampleMessage:
    role: str
    text: str
    """The first ``EXAMPLE_CHARS`` characters of the content (``…`` when cut), then any calls made."""


@dataclass(frozen=True)
class Example:
    """One converted prompt as a person checks it: where it came from, its messages, its tool names."""

    id: str
    row: int
    messages: list[ExampleMessage]
    tools: list[str]


@dataclass(frozen=True)
class Preview:
    """Everything ``datagen prompts preview`` shows, as data (``--json`` prints exactly this)."""

    category: str
    settings: dict[str, Any]
    rows_cap: int
    steps: list[tuple[str, int]]
    filter_steps: list[tuple[str, int]]
    """Rows left after each configured filter, in the order the filter checks them."""
    filtered: dict[str, int]
    rejected: dict[str, int]
    examples: list[Example]
    lengths: LengthStats | None
    length_unit: str
    notes: list[str] = field(default_factory=list)


def category_settings(category: CategoryConfig) -> dict[str, Any]:
    """What decides which prompts are taken and how they are asked (generation is left out: it does not)."""
    return {
        "source": category.source,
        "split": category.split,
        "subset": category.subset,
        "format": category.format,
        "mode": category.mode,
        "send_tools": category.send_tools,
        "system_prompt": category.system_prompt,
        "quota": None if category.quota is None else category.quota.model_dump(exclude_none=True),
        "limit": category.limit,
        "filters": dict(category.filters),
    }


def capped_rows(category: CategoryConfig, rows: int) -> Callable[[], Rows]:
    """Opens the category's source anew on each call, at most ``rows`` rows (a count quota reads twice)."""
    return lambda: islice(source_rows(category), rows)


def prompt_text(record: PromptRecord) -> str:
    """The text of the first request: its messages' contents, then the tool schemas if they are sent.

    The first request is the only one known before generation (later turns carry the model's own
    answers), and the tool schemas go into the prompt too, so they count toward its length.
    """
    parts = [m.get("content") or "" for m in first_turn(record.messages)]
    if record.tools:
        parts.append(json.dumps(record.tools, ensure_ascii=False))
    return "\n".join(parts)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _example_message(message: Message) -> ExampleMessage:
    text = _shorten(message.get("content") or "", EXAMPLE_CHARS)
    calls = [call["function"]["name"] for call in message.get("tool_calls") or ()]
    if calls:
        text = f"{text} [calls: {', '.join(calls)}]".lstrip()
    return ExampleMessage(role=str(message.get("role")), text=text)


def example(record: PromptRecord) -> Example:
    tools = [str((tool.get("function") or {}).get("name")) for tool in record.tools or ()]
    return Example(
        id=record.id,
        row=record.source.row,
        messages=[_example_message(m) for m in record.messages],
        tools=tools,
    )


def _nearest_rank(ordered: Sequence[int], q: float) -> int:
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def length_stats(lengths: Iterable[int], unit: str) -> LengthStats | None:
    """count, min, median, p90, p99, max; None when no prompt was taken."""
    ordered = sorted(lengths)
    if not ordered:
        return None
    return LengthStats(
        unit=unit,
        count=len(ordered),
        min=ordered[0],
        median=statistics.median(ordered),
        p90=_nearest_rank(ordered, 0.90),
        p99=_nearest_rank(ordered, 0.99),
        max=ordered[-1],
    )


def build_preview(
    category: CategoryConfig,
    open_rows: Callable[[], Rows],
    *,
    rows_cap: int,
    examples: int = 5,
    measure: Measure = CHARACTERS,
) -> Preview:
    """Run the category's stream as a fresh run would (nothing done, nothing claimed) and summarise it.

    ``open_rows`` must return the same rows on every call: a count quota reads them twice.
    ``rows_cap`` is only reported (the caller applied it when opening the rows).
    """
    counts = StreamCounts()
    taken: list[Example] = []
    lengths: list[int] = []
    items = category_items(
        category, CategoryState(), counts, open_rows(), dedup=DedupIndex(), rows_again=open_rows
    )
    notes = [measure.note] if measure.note else []
    try:
        for item in items:
            if not isinstance(item, Ask):
                continue
            if len(taken) < examples:
                taken.append(example(item.record))
            lengths.append(measure.count(prompt_text(item.record)))
    except MostlyRejected as error:  # a run would stop this category here: say so, keep the counts
        notes.append(f"a run would stop this category: {error}")
    if counts.read >= rows_cap:
        notes.append(f"stopped after {rows_cap} rows (--rows): counts, quota and dedup cover these rows only")
    if category.limit is not None and counts.taken >= category.limit:
        notes.append(f"the category's limit ({category.limit} prompts) was reached")
    return Preview(
        category=category.name,
        settings=category_settings(category),
        rows_cap=rows_cap,
        steps=counts.steps(),
        filter_steps=rows_after_each_step(counts.read, _filter_steps(category), counts.filtered),
        filtered=dict(counts.filtered.most_common()),
        rejected=dict(counts.rejected.most_common()),
        examples=taken,
        lengths=length_stats(lengths, measure.unit),
        length_unit=measure.unit,
        notes=notes,
    )


def _filter_steps(category: CategoryConfig) -> list[str]:
    built = row_filter(category.format, category.filters or {})
    return built.steps() if built is not None else []


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE read now (huggingface_hub reads it once at import, which may be too early)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _HUB_OFFLINE_VALUES


def _tokenizer_file(name: str) -> str:
    """A local tokenizer.json (or a folder holding one), else the Hub's copy (``_hub_tokenizer_file``)."""
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if path.is_file():
        return str(path)
    if path.is_absolute() or name.startswith((".", "~")) or name.endswith(".json"):
        raise FileNotFoundError(f"no tokenizer file at {path}")
    return _hub_tokenizer_file(name)


def _hub_tokenizer_file(repo_id: str) -> str:
    """The tokenizer.json of a Hub model: from the local Hugging Face cache, else (not with
    HF_HUB_OFFLINE) from the Hub, asked once with ``HUB_TIMEOUT_S``; ``FileNotFoundError`` in one
    line when neither has it.

    ``hf_hub_download`` asks the Hub before its cache: without internet a cached tokenizer waited 10 s,
    and one not cached waited for retries of a minute each. A preview counts lengths, so a cached
    tokenizer that the Hub has since updated is good enough. The Hub is probed first because a failed
    ``hf_hub_download`` retries on its own, past any timeout given to it.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return hf_hub_download(repo_id, TOKENIZER_FILE, local_files_only=True)
    except LocalEntryNotFoundError:
        if _hub_offline():
            raise FileNotFoundError("not in the Hugging Face cache, and HF_HUB_OFFLINE is set") from None
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, TOKENIZER_FILE), timeout=HUB_TIMEOUT_S)
        return hf_hub_download(repo_id, TOKENIZER_FILE, etag_timeout=HUB_TIMEOUT_S)
    except Exception as error:  # offline, refused, timed out, no such repo: one line all the same
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise FileNotFoundError(
            f"not in the Hugging Face cache, and not fetched from the Hub within {HUB_TIMEOUT_S:g} s: "
            f"{reason}"
        ) from None


def load_measure(tokenizer: str | None) -> Measure:
    """Token counts with Hugging Face's ``tokenizers`` (a dependency: only tokenizer.json is read, no
    model library), else characters with a note.

    A preview must work anywhere, so an offline Hub, an id not in the cache, a bad path or a file that
    is no tokenizer degrade to characters and say so rather than failing.
    """
    if tokenizer is None:
        return CHARACTERS
    from tokenizers import Tokenizer  # imported when asked for: the other commands do without

    try:
        loaded = Tokenizer.from_file(_tokenizer_file(tokenizer))
    except Exception as error:  # any load failure (missing, offline, corrupt) degrades the same way
        return Measure(
            "characters", len, f"could not load tokenizer {tokenizer!r} ({error}): lengths in characters"
        )
    return Measure(
        "tokens",
        lambda text: len(loaded.encode(text, add_special_tokens=False).ids),
        f"tokenizer: {tokenizer}",
    )


def find_category(name: str, config: Path | None = None) -> CategoryConfig:
    """A bundled category file by name, or a category of a run config; ``ConfigError`` lists the choices."""
    if config is not None:
        run = load_config(config)
        try:
            return run.category(name)
        except KeyError:
            names = ", ".join(c.name for c in run.categories)
            raise ConfigError(f"{config} has no category {name!r}; its categories: {names}") from None
    path = category_file(name)
    if path is None:
        known = ", ".join(known_categories()) or "none"
        raise ConfigError(f"no category named {name!r}; known: {known} (or pass --config RUN.toml)")
    try:
        return CategoryConfig.model_validate(load_category(path))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or name}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise ConfigError(f"{path}: {problems}") from None
