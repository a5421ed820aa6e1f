"""`datagen prompts preview`: the real stream's counts, examples and lengths over a capped read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import prompts as prompts_cli
from flows.config import CategoryConfig, ConfigError
from flows.report import preview as preview_module
from flows.report.preview import (
    EXAMPLE_CHARS,
    Measure,
    build_preview,
    capped_rows,
    find_category,
    length_stats,
    load_measure,
    prompt_text,
)
from prompts.categories import BUNDLED
from prompts.records import PromptRecord, SourceRef

CHAT = CategoryConfig(name="chat", source="unused.jsonl", format="messages")


def _row(i: int, question: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": f"r{i}", "messages": [{"role": "user", "content": question or f"question {i}"}], **extra}


def _opener(rows: list[dict[str, Any]]) -> Any:
    """A re-openable row source that counts how often it was opened."""
    opened: list[int] = []

    def open_rows() -> Any:
        opened.append(1)
        return iter(list(enumerate(rows)))

    open_rows.opened = opened  # type: ignore[attr-defined]
    return open_rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- the report -----------------------------------------------------------------------------------


def test_steps_rejects_examples_and_lengths_come_from_the_stream() -> None:
    rows = [
        _row(0, "ab"),
        _row(1, "abcd"),
        {"id": "bad", "messages": [{"role": "assistant", "content": "no question"}]},
        _row(3, "ab"),  # same question as row 0: a duplicate
        _row(4, "x" * 500),
    ]
    report = build_preview(CHAT, _opener(rows), rows_cap=100, examples=2)
    assert report.steps == [
        ("read", 5),
        ("after filters", 5),
        ("converted", 4),
        ("after quota", 4),
        ("after dedup", 3),
        ("to ask (not done yet)", 3),
    ]
    assert report.rejected == {"no user turn": 1}
    assert report.filtered == {}
    assert [(e.id, e.row) for e in report.examples] == [("r0", 0), ("r1", 1)]
    assert [(m.role, m.text) for m in report.examples[0].messages] == [("user", "ab")]
    stats = report.lengths
    assert stats is not None
    assert (stats.unit, stats.count, stats.min, stats.median, stats.p90, stats.p99, stats.max) == (
        "characters",
        3,
        2,
        4,
        500,
        500,
        500,
    )
    assert report.notes == []
    assert report.settings["source"] == "unused.jsonl" and report.settings["mode"] == "first_turn"


def test_the_preview_counts_duplicates_with_the_key_a_new_run_uses() -> None:
    """Two programs that differ in indentation are two prompts (a new run asks both); a copy with
    CRLF line endings is a duplicate."""
    rows = [
        _row(0, "Fix this:\nif x:\n    a()\nb()"),
        _row(1, "Fix this:\nif x:\n    a()\n    b()"),
        _row(2, "Fix this:\r\nif x:\r\n    a()\r\nb()"),
    ]
    report = build_preview(CHAT, _opener(rows), rows_cap=100)
    assert dict(report.steps)["after dedup"] == 2
    assert [e.id for e in report.examples] == ["r0", "r1"]


def test_filtered_rows_are_counted_by_reason(fixtures_dir: Path) -> None:
    category = CategoryConfig(
        name="oci",
        source=str(fixtures_dir / "prompts" / "opencodeinstruct.jsonl"),
        format="opencodeinstruct",
        filters={"domains": ["generic"]},
    )
    report = build_preview(category, capped_rows(category, 100), rows_cap=100, examples=0)
    assert report.filtered == {"domain 'algorithmic' not allowed": 2}
    assert report.steps[:2] == [("read", 6), ("after filters", 4)]
    assert report.examples == []
    assert report.settings["filters"] == {"domains": ["generic"]}


def test_rows_left_after_each_filter_in_the_order_they_are_checked(fixtures_dir: Path) -> None:
    """domain keeps 4 of 6; of those, one generic row has a failing test: 3 left after the tests."""
    category = CategoryConfig(
        name="oci",
        source=str(fixtures_dir / "prompts" / "opencodeinstruct.jsonl"),
        format="opencodeinstruct",
        filters={"domains": ["generic"], "require_all_tests_pass": True},
    )
    report = build_preview(category, capped_rows(category, 100), rows_cap=100, examples=0)
    assert report.filter_steps == [("domain", 4), ("tests_execution_status", 3)]
    assert report.steps[:2] == [("read", 6), ("after filters", 3)]


def test_examples_are_cut_and_name_tools_and_calls() -> None:
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    call = {"id": "c0", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    row = {
        "id": "t0",
        "tools": [tool],
        "messages": [
            {"role": "user", "content": "y" * (EXAMPLE_CHARS + 50)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "12:00"},
            {"role": "user", "content": "thanks"},
        ],
    }
    category = CHAT.model_copy(update={"mode": "tool_replay"})
    (item,) = build_preview(category, _opener([row]), rows_cap=10).examples
    assert item.tools == ["get_time"]
    assert [(m.role, m.text) for m in item.messages] == [
        ("user", "y" * EXAMPLE_CHARS + "…"),
        ("assistant", "[calls: get_time]"),
        ("tool", "12:00"),
        ("user", "thanks"),
    ]


def test_prompt_length_is_the_first_request_and_its_tools() -> None:
    rows = [
        {
            "id": "a",
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello there"},
                {"role": "user", "content": "later turn"},
            ],
        }
    ]
    report = build_preview(CHAT, _opener(rows), rows_cap=10)
    (item,) = report.examples
    tools_json = json.dumps([{"type": "function", "function": {"name": "f"}}])
    assert report.lengths is not None and report.lengths.max == len("sys\nhi\n" + tools_json)
    assert item.messages[0].role == "system"


def test_a_count_quota_reopens_the_same_capped_rows(tmp_path: Path) -> None:
    source = _write_jsonl(tmp_path / "chat.jsonl", [_row(i) for i in range(50)])
    category = CategoryConfig.model_validate(
        {"name": "q", "source": str(source), "format": "messages", "quota": {"count": 5, "seed": 3}}
    )
    report = build_preview(category, capped_rows(category, 20), rows_cap=20, examples=10)
    assert report.steps[0] == ("read", 20)
    assert dict(report.steps)["after quota"] == 5
    assert all(e.row < 20 for e in report.examples) and len(report.examples) == 5
    assert report.settings["quota"] == {"count": 5, "seed": 3}
    assert report.notes == ["stopped after 20 rows (--rows): counts, quota and dedup cover these rows only"]


def test_count_quota_opens_the_source_twice() -> None:
    category = CategoryConfig.model_validate({**CHAT.model_dump(), "quota": {"count": 2}})
    opener = _opener([_row(i) for i in range(6)])
    report = build_preview(category, opener, rows_cap=100)
    assert len(opener.opened) == 2
    assert report.lengths is not None and report.lengths.count == 2


def test_the_limit_note_and_no_lengths_when_nothing_is_taken() -> None:
    limited = CHAT.model_copy(update={"limit": 2})
    report = build_preview(limited, _opener([_row(i) for i in range(5)]), rows_cap=100)
    assert report.notes == ["the category's limit (2 prompts) was reached"]
    empty = build_preview(CHAT, _opener([]), rows_cap=100)
    assert empty.lengths is None and empty.steps[0] == ("read", 0)


def test_length_stats_use_nearest_rank_percentiles() -> None:
    stats = length_stats(range(1, 101), "tokens")
    assert stats is not None
    assert (stats.count, stats.min, stats.median, stats.p90, stats.p99, stats.max) == (
        100,
        1,
        50.5,
        90,
        99,
        100,
    )
    assert length_stats([], "tokens") is None
    single = length_stats([7], "characters")
    assert single is not None and (single.median, single.p90, single.p99) == (7, 7, 7)


def test_a_tokenizer_measure_counts_tokens_and_names_the_unit() -> None:
    words = Measure("tokens", lambda text: len(text.split()), "tokenizer: words")
    report = build_preview(CHAT, _opener([_row(0, "one two three")]), rows_cap=10, measure=words)
    assert report.lengths is not None and (report.lengths.unit, report.lengths.max) == ("tokens", 3)
    assert report.length_unit == "tokens" and report.notes == ["tokenizer: words"]


def test_prompt_text_joins_the_first_request_and_skips_absent_tools() -> None:
    record = PromptRecord(
        id="p",
        category="chat",
        source=SourceRef("d", "train", 0),
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    )
    assert prompt_text(record) == "q"


# --- tokenizer loading ----------------------------------------------------------------------------


@pytest.fixture
def word_tokenizer(tmp_path: Path) -> Path:
    """A tokenizer.json saved in a folder of its own: a word-level tokenizer built here (one token per
    word or punctuation run, ``[UNK]`` for a word it does not know), so nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return path


