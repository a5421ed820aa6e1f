from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

import flows.report.export as export_module
from flows.cli.export import export, summary_lines
from flows.report.export import (
    ExportError,
    ExportFormat,
    Reasoning,
    Selection,
    export_hf,
    export_specforge,
    push_export,
    specforge_message,
    specforge_record,
)
from flows.report.trainer_templates import SystemPromptCheck, template_warning, unchecked_hint
from flows.store.run_store import RunStore
from flows.store.schema import ROW_FEATURES
from flows.store.shard_schema import normalize_message

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
TOOLS_JSON = json.dumps(TOOLS)
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def _row(
    rid: str, category: str, messages: list[dict[str, Any]], flags: list[str] | None = None, **extra: Any
):
    return {
        "id": rid,
        "category": category,
        "prompt_hash": f"p-{rid}",
        "source": {"dataset": "d", "split": "train", "row": 0},
        "messages": [normalize_message(m) for m in messages],
        "tools": extra.get("tools"),
        "finish_reason": "length" if flags and "truncated" in flags else "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "reasoning_tokens": 0, "cached_tokens": 0},
        "model": "m",
        "sampling": "{}",
        "endpoint": "http://127.0.0.1:1",
        "latency_s": 0.5,
        "ttft_s": 0.1,
        "attempts": 1,
        "requests": 1,
        "created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "flags": flags or [],
    }


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str | None, reasoning: str | None = None, calls: list | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "reasoning_content": reasoning, "tool_calls": calls}


