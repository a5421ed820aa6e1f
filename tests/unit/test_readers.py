"""Streaming readers: local JSONL/JSON/parquet files and directories, the Hub path, bad lines."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prompts.errors import ConversionError
from prompts.formats import INVALID_KEY, to_record
from prompts.readers import dataset_label, iter_rows
from prompts.samples import sample_names, sample_path

FIXTURES = Path(__file__).parent.parent / "fixtures" / "prompts"


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 2) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def test_jsonl_fixture_streams_every_row_in_order() -> None:
    source = str(FIXTURES / "sharegpt.jsonl")
    assert inspect.isgenerator(iter_rows(source))
    rows = iter_rows(source)
    first = next(rows)
    assert first[0] == 0 and first[1]["id"] == "Qx7Lm2A_0"
    assert [(i, r["id"]) for i, r in rows] == [
        (1, "Rk93Pzz_4"),
        (2, "u8TfQ1c_12"),
        (3, "Zz01kkA_0"),
        (4, "Lp0ngG3_0"),
        (5, "Ed9eCas_2"),
    ]


def test_jsonl_is_read_lazily(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "a.jsonl", [{"n": 0}, {"n": 1}])
    rows = iter_rows(str(path))
    assert next(rows) == (0, {"n": 0})
    with path.open("a", encoding="utf-8") as handle:  # appended after reading began: still seen
        handle.write('{"n": 2}\n')
    assert list(rows) == [(1, {"n": 1}), (2, {"n": 2})]


def test_bad_jsonl_lines_become_reject_markers_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"n": 0}\n\n{"n": 1\n[1, 2]\n\xff\xfe\n{"n": 5}\n')
    rows = list(iter_rows(str(path)))
    assert rows == [
        (0, {"n": 0}),
        (1, {INVALID_KEY: "bad.jsonl line 3 column 8: Expecting ',' delimiter"}),
        (2, {INVALID_KEY: "bad.jsonl line 4: not a JSON object"}),
        (3, {INVALID_KEY: "bad.jsonl line 5: invalid UTF-8"}),
        (4, {"n": 5}),
    ]
    with pytest.raises(ConversionError) as excinfo:
        to_record(rows[1][1], index=1, category="c", dataset="bad", split="train", fmt="sharegpt")
    assert excinfo.value.reason == ("invalid input: bad.jsonl line 3 column 8: Expecting ',' delimiter")


def test_jsonl_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"n": 0}\n')
    assert list(iter_rows(str(path))) == [(0, {"n": 0})]


@pytest.mark.parametrize("wrap", [False, True])
def test_json_list_or_data_object(tmp_path: Path, wrap: bool) -> None:
    items: list[Any] = [{"n": 0}, "oops", {"n": 2}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"data": items} if wrap else items), encoding="utf-8")
    assert list(iter_rows(str(path))) == [
        (0, {"n": 0}),
        (1, {INVALID_KEY: "rows.json item 1: not a JSON object"}),
        (2, {"n": 2}),
    ]


def test_json_of_the_wrong_shape_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('{"rows": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON list of rows"):
        list(iter_rows(str(path)))


def test_parquet_streams_batches_with_nested_columns(tmp_path: Path) -> None:
    rows = [
        {"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
        for i in range(5)
    ]
    path = _write_parquet(tmp_path / "part.parquet", rows)
    assert inspect.isgenerator(iter_rows(str(path)))
    assert list(iter_rows(str(path))) == list(enumerate(rows))


def test_directory_reads_its_files_in_sorted_order_with_continuing_indices(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "b.jsonl", [{"n": "b0"}, {"n": "b1"}])
    _write_parquet(tmp_path / "a.parquet", [{"n": "a0"}])
    (tmp_path / "c.json").write_text(json.dumps([{"n": "c0"}]), encoding="utf-8")
    (tmp_path / "README.md").write_text("not data", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    _write_jsonl(tmp_path / "sub" / "d.jsonl", [{"n": "nested"}])
    assert list(iter_rows(str(tmp_path))) == [
        (0, {"n": "a0"}),
        (1, {"n": "b0"}),
        (2, {"n": "b1"}),
        (3, {"n": "c0"}),
    ]
    assert list(iter_rows(str(tmp_path), data_files=["sub/*.jsonl", "b.*"])) == [
        (0, {"n": "b0"}),
        (1, {"n": "b1"}),
        (2, {"n": "nested"}),
    ]


def test_local_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        list(iter_rows(str(tmp_path / "missing.jsonl")))
    with pytest.raises(FileNotFoundError, match=r"no \.jsonl, \.json, \.parquet files"):
        list(iter_rows(str(tmp_path)))
    (tmp_path / "rows.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unsupported file type"):
        list(iter_rows(str(tmp_path / "rows.csv")))
    with pytest.raises(ValueError, match="data_files does not apply to a single file"):
        list(iter_rows(str(tmp_path / "rows.csv"), data_files="x"))


def test_hub_ids_stream_through_load_dataset_with_the_given_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import datasets

    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_load_dataset(path: str, **kwargs: Any) -> Any:
        calls.append((path, kwargs))
        return iter([{"prompt_id": "p0"}, {"prompt_id": "p1"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = iter_rows(
        "HuggingFaceH4/ultrachat_200k", split="train_sft", subset="default", data_files="x/*.parquet"
    )
    assert calls == []  # nothing is fetched until the first row is asked for
    assert list(rows) == [(0, {"prompt_id": "p0"}), (1, {"prompt_id": "p1"})]
    assert calls == [
        (
            "HuggingFaceH4/ultrachat_200k",
            {"name": "default", "split": "train_sft", "streaming": True, "data_files": "x/*.parquet"},
        )
    ]


def test_hub_path_through_the_real_datasets_library_offline(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "rows.jsonl", [{"n": 0}, {"n": 1}])
    assert list(iter_rows("json", data_files=str(path))) == [(0, {"n": 0}), (1, {"n": 1})]


def test_dataset_label(tmp_path: Path) -> None:
    assert dataset_label(str(FIXTURES / "ultrachat.jsonl")) == "ultrachat"
    assert dataset_label(str(FIXTURES)) == "prompts"
    assert dataset_label("HuggingFaceH4/ultrachat_200k") == "HuggingFaceH4/ultrachat_200k"


@pytest.mark.parametrize(
    ("name", "fmt", "rejects"),
    [
        ("ultrachat_sample.jsonl", "messages", [(37, "no user turn")]),
        ("sharegpt_sample.jsonl", "sharegpt", [(23, "unknown role: narrator")]),
    ],
)
def test_bundled_samples_convert_with_exactly_the_documented_rejects(
    name: str, fmt: str, rejects: list[tuple[int, str]]
) -> None:
    source = str(sample_path(name))
    records, seen_rejects = [], []
    for index, row in iter_rows(source):
        try:
            records.append(
                to_record(
                    row, index=index, category="demo", dataset=dataset_label(source), split="train", fmt=fmt
                )
            )
        except ConversionError as exc:
            seen_rejects.append((index, exc.reason))
    assert seen_rejects == rejects
    assert len(records) == 49
    assert len({r.id for r in records}) == 49
    assert all(r.messages[-1]["role"] == "user" for r in records)
    assert sum(len(r.messages) > 1 for r in records) >= 4  # some multi-turn prompts
    assert {r.source.dataset for r in records} == {name.removesuffix(".jsonl")}


def test_ultrachat_sample_ids_follow_the_dataset_convention() -> None:
    for _, row in iter_rows(str(sample_path("ultrachat_sample.jsonl"))):
        assert row["prompt_id"] == hashlib.sha256(row["prompt"].encode("utf-8")).hexdigest()


def test_sample_path_names_the_available_samples() -> None:
    assert sample_names() == ["sharegpt_sample.jsonl", "ultrachat_sample.jsonl"]
    assert sample_path("ultrachat_sample.jsonl").is_file()
    with pytest.raises(
        FileNotFoundError, match=r"available: sharegpt_sample\.jsonl, ultrachat_sample\.jsonl"
    ):
        sample_path("nope.jsonl")