def test_no_tokenizer_means_characters_without_a_note() -> None:
    measure = load_measure(None)
    assert (measure.unit, measure.count("abc"), measure.note) == ("characters", 3, None)


def test_a_tokenizer_file_or_folder_gives_token_counts(word_tokenizer: Path) -> None:
    """`tokenizers` was no dependency: every --tokenizer fell back to characters ("the `tokenizers`
    package is not installed")."""
    for given in (str(word_tokenizer), str(word_tokenizer.parent)):
        measure = load_measure(given)
        assert (measure.unit, measure.count("hello world, again")) == ("tokens", 4)
        assert measure.note == f"tokenizer: {given}"


def test_a_missing_tokenizer_path_falls_back_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    measure = load_measure(str(missing))
    assert measure.unit == "characters"
    assert measure.note == f"could not load tokenizer {str(missing)!r} (no tokenizer file at {missing}): " + (
        "lengths in characters"
    )


def test_a_file_that_is_no_tokenizer_falls_back_with_the_reason(tmp_path: Path) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    measure = load_measure(str(broken))
    assert (measure.unit, measure.count("hello world")) == ("characters", 11)
    assert (measure.note or "").startswith(f"could not load tokenizer {str(broken)!r} (")
    assert (measure.note or "").endswith("): lengths in characters")