CHAT_ROWS = [
    _row(
        "a1", "chat", [{"role": "system", "content": "be brief"}, _user("hi"), _assistant("hello", "greet")]
    ),
    _row("a2", "chat", [_user("2+2?"), _assistant("4", "\nadd\n")]),
    _row("a3", "chat", [_user("long"), _assistant("cut", "...")], flags=["truncated"]),
]
TOOL_ROWS = [
    _row(
        "t1",
        "tools",
        [
            _user("weather in Paris?"),
            _assistant(None, "need the tool", [CALL]),
            {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1", "name": "get_weather"},
            _assistant("20 C"),
        ],
        tools=TOOLS_JSON,
    ),
    _row("t2", "tools", [_user("x")], flags=["empty", "truncated"], tools=TOOLS_JSON),
]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Two categories, several shards each (flush every 2 rows), one reject-only category."""
    store = RunStore(tmp_path / "run")
    store.open_run("fp", {})
    for category, rows in (("chat", CHAT_ROWS), ("tools", TOOL_ROWS)):
        writer = store.row_writer(category, flush_rows=2, flush_seconds=1e9)
        for row in rows:
            writer.add(row)
            if writer.due():
                writer.flush()
        writer.flush()
    Path(store.rejects_dir("rejected_only")).mkdir(parents=True)
    assert len(store.shard_files(store.data_dir("chat"))) == 2
    return tmp_path / "run"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _tmp_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def _sf(role: str, content: str, **keys: Any) -> dict[str, Any]:
    """An exported message: every key on every message ("" / [] when empty), reasoning as a field."""
    return {
        "role": role,
        "content": content,
        "reasoning_content": keys.get("reasoning_content", ""),
        "tool_calls": keys.get("tool_calls", []),
        "tool_call_id": keys.get("tool_call_id", ""),
        "name": keys.get("name", ""),
    }


EXPECTED_T1 = {
    "id": "t1",
    "conversations": [
        _sf("user", "weather in Paris?"),
        _sf("assistant", "", reasoning_content="need the tool", tool_calls=[CALL]),
        _sf("tool", '{"temp": 20}', tool_call_id="call_1", name="get_weather"),
        _sf("assistant", "20 C"),
    ],
    "tools": TOOLS_JSON,
}


def test_specforge_default_writes_training_rows_with_reasoning_field(run_dir: Path) -> None:
    result = export_specforge(run_dir)

    assert result.path == run_dir / "exports" / "specforge.jsonl"
    assert _lines(result.path) == [
        {
            "id": "a1",
            "conversations": [
                _sf("system", "be brief"),
                _sf("user", "hi"),
                _sf("assistant", "hello", reasoning_content="greet"),
            ],
            "tools": "[]",
        },
        {
            "id": "a2",
            "conversations": [_sf("user", "2+2?"), _sf("assistant", "4", reasoning_content="\nadd\n")],
            "tools": "[]",
        },
        EXPECTED_T1,
    ]
    assert result.categories == ["chat", "rejected_only", "tools"]
    assert dict(result.tally.rows_by_category) == {"chat": 2, "tools": 1}
    assert result.tally.left_out_rows == 2
    assert dict(result.tally.left_out_by_flag) == {"truncated": 2, "empty": 1}
    assert _tmp_leftovers(result.path.parent) == []


def test_specforge_line_is_plain_json_with_unicode_kept(run_dir: Path) -> None:
    path = export_specforge(run_dir, selection=Selection(categories=("chat",))).path
    first = path.read_text(encoding="utf-8").splitlines()[0]
    empty = '"tool_calls": [], "tool_call_id": "", "name": ""'
    assert first == (
        '{"id": "a1", "conversations": [{"role": "system", "content": "be brief", "reasoning_content": "", '
        f'{empty}}}, {{"role": "user", "content": "hi", "reasoning_content": "", {empty}}}, '
        f'{{"role": "assistant", "content": "hello", "reasoning_content": "greet", {empty}}}], '
        '"tools": "[]"}'
    )


def test_reasoning_inline_and_drop() -> None:
    message = normalize_message(_assistant("\n4", "\nadd\n"))
    no_reasoning = {"tool_calls": [], "tool_call_id": "", "name": ""}
    assert specforge_message(message, Reasoning.INLINE) == {
        "role": "assistant",
        "content": "<think>\nadd\n</think>\n\n4",
        **no_reasoning,
    }
    dropped = {"role": "assistant", "content": "\n4", **no_reasoning}
    assert specforge_message(message, Reasoning.DROP) == dropped
    plain = normalize_message(_assistant("4"))
    assert specforge_message(plain, Reasoning.INLINE) == {"role": "assistant", "content": "4", **no_reasoning}


def test_reasoning_inline_in_export(run_dir: Path) -> None:
    path = export_specforge(
        run_dir, selection=Selection(categories=("tools",)), reasoning=Reasoning.INLINE
    ).path
    (line,) = _lines(path)
    assert line["conversations"][1] == {
        "role": "assistant",
        "content": "<think>\nneed the tool\n</think>\n\n",
        "tool_calls": [CALL],
        "tool_call_id": "",
        "name": "",
    }


def test_tool_call_without_id_gets_an_empty_string_id() -> None:
    message = normalize_message(_assistant(None, calls=[{"function": {"name": "f", "arguments": "{}"}}]))
    call = {"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert specforge_message(message, Reasoning.FIELD) == _sf("assistant", "", tool_calls=[call])


def test_include_flagged_and_category_selection(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere" / "all.jsonl"
    result = export_specforge(run_dir, out, Selection(categories=("tools",), include_flagged=True))

    assert result.path == out
    assert [line["id"] for line in _lines(out)] == ["t1", "t2"]
    assert _lines(out)[1] == {
        "id": "t2",
        "conversations": [_sf("user", "x")],
        "tools": TOOLS_JSON,
    }
    assert result.tally.left_out_rows == 0
    assert result.categories == ["tools"]


def test_unknown_category_and_missing_run_are_errors(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"unknown categories \['nope'\]"):
        export_specforge(run_dir, selection=Selection(categories=("chat", "nope")))
    with pytest.raises(ExportError, match="not a run directory"):
        export_specforge(tmp_path / "missing")


def test_repeated_id_in_a_category_is_exported_once(run_dir: Path) -> None:
    store = RunStore(run_dir)
    writer = store.row_writer("chat", flush_rows=10, flush_seconds=1e9)
    writer.add(_row("a1", "chat", [_user("again"), _assistant("dup")]))
    writer.flush()

    result = export_specforge(run_dir, selection=Selection(categories=("chat",)))

    assert [line["id"] for line in _lines(result.path)] == ["a1", "a2"]
    assert _lines(result.path)[0]["conversations"][1] == _sf("user", "hi")
    assert result.tally.duplicates == 1


def _fail_on_second_row(monkeypatch: pytest.MonkeyPatch) -> None:
    real = export_module.specforge_record
    seen: list[str] = []

    def failing(row: dict[str, Any], reasoning: Reasoning) -> dict[str, Any]:
        seen.append(row["id"])
        if len(seen) == 2:
            raise RuntimeError("disk on fire")
        return real(row, reasoning)

    monkeypatch.setattr(export_module, "specforge_record", failing)


def test_failure_mid_write_leaves_no_file(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_on_second_row(monkeypatch)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_specforge(run_dir)

    exports = run_dir / "exports"
    assert sorted(p.name for p in exports.iterdir()) == []


def test_failure_mid_write_keeps_the_previous_export(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = export_specforge(run_dir).path
    before = path.read_bytes()
    _fail_on_second_row(monkeypatch)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_specforge(run_dir, selection=Selection(include_flagged=True))

    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["specforge.jsonl"]


def test_hf_save_to_disk_round_trip(run_dir: Path) -> None:
    result = export_hf(run_dir)

    assert result.path == run_dir / "exports" / "hf"
    loaded = datasets.load_from_disk(str(result.path))
    assert loaded.features == ROW_FEATURES
    assert loaded["id"] == ["a1", "a2", "t1"]
    assert loaded[2]["messages"] == [normalize_message(m) for m in TOOL_ROWS[0]["messages"]]
    assert loaded[0]["created_at"] == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert dict(result.tally.left_out_by_flag) == {"truncated": 2, "empty": 1}
    assert _tmp_leftovers(result.path.parent) == []


def test_hf_include_flagged_replaces_previous_export(run_dir: Path) -> None:
    export_hf(run_dir)
    path = export_hf(run_dir, selection=Selection(categories=("tools",), include_flagged=True)).path

    loaded = datasets.load_from_disk(str(path))
    assert loaded["id"] == ["t1", "t2"]
    assert loaded["flags"] == [[], ["empty", "truncated"]]
    assert _tmp_leftovers(path.parent) == []


def test_hf_empty_selection_still_has_the_features(run_dir: Path) -> None:
    path = export_hf(run_dir, selection=Selection(categories=("rejected_only",))).path
    loaded = datasets.load_from_disk(str(path))
    assert len(loaded) == 0
    assert loaded.features == ROW_FEATURES


def test_hf_failure_keeps_old_export(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = export_hf(run_dir).path

    def broken(self: datasets.Dataset, *args: Any, **kwargs: Any) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", broken)
    with pytest.raises(OSError, match="no space left"):
        export_hf(run_dir, selection=Selection(categories=("tools",)))

    assert datasets.load_from_disk(str(path))["id"] == ["a1", "a2", "t1"]
    assert _tmp_leftovers(path.parent) == []


PushCall = tuple[list[str], tuple[Any, ...], dict[str, Any]]


def _record_pushes(monkeypatch: pytest.MonkeyPatch) -> list[PushCall]:
    """Replace ``Dataset.push_to_hub`` (no network): each call records the rows and the arguments."""
    calls: list[PushCall] = []

    def fake(self: datasets.Dataset, *args: Any, **kwargs: Any) -> None:
        calls.append((self["id"], args, kwargs))

    monkeypatch.setattr(datasets.Dataset, "push_to_hub", fake)
    return calls


def test_push_export_pushes_the_saved_dataset_without_a_token(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes = _record_pushes(monkeypatch)
    path = export_hf(run_dir).path

    push_export(path, "org/drafter-data", private=True)
    push_export(path, "org/public-data")

    assert pushes == [
        (["a1", "a2", "t1"], ("org/drafter-data",), {"private": True}),
        (["a1", "a2", "t1"], ("org/public-data",), {"private": None}),
    ]


def test_summary_lines(run_dir: Path) -> None:
    result = export_specforge(run_dir)
    assert summary_lines(result) == [
        "Exported 3 rows (chat 2, rejected_only 0, tools 1) as specforge",
        "Left out 2 flagged rows (empty 1, truncated 2); --include-flagged keeps them",
        f"Path: {result.path}",
        "2 of 3 rows have no system prompt; SpecForge templates such as qwen3-thinking add one in "
        "training: pass --trainer-template NAME to check against yours",
        f"Train on it with SpecForge: data.train_data_path: {result.path} in the run config "
        f"(older scripts/train_eagle3.py: --train-data-path {result.path})",
        "3 of 3 rows carry reasoning in `reasoning_content`: use a thinking chat template (parser_type "
        "thinking, e.g. qwen3-thinking, kimi-k2-thinking), or export with --reasoning inline for a general "
        "one.",
    ]
    hf = export_hf(run_dir, selection=Selection(categories=("chat",), include_flagged=True))
    assert summary_lines(hf) == [
        "Exported 3 rows (chat 3) as hf",
        f"Path: {hf.path}",
        f'Load it: datasets.load_from_disk("{hf.path}")',
    ]


def test_the_reasoning_advice_comes_only_for_rows_with_reasoning_and_no_template_chosen(
    tmp_path: Path, run_dir: Path
) -> None:
    """It was printed for every SpecForge export: a non-thinking model's rows were steered to a
    thinking template, and so was a user who had named the trainer's template already."""
    store = RunStore(tmp_path / "plain")
    store.open_run("fp", {})
    store.row_writer("chat", flush_rows=10, flush_seconds=1e9).write(
        [_row("p1", "chat", [_user("hi"), _assistant("hello")])]
    )
    plain = summary_lines(export_specforge(tmp_path / "plain"))
    chosen = summary_lines(export_specforge(run_dir, trainer_template="qwen3-instruct"))
    assert not any("`reasoning_content`" in line for line in plain + chosen)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "qwen3-thinking",
            "Warning: 2 of 3 rows (chat 1, tools 1) were generated without a system prompt, but SpecForge's "
            "'qwen3-thinking' template adds 'You are a helpful assistant.' to them: the drafter would train "
            "on a context the target never saw. Regenerate those categories with system_prompt set to that "
            "text, or train with a template without a default system prompt.",
        ),
        ("deepseek-r1-distill", None),
    ],
)
def test_summary_warns_when_the_trainer_template_adds_a_system_prompt(
    run_dir: Path, template: str, expected: str | None
) -> None:
    lines = summary_lines(export_specforge(run_dir, trainer_template=template))
    warnings = [line for line in lines if "system prompt" in line]
    assert warnings == ([expected] if expected else [])


