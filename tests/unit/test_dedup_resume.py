"""A run keeps the dedup key version it was started with: resume asks no done prompt again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.config import RunConfig, parse_config
from flows.run.categories import Categories
from flows.run.prompt_stream import Ask, StreamCounts, category_items
from flows.store.parts import Part
from flows.store.run_store import KeyVersionUnknown, RunStore
from prompts.dedup import KEY_VERSION

CODE = "Fix this:\nif x:\n    a()\nb()"
OTHER_CODE = "Fix this:\nif x:\n    a()\n    b()"
"""Another program: one prompt with CODE under the first key (every whitespace run one space)."""

CODE_FIRST_KEY = "3635da70be8fa06bef7026957d2b71b8"
"""CODE's ``prompt_hash`` as runs made before key versions stored it (computed with that code)."""

CONFIG: RunConfig = parse_config(
    {
        "run": {"name": "r"},
        "endpoints": [{"url": "http://127.0.0.1:1"}],
        "categories": [{"name": "chat", "source": "unused.jsonl", "format": "messages"}],
    }
)


def _rows() -> list[tuple[int, dict]]:
    texts = {"done": CODE, "again": CODE, "other": OTHER_CODE, "new": "a new question"}
    return [
        (i, {"id": rid, "messages": [{"role": "user", "content": text}]})
        for i, (rid, text) in enumerate(texts.items())
    ]


def _old_run(path: Path, **fields: object) -> RunStore:
    """A run directory as the code before key versions left it: a manifest without the version, and
    the answered row of CODE holding its first-version key."""
    store = RunStore(path)
    store.fs.makedirs(store.root, exist_ok=True)
    manifest = {
        "fingerprint": "fp",
        "created_at": "2025-01-01T00:00:00+00:00",
        "config": {},
        "history": [{"fingerprint": "fp", "started_at": "2025-01-01T00:00:00+00:00"}],
        **fields,
    }
    store.fs.pipe_file(store.manifest_path, json.dumps(manifest).encode())
    _answer(store, "done", CODE_FIRST_KEY)
    return store


def _answer(store: RunStore, rid: str, prompt_hash: str) -> None:
    store.row_writer("chat", flush_rows=10, flush_seconds=60).write(
        [{"id": rid, "category": "chat", "prompt_hash": prompt_hash}]
    )


def _start(store: RunStore) -> list[Ask]:
    """One start as the session and the pipeline make it: open the run, read what every category
    holds (claiming its keys), then stream the category with the run's shared dedup index."""
    store.open_run("fp", {})
    categories = Categories(CONFIG, store)
    categories.load_states()
    state = categories.states["chat"]
    items = category_items(
        CONFIG.category("chat"), state, StreamCounts(), rows=_rows(), dedup=categories.dedup
    )
    return [item for item in items if isinstance(item, Ask)]


def test_a_run_started_before_key_versions_resumes_with_its_first_key(tmp_path: Path) -> None:
    """Hashed with the new key, the exact duplicate of an answered program had a key no row holds and
    was asked again: two rows of one prompt. The run keeps the key it was started with."""
    store = _old_run(tmp_path / "run")
    assert [ask.record.id for ask in _start(store)] == ["new"]  # "again" and "other" are "done"'s
    manifest = store.read_manifest()
    assert manifest is not None
    assert (manifest["fingerprint"], manifest["prompt_key_version"]) == ("fp", 1)


def test_a_new_run_records_the_new_key_and_resumes_with_it(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    (first, *_) = _start(store)
    manifest = store.read_manifest()
    assert manifest is not None and manifest["prompt_key_version"] == KEY_VERSION
    _answer(store, first.record.id, first.prompt_hash)
    assert [ask.record.id for ask in _start(store)] == ["other", "new"]


def test_a_forced_start_on_an_old_run_keeps_its_first_key(tmp_path: Path) -> None:
    """``--force`` adds rows of another config to the run: its rows still hold first-version keys."""
    store = _old_run(tmp_path / "run")
    store.open_run("another fp", {}, force=True)
    assert store.prompt_key_version() == 1


@pytest.mark.parametrize("index", [1, 2])
def test_every_part_of_an_old_run_keeps_its_first_key(tmp_path: Path, index: int) -> None:
    _old_run(tmp_path / "run", parts=2)
    store = RunStore(tmp_path / "run", Part(index, 2))
    store.open_run("fp", {})
    categories = Categories(CONFIG, store)
    categories.load_states()
    assert categories.dedup.version == 1


def test_a_run_keyed_by_a_version_this_code_does_not_know_is_refused_before_anything_is_touched(
    tmp_path: Path,
) -> None:
    """A run a newer release started: hashing with another key would ask its done prompts' duplicates
    again. It is refused with one line (the CLI prints it) before a temporary file is removed."""
    store = _old_run(tmp_path / "run", prompt_key_version=99)
    leftover = Path(store.data_dir("chat")) / ".tmp-leftover"
    leftover.write_bytes(b"")
    before = store.read_manifest()
    with pytest.raises(KeyVersionUnknown, match=r"dedup key version 99, .* \(it knows 1, 2\): resume it"):
        store.open_run("fp", {})
    assert store.read_manifest() == before and leftover.exists()