@pytest.fixture
def hub_cache(word_tokenizer: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A Hugging Face cache as a download leaves it (refs/main naming a snapshot) holding the word
    tokenizer as ``org/tiny``, read by the real huggingface_hub."""
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "tokenizer.json").write_bytes(word_tokenizer.read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """A machine whose network drops every packet: each connection waits out its timeout, then
    fails. Returns the timeouts of the connections tried (none is made)."""
    import socket
    import time

    tried: list[float | None] = []

    def unreachable(address: Any, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
        tried.append(timeout)
        time.sleep(timeout or 0)
        raise TimeoutError(f"connecting to {address[0]} timed out")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tried


def test_a_hub_id_in_the_local_cache_counts_tokens_offline(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HF_HUB_OFFLINE: an id in the cache counts tokens, one that is not says why."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = load_measure("org/tiny")
    assert (cached.unit, cached.count("hello world, again"), cached.note) == (
        "tokens",
        4,
        "tokenizer: org/tiny",
    )
    absent = load_measure("org/absent")
    assert absent.unit == "characters"
    assert (absent.note or "").startswith("could not load tokenizer 'org/absent' (")


def test_a_cached_hub_tokenizer_is_used_without_asking_the_hub(
    hub_cache: Path, no_network: list[float | None]
) -> None:
    """Without HF_HUB_OFFLINE, huggingface_hub asks the Hub before its cache: on a machine without
    internet a preview waited for the network's timeout before counting with the cached tokenizer."""
    cached = load_measure("org/tiny")
    assert (cached.unit, cached.count("hello world, again")) == ("tokens", 4)
    assert no_network == []


def test_a_hub_tokenizer_not_cached_is_asked_for_once_with_a_short_timeout(
    hub_cache: Path, no_network: list[float | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not in the cache: the Hub is asked once, for at most ``HUB_TIMEOUT_S`` (huggingface_hub's own
    download waited 10 s, then retried a minute at a time), and the preview counts characters with
    one line saying why; with HF_HUB_OFFLINE the Hub is not asked at all."""
    monkeypatch.setattr(preview_module, "HUB_TIMEOUT_S", 0.2)
    absent = load_measure("org/absent")
    assert absent.unit == "characters" and no_network == [0.2]
    note = absent.note or ""
    assert note.startswith("could not load tokenizer 'org/absent' (not in the Hugging Face cache, and not")
    assert "timed out" in note and "\n" not in note and note.endswith("): lengths in characters")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = load_measure("org/absent")
    assert offline.unit == "characters" and "HF_HUB_OFFLINE" in (offline.note or "")
    assert no_network == [0.2]


def test_a_hub_tokenizer_not_cached_is_downloaded(
    word_tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine that reaches the Hub: the cache is looked at first, then the file downloaded."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    asked: list[str] = []

    def download(repo_id: str, filename: str, *, local_files_only: bool = False, **kwargs: Any) -> str:
        asked.append("cache" if local_files_only else "download")
        if local_files_only:
            raise LocalEntryNotFoundError("not in the local cache")
        return str(word_tokenizer)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kwargs: asked.append(url))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    online = load_measure("org/model")
    assert (online.unit, online.count("hello world")) == ("tokens", 2)
    assert asked == ["cache", huggingface_hub.hf_hub_url("org/model", "tokenizer.json"), "download"]


# --- finding the category -------------------------------------------------------------------------


def _run_config(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        "[run]\nname = 't'\n[[endpoints]]\nurl = 'http://127.0.0.1:9'\n"
        f"[[categories]]\nname = 'mine'\nsource = '{source}'\nformat = 'messages'\n",
        encoding="utf-8",
    )
    return path


def test_a_bundled_category_is_found_by_name_with_its_source_resolved() -> None:
    category = find_category("sample_ultrachat")
    assert category.format == "messages"
    assert Path(category.source) == (BUNDLED.parent / "samples" / "ultrachat_sample.jsonl").resolve()


def test_an_unknown_category_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no category named 'nope'; known: B1_glaive, .*sample_ultrachat"):
        find_category("nope")
    config = _run_config(tmp_path, "data.jsonl")
    with pytest.raises(ConfigError, match=r"has no category 'other'; its categories: mine$"):
        find_category("other", config)
    assert find_category("mine", config).source == "data.jsonl"


def test_a_broken_category_file_is_a_config_error_naming_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.toml"
    monkeypatch.setattr("flows.report.preview.category_file", lambda name: broken)
    broken.write_text("name = ", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{broken}: not valid TOML"):
        find_category("broken")
    broken.write_text("source = 'x.jsonl'\nformat = 'nope'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{broken}: broken: format 'nope' is unknown; known: "):
        find_category("broken")


# --- the command ----------------------------------------------------------------------------------


def _cli() -> typer.Typer:
    root = typer.Typer()

    @root.callback()
    def main() -> None:
        """The lead mounts the sub-app the same way."""

    root.add_typer(prompts_cli.app)
    return root


def test_preview_json_is_the_report(fixtures_dir: Path, tmp_path: Path) -> None:
    config = _run_config(tmp_path, str(fixtures_dir / "prompts" / "ultrachat.jsonl"))
    result = CliRunner().invoke(
        _cli(), ["prompts", "preview", "mine", "--config", str(config), "-n", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["category"] == "mine"
    assert document["steps"][0] == ["read", 6]
    assert document["length_unit"] == "characters"
    assert document["lengths"]["count"] == 6 and document["lengths"]["max"] == 18996
    assert [e["id"] for e in document["examples"]] == [
        "71c49bf5cd0db36d29835440fa10f15c30bbc51daf323acd8f836e820720143b"
    ]


def test_preview_counts_tokens_with_a_tokenizer_file(
    fixtures_dir: Path, tmp_path: Path, word_tokenizer: Path
) -> None:
    config = _run_config(tmp_path, str(fixtures_dir / "prompts" / "ultrachat.jsonl"))
    args = ["prompts", "preview", "mine", "--config", str(config), "-n", "0", "--json"]
    result = CliRunner().invoke(_cli(), [*args, "--tokenizer", str(word_tokenizer)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["length_unit"] == "tokens" and f"tokenizer: {word_tokenizer}" in document["notes"]
    assert 0 < document["lengths"]["max"] < 18996  # fewer tokens than the longest prompt's characters


def test_preview_of_a_bundled_category() -> None:
    result = CliRunner().invoke(_cli(), ["prompts", "preview", "sample_ultrachat", "-n", "0", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["settings"]["format"] == "messages"
    assert document["steps"][0] == ["read", 50] and document["examples"] == []


def _flat(text: str) -> str:
    """Without whitespace: rich wraps (and may fold) long lines at the console width."""
    return "".join(text.split())


def test_preview_renders_tables_on_the_console(fixtures_dir: Path, tmp_path: Path) -> None:
    config = _run_config(tmp_path, str(fixtures_dir / "prompts" / "ultrachat.jsonl"))
    result = CliRunner().invoke(
        _cli(), ["prompts", "preview", "mine", "--config", str(config), "--rows", "2"]
    )
    assert result.exit_code == 0, result.output
    for expected in (
        "rows left after each step (at most 2 rows read)",
        "filtered by reason",
        "rejected by reason",
        "example 2: aba7c4dd",
        "prompt length of the first request, in characters",
        "note: stopped after 2 rows",
    ):
        assert _flat(expected) in _flat(result.output)


def test_preview_exits_2_for_an_unknown_category_or_an_unreadable_source(tmp_path: Path) -> None:
    unknown = CliRunner().invoke(_cli(), ["prompts", "preview", "nope"])
    assert unknown.exit_code == 2 and "known: B1_glaive" in unknown.output
    config = _run_config(tmp_path, str(tmp_path / "missing.jsonl"))
    missing = CliRunner().invoke(_cli(), ["prompts", "preview", "mine", "--config", str(config)])
    assert missing.exit_code == 2
    expected = (
        f"error: cannot read the source of mine: {tmp_path / 'missing.jsonl'}: no such file or directory"
    )
    assert _flat(missing.output) == _flat(expected)
    bad_json = tmp_path / "broken.json"
    bad_json.write_text("[{", encoding="utf-8")
    broken = CliRunner().invoke(
        _cli(), ["prompts", "preview", "mine", "--config", str(_run_config(tmp_path, str(bad_json)))]
    )
    assert broken.exit_code == 2
    assert _flat(broken.output).startswith(
        _flat(f"error: cannot read the source of mine: {bad_json} Expecting")
    )


def test_a_category_a_run_would_stop_for_rejects_says_so() -> None:
    category = CategoryConfig(name="sg", source="unused.jsonl", format="sharegpt")
    rows = [{"id": f"r{i}", "dialogue": [{"role": "user", "content": f"q{i}"}]} for i in range(1200)]
    report = build_preview(category, _opener(rows), rows_cap=2000, examples=0)
    assert report.rejected == {"no conversations list": 1000}
    assert report.notes == [
        "a run would stop this category: 1000 of the first 1000 rows failed conversion as format 'sharegpt' "
        "(first reasons: no conversations list (1000)); check the category's `format` and `columns` "
        "(`datagen prompts preview sg` shows a few rows)"
    ]
    mapped = category.model_copy(update={"columns": {"conversations": "dialogue"}})
    assert build_preview(mapped, _opener(rows), rows_cap=2000, examples=0).steps[2] == ("converted", 1200)