def test_template_check_is_quiet_when_every_row_has_a_system_prompt_and_names_unknown_templates() -> None:
    assert template_warning("qwen3-thinking", SystemPromptCheck({"chat": 0}, 5)) is None
    assert unchecked_hint(SystemPromptCheck({}, 5)) is None
    unknown = template_warning("my-template", SystemPromptCheck({"chat": 1}, 5))
    assert unknown is not None and unknown.startswith("Warning: unknown SpecForge template 'my-template'")


@pytest.mark.parametrize("template", ["ling-3.0", "ling-3.0-thinking", "glm-5.3", "deepseek-v4"])
def test_specforges_newer_templates_are_known_and_add_no_system_prompt(template: str) -> None:
    """Registered in SpecForge's specforge/data/template.py (031c0d6) with system_prompt=None."""
    assert template_warning(template, SystemPromptCheck({"chat": 3}, 5)) is None


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(export)
    return app


def test_cli_specforge_with_options(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sf.jsonl"
    args = [str(run_dir), "--format", "specforge", "--out", str(out), "--categories", "chat, tools"]
    result = CliRunner().invoke(_cli(), [*args, "--include-flagged", "--reasoning", "drop"])

    assert result.exit_code == 0, result.output
    assert [line["id"] for line in _lines(out)] == ["a1", "a2", "a3", "t1", "t2"]
    dropped = _sf("assistant", "hello")
    del dropped["reasoning_content"]
    assert _lines(out)[0]["conversations"][2] == dropped
    assert "Exported 5 rows (chat 3, tools 2) as specforge" in result.output


def test_cli_hf_push(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pushes = _record_pushes(monkeypatch)
    args = [str(run_dir), "--format", "hf", "--push-to-hub", "org/d", "--private"]
    result = CliRunner().invoke(_cli(), args)

    assert result.exit_code == 0, result.output
    assert pushes == [(["a1", "a2", "t1"], ("org/d",), {"private": True})]
    assert "Pushed to https://huggingface.co/datasets/org/d" in result.output


def test_cli_push_failure_is_one_line_and_keeps_the_export(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: datasets.Dataset, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("401 [unauthorized]")

    monkeypatch.setattr(datasets.Dataset, "push_to_hub", refuse)
    result = CliRunner().invoke(_cli(), [str(run_dir), "--format", "hf", "--push-to-hub", "org/d"])

    assert result.exit_code == 3
    assert "PermissionError: 401 [unauthorized]" in result.output
    assert (run_dir / "exports" / "hf" / "dataset_info.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "specforge", "--push-to-hub", "org/d"], "use it with --format hf"),
        (["--format", "hf", "--reasoning", "inline"], "--trainer-template apply to --format specforge"),
        (["--format", "hf", "--trainer-template", "qwen"], "--trainer-template apply to --format specforge"),
        (["--format", "specforge", "--categories", "nope"], "unknown categories"),
    ],
)
def test_cli_refuses_bad_combinations(run_dir: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(_cli(), [str(run_dir), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert not (run_dir / "exports" / "specforge.jsonl").exists()


def test_format_names_are_the_cli_choices() -> None:
    assert [f.value for f in ExportFormat] == ["specforge", "hf"]
    assert [r.value for r in Reasoning] == ["field", "inline", "drop"]


def test_batches_smaller_than_a_shard_give_the_same_export(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = export_specforge(run_dir).path.read_bytes()
    monkeypatch.setattr(export_module, "BATCH_ROWS", 1)
    assert export_specforge(run_dir).path.read_bytes() == whole


def test_specforge_export_reads_back_with_specforges_json_loader(run_dir: Path, tmp_path: Path) -> None:
    """SpecForge reads ``load_dataset("json", ...)``: tools and tool-call arguments must stay strings."""
    path = export_specforge(run_dir).path
    loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))

    assert loaded["id"] == ["a1", "a2", "t1"]
    assert loaded["tools"] == ["[]", "[]", TOOLS_JSON]
    call = loaded[2]["conversations"][1]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"city": "Paris"}'


def _offline_lines(path: Path):  # type: ignore[no-untyped-def]
    """The rows as SpecForge's ``safe_conversations_generator`` yields them to ``Dataset.from_generator``
    in ``prepare_hidden_states.py``: list/dict message values dumped to JSON strings, ``tools`` kept."""
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        conversations = [
            {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in m.items()}
            for m in row["conversations"]
        ]
        yield {"conversations": conversations, **({"tools": row["tools"]} if "tools" in row else {})}


@pytest.mark.parametrize("plain_first", [True, False])
def test_mixed_rows_load_through_the_offline_generator_path(tmp_path: Path, plain_first: bool) -> None:
    """More plain rows than one Arrow writer batch (1,000), then tool rows, and the other way round:
    the schema fixed by the first batch must fit every later row, and ``tools`` must survive."""
    plain = [specforge_record(r, Reasoning.FIELD) for r in CHAT_ROWS[:2]] * 600
    tools = [specforge_record(TOOL_ROWS[0], Reasoning.FIELD)] * 3
    path = tmp_path / "mixed.jsonl"
    rows = plain + tools if plain_first else tools + plain
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    loaded = datasets.Dataset.from_generator(
        _offline_lines, gen_kwargs={"path": path}, cache_dir=str(tmp_path / "cache")
    )

    assert len(loaded) == 1203
    assert loaded.column_names == ["conversations", "tools"]
    tool_row, plain_row = (loaded[-1], loaded[0]) if plain_first else (loaded[0], loaded[-1])
    assert json.loads(tool_row["tools"]) == TOOLS
    assert json.loads(tool_row["conversations"][1]["tool_calls"]) == [CALL]
    assert json.loads(plain_row["tools"]) == []


LONG = "".join(chr(97 + (i * i * 7919 + i * 104729) % 26) for i in range(5000))
"""Text that compresses little, so a page of it is long enough to damage in its middle."""


def _one_row_shard(tmp_path: Path) -> tuple[RunStore, Path]:
    store = RunStore(tmp_path / "run")
    store.open_run("fp", {})
    writer = store.row_writer("c", flush_rows=10, flush_seconds=60)
    return store, Path(str(writer.write([_row("r1", "c", [_user(LONG), _assistant(LONG[::-1])])])))


def _flipped(path: Path, original: bytes, positions: range) -> None:
    """``original`` written to ``path`` with the bytes at ``positions`` (from the start of the
    messages' text page) flipped."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    column = next(
        meta.column(i)
        for i in range(meta.num_columns)
        if meta.column(i).path_in_schema == "messages.list.element.content"
    )
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data = bytearray(original)
    for position in positions:
        data[start + position] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_shard_with_a_damaged_answer_stops_the_export_and_is_quarantined_for_the_resume(
    tmp_path: Path,
) -> None:
    """The resume reads only the ids, which were whole: it kept counting the row done, and every
    export stopped on the shard with a remedy (rerun) that did nothing."""
    store, path = _one_row_shard(tmp_path)
    _flipped(path, path.read_bytes(), range(30, 38))
    assert store.category_state("c").row_ids == {"r1"}  # the ids alone read fine
    with pytest.raises(ExportError, match=r"moved to .*quarantine.*run the run again"):
        export_specforge(tmp_path / "run", out=tmp_path / "out.jsonl")
    assert not path.exists() and not (tmp_path / "out.jsonl").exists()
    assert store.category_state("c").row_ids == set()  # the next start asks r1 again
    assert len(list((tmp_path / "run" / "quarantine" / "c").iterdir())) == 1


def test_a_flipped_byte_that_reads_as_other_text_is_caught_by_the_page_checksum(tmp_path: Path) -> None:
    """Without a checksum some flips in a compressed page decode without an error, as other text: a
    training row silently changed."""
    _, path = _one_row_shard(tmp_path)
    original = path.read_bytes()
    for position in range(120):
        _flipped(path, original, range(position, position + 1))
        try:  # read as a reader without checksums would
            text = pq.read_table(path, columns=["messages"]).column("messages").to_pylist()[0][0]["content"]
        except (OSError, pa.ArrowException, UnicodeDecodeError):
            continue
        if text != LONG:
            break
    else:
        pytest.fail("no flip read as other text: the test needs another text")
    with pytest.raises(ExportError, match="cannot be read"):
        export_specforge(tmp_path / "run", out=tmp_path / "out.jsonl")
