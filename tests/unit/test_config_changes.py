"""A run's fingerprint does not depend on where the project lies, and a refusal names what changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows.config import fingerprint, fingerprinted, load_config
from flows.store.config_changes import describe_changes
from flows.store.run_store import FingerprintMismatch, RunStore

TOML = """
[run]
name = "r"
[[endpoints]]
url = "http://127.0.0.1:1"
[generation]
max_tokens = 64
[[categories]]
name = "chat"
source = "chat.jsonl"
format = "messages"
[[categories]]
name = "bundled"
use = "sample_sharegpt"
"""


def _project(folder: Path, toml: str = TOML) -> Path:
    folder.mkdir(parents=True)
    (folder / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (folder / "run.toml").write_text(toml)
    return folder / "run.toml"


def test_a_moved_project_keeps_its_fingerprint_and_the_earlier_hash_is_known(tmp_path: Path) -> None:
    here = load_config(_project(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    moved = load_config(tmp_path / "b" / "run.toml")
    assert here.categories[0].source == str(tmp_path / "a" / "chat.jsonl")  # still read from here
    assert fingerprint(here, "m") == fingerprint(moved, "m")
    # what earlier versions hashed: the absolute paths, which differ once the project moves
    assert fingerprint(here, "m", absolute_sources=True) != fingerprint(moved, "m", absolute_sources=True)
    covered = fingerprinted(here, "m")["categories"]
    assert [c["source"] for c in covered] == ["chat.jsonl", "../samples/sharegpt_sample.jsonl"]


def test_a_source_written_over_a_category_file_counts_as_written(tmp_path: Path) -> None:
    toml = TOML.replace('use = "sample_sharegpt"', 'use = "sample_sharegpt"\nsource = "org/dataset"')
    config = load_config(_project(tmp_path / "a", toml))
    assert [c["source"] for c in fingerprinted(config, "m")["categories"]] == ["chat.jsonl", "org/dataset"]


def test_names_each_changed_field_by_category_name(tmp_path: Path) -> None:
    before = fingerprinted(load_config(_project(tmp_path / "a")), "m")
    edited = TOML.replace("max_tokens = 64", "max_tokens = 65").replace('"chat.jsonl"', '"./chat.jsonl"')
    after = fingerprinted(load_config(_project(tmp_path / "b", edited)), "m2")
    assert describe_changes(before, after) == [
        "model: 'm' -> 'm2'",
        "categories[chat].source: 'chat.jsonl' -> './chat.jsonl'",
        "categories[chat].generation.max_tokens: 64 -> 65",
    ]


def test_added_removed_and_reordered_categories() -> None:
    two = {"categories": [{"name": "a", "x": 1}, {"name": "b", "x": 2}]}
    assert describe_changes(two, {"categories": [{"name": "b", "x": 2}, {"name": "a", "x": 1}]}) == [
        "categories: order ['a', 'b'] -> ['b', 'a']"
    ]
    assert describe_changes(two, {"categories": [{"name": "a", "x": 1}, {"name": "c", "x": 2}]}) == [
        "categories[b]: removed",
        "categories[c]: added",
    ]


def test_long_values_are_shortened_and_many_changes_capped() -> None:
    lines = describe_changes({f"k{i}": i for i in range(9)}, {f"k{i}": i + 1 for i in range(9)})
    assert len(lines) == 7 and lines[-1] == "... and 3 more"
    [line] = describe_changes({"system_prompt": "x" * 500}, {"system_prompt": "y"})
    assert len(line) < 100 and line.endswith("-> 'y'")


def test_store_refusal_names_the_change_and_an_old_manifest_refuses_by_hash(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.open_run("fp1", {}, fingerprinted={"model": "m", "categories": []})
    with pytest.raises(FingerprintMismatch, match=r"now fp2\): model: 'm' -> 'n'\. Use a new run name"):
        store.open_run("fp2", {}, fingerprinted={"model": "n", "categories": []})
    old = RunStore(tmp_path / "old")
    old.open_run("fp1", {})  # a manifest written before what the fingerprint hashed was kept
    with pytest.raises(FingerprintMismatch, match=r"now fp2\)\. Use a new run name"):
        old.open_run("fp2", {}, fingerprinted={"model": "n", "categories": []})


def test_a_run_started_with_the_earlier_hash_resumes_and_carries_the_new_one(tmp_path: Path) -> None:
    RunStore(tmp_path / "run").open_run("absolute", {})
    store = RunStore(tmp_path / "run")
    assert store.open_run("written", {}, earlier=["absolute"]) is True
    manifest = store.read_manifest()
    assert manifest is not None and manifest["fingerprint"] == "written"
    with pytest.raises(FingerprintMismatch):
        store.open_run("other", {}, earlier=["absolute"])
