from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from flows.run.rows import reject_row
from flows.store import run_store
from flows.store.parts import Part, part_of_file
from flows.store.run_store import FingerprintMismatch, PartsMismatch, RunStore
from flows.store.schema import ROW_FEATURES


def _row(rid: str, flags: list[str] | None = None) -> dict:
    return {
        "id": rid,
        "category": "c",
        "source": {"dataset": "d", "split": "train", "row": 1},
        "messages": [
            {
                "role": "user",
                "content": "hi",
                "reasoning_content": None,
                "tool_calls": None,
                "tool_call_id": None,
                "name": None,
            },
            {
                "role": "assistant",
                "content": "yo",
                "reasoning_content": "think",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
                "tool_call_id": None,
                "name": None,
            },
        ],
        "tools": None,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "reasoning_tokens": 1, "cached_tokens": 0},
        "model": "m",
        "sampling": "{}",
        "endpoint": "http://x",
        "latency_s": 0.5,
        "ttft_s": None,
        "attempts": 1,
        "created_at": datetime.now(UTC),
        "flags": flags or [],
    }


def _reject(rid: str, retryable: bool, stage: str = "request") -> dict:
    return reject_row(
        record_id=rid,
        category="c",
        source={"dataset": "d", "split": "train", "row": 0},
        stage=stage,
        reason="boom",
        retryable=retryable,
    )


def test_a_shard_is_due_by_rows_and_written_atomically(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.open_run("fp", {})
    writer = store.row_writer("c", flush_rows=2, flush_seconds=3600)
    writer.add(_row("a"))
    assert not writer.due()
    writer.add(_row("b"))
    assert writer.due()
    assert store.shard_files(store.data_dir("c")) == []  # adding never writes: the session decides where
    writer.write(writer.take())
    files = store.shard_files(store.data_dir("c"))
    assert len(files) == 1 and writer.pending == 0 and writer.written == 2
    assert not list(Path(store.data_dir("c")).glob(".tmp-*"))
    assert pq.read_table(files[0]).column("id").to_pylist() == ["a", "b"]


def test_a_shard_is_due_by_age(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    writer = store.row_writer("c", flush_rows=1000, flush_seconds=0.05)
    writer.add(_row("a"))
    assert not writer.due()
    time.sleep(0.06)
    assert writer.due()


def test_writes_from_threads_never_share_a_file_name(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    writer = RunStore(tmp_path / "run").row_writer("c", flush_rows=1, flush_seconds=60)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda i: writer.write([_row(f"r{i}")]), range(40)))
    assert len(set(paths)) == 40 and writer.written == 40


def _flushed(writer, *rows: dict) -> None:  # type: ignore[no-untyped-def]
    for row in rows:
        writer.add(row)
    writer.flush()


def test_output_loads_with_datasets_and_keeps_declared_features(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=3600), _row("a", ["truncated"]))
    ds = load_dataset("parquet", data_dir=str(store.data_dir()), split="train")
    assert ds.features == ROW_FEATURES
    assert ds[0]["messages"][1]["tool_calls"][0]["function"]["name"] == "f"
    assert ds[0]["flags"] == ["truncated"]


def test_done_set_reads_rows_and_final_rejects_but_retries_transient_ones(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    rejects.add(_reject("bad", retryable=False))
    rejects.add(_reject("flaky", retryable=True))
    rejects.add(_reject("later-ok", retryable=True))
    rejects.flush()
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("later-ok"))
    state = store.category_state("c")
    assert state.done_ids == {"a", "bad", "later-ok"}
    assert state.effective_reject_ids == {"bad", "flaky"}


def test_records_done_counts_rows_and_refused_prompts_not_unreadable_source_rows(tmp_path: Path) -> None:
    """What a resume counts toward a category's limit: a source row no format could read was never
    one of its prompts (counted, a limit of 3 with two such rows on disk left one prompt asked)."""
    store = RunStore(tmp_path / "run")
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    _flushed(rejects, _reject("bad", retryable=False), _reject("raw-1", retryable=False, stage="convert"))
    state = store.category_state("c")
    assert state.done_ids == {"a", "bad", "raw-1"}
    assert state.records_done == 2


def test_leftover_temporary_files_are_removed_and_never_read(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    (Path(store.data_dir("c")) / ".tmp-part-9.parquet").write_bytes(b"half a file")
    assert store.category_state("c").row_ids == {"a"}
    store.open_run("fp", {})
    assert not list(Path(store.data_dir("c")).glob(".tmp-*"))


def test_corrupt_shard_is_quarantined_and_its_ids_redone(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    (Path(store.data_dir("c")) / "part-0000000000001-1-00001.parquet").write_bytes(b"not parquet")
    assert store.category_state("c").row_ids == {"a"}
    assert len(list((tmp_path / "run" / "quarantine" / "c").iterdir())) == 1


def test_a_rows_shard_and_a_rejects_shard_of_one_name_are_both_kept_in_quarantine(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    name = "part-0000000000001-1-00001.parquet"
    for folder in (store.data_dir("c"), store.rejects_dir("c")):
        Path(folder).mkdir(parents=True)
        (Path(folder) / name).write_bytes(b"not parquet " + folder.encode())
    store.category_state("c")
    kept = sorted(p.name for p in (tmp_path / "run" / "quarantine" / "c").iterdir())
    assert kept == [name, f"rejects-{name}"]


def test_changed_config_refuses_to_mix_unless_forced(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    assert store.open_run("fp1", {"a": 1}) is False
    assert store.open_run("fp1", {"a": 1}) is True
    with pytest.raises(FingerprintMismatch, match="--force"):
        store.open_run("fp2", {"a": 2})
    assert store.open_run("fp2", {"a": 2}, force=True) is True
    manifest = store.read_manifest()
    assert manifest is not None
    assert manifest["fingerprint"] == "fp2"
    assert [h["fingerprint"] for h in manifest["history"]] == ["fp1", "fp1", "fp2"]


@pytest.fixture
def memory_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh place in fsspec's in-process memory file system, emptied afterwards (a shard read
    again at once: no pause between the tries of a network read)."""
    import fsspec

    monkeypatch.setattr(run_store, "REMOTE_READ_WAIT_S", 0.0)

    url = f"memory://runs-{uuid.uuid4().hex}/run"
    yield url
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_a_network_read_that_fails_once_quarantines_nothing(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection reset while a start reads the done-set moved a good shard aside: its rows were
    paid for again. Over a network a read is tried again first; a damaged shard fails every time."""
    store = RunStore(memory_url)
    store.open_run("fp", {})
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    real, calls = pq.read_table, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 1:
            raise OSError("Connection reset by peer")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "read_table", flaky)
    assert store.category_state("c").row_ids == {"a"}
    assert len(calls) == 2 and not store.fs.exists(store.root + "/quarantine")


def test_a_memory_url_holds_a_whole_run(memory_url: str) -> None:
    """The same store on fsspec's memory file system: manifest, shards, done-set, quarantine."""
    store = RunStore(memory_url)
    assert store.open_run("fp", {"a": 1}) is False
    _flushed(store.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    rejects = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    rejects.add(_reject("bad", retryable=False))
    rejects.flush()
    store.fs.pipe_file(store.data_dir("c") + "/part-0000000000001-1-00001.parquet", b"not parquet")
    again = RunStore(memory_url)
    assert again.open_run("fp", {"a": 1}) is True
    assert again.category_state("c").done_ids == {"a", "bad"}
    assert again.categories_on_disk() == ["c"]
    assert [p.rsplit("/", 1)[1] for p in again.fs.find(again.root + "/quarantine")] == [
        "part-0000000000001-1-00001.parquet"
    ]
    assert again.url() == memory_url.replace("memory://", "memory:///")


def test_a_file_url_is_the_local_store(tmp_path: Path) -> None:
    """``file://`` is the local path: the same files (written through the temporary name) either way."""
    by_url = RunStore(f"file://{tmp_path}/run")
    assert by_url.local
    by_url.open_run("fp", {})
    _flushed(by_url.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    assert RunStore(tmp_path / "run").category_state("c").row_ids == {"a"}
    assert [p.name[:5] for p in (tmp_path / "run" / "data" / "c").iterdir()] == ["part-"]


def test_parts_name_their_shards_and_remove_only_their_own_temporary_files(tmp_path: Path) -> None:
    one, two = RunStore(tmp_path / "run", Part(1, 2)), RunStore(tmp_path / "run", Part(2, 2))
    one.open_run("fp", {})
    _flushed(one.row_writer("c", flush_rows=1, flush_seconds=60), _row("a"))
    _flushed(two.row_writer("c", flush_rows=1, flush_seconds=60), _row("b"))
    names = sorted(Path(p).name for p in one.shard_files(one.data_dir("c")))
    assert [part_of_file(name) for name in names] == ["1/2", "2/2"]
    folder = Path(one.data_dir("c"))
    (folder / ".tmp-part-1-of-2-9.parquet").write_bytes(b"1's half file")
    (folder / ".tmp-part-2-of-2-9.parquet").write_bytes(b"2's file being written now")
    assert one.open_run("fp", {}) is True
    assert sorted(p.name for p in folder.glob(".tmp-*")) == [".tmp-part-2-of-2-9.parquet"]
    assert one.category_state("c").row_ids == two.category_state("c").row_ids == {"a", "b"}  # the union


def test_a_run_written_in_parts_refuses_another_number_of_parts(tmp_path: Path) -> None:
    RunStore(tmp_path / "run", Part(1, 2)).open_run("fp", {})
    assert RunStore(tmp_path / "run", Part(2, 2)).open_run("fp", {}) is True
    with pytest.raises(PartsMismatch, match="written in 2 parts, now --part i/3"):
        RunStore(tmp_path / "run", Part(1, 3)).open_run("fp", {})
    with pytest.raises(PartsMismatch, match="written in 2 parts, now no --part"):
        RunStore(tmp_path / "run").open_run("fp", {})
    RunStore(tmp_path / "plain").open_run("fp", {})
    with pytest.raises(PartsMismatch, match="written without --part"):
        RunStore(tmp_path / "plain", Part(1, 2)).open_run("fp", {})
    manifest = RunStore(tmp_path / "run").read_manifest()
    assert manifest is not None and manifest["parts"] == 2
    assert [h.get("part") for h in manifest["history"]] == ["1/2", "2/2"]


def test_a_refused_start_leaves_the_parts_temporary_files_alone(tmp_path: Path) -> None:
    RunStore(tmp_path / "run", Part(1, 2)).open_run("fp", {})
    folder = tmp_path / "run" / "data" / "c"
    folder.mkdir(parents=True)
    (folder / ".tmp-part-1-of-2-9.parquet").write_bytes(b"being written now")
    with pytest.raises(PartsMismatch):
        RunStore(tmp_path / "run").open_run("fp", {})
    assert [p.name for p in folder.iterdir()] == [".tmp-part-1-of-2-9.parquet"]


def test_parts_starting_at_once_never_take_each_others_temporary_manifest(tmp_path: Path) -> None:
    """Found by two parts started together: both wrote `.tmp-manifest.json` and one rename failed."""
    from concurrent.futures import ThreadPoolExecutor

    def starts(index: int) -> None:
        for _ in range(60):
            RunStore(tmp_path / "run", Part(index, 2)).open_run("fp", {})

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(starts, (1, 2)))  # re-raises a failed rename
    manifest = RunStore(tmp_path / "run").read_manifest()
    assert manifest is not None and manifest["parts"] == 2


def test_two_processes_rewriting_one_file_never_rename_away_each_others_temporary_file(
    tmp_path: Path,
) -> None:
    """The parts of a run both write the run's summary at their end (seen failing once in CI)."""
    target = tmp_path / "summary.json"
    script = (
        "import sys\nfrom pathlib import Path\nfrom flows.store.run_store import write_json_atomically\n"
        "for i in range(300):\n"
        "    write_json_atomically({'writer': sys.argv[2], 'i': i}, Path(sys.argv[1]))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(target), name], stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]
    errors = [proc.communicate(timeout=120)[1].decode() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors
    assert json.loads(target.read_text())["i"] == 299
    assert not list(tmp_path.glob(".tmp-*"))


def _answer(rid: str, tokens: int, cap: int = 256, requests: int = 1) -> dict:
    row = _row(rid)
    row["usage"] = {**row["usage"], "completion_tokens": tokens}
    row["sampling"] = json.dumps({"max_tokens": cap, "temperature": 0.7, "top_p": 1.0})
    row["requests"] = requests
    return row


def test_a_resume_reads_the_latest_single_request_answers_under_its_cap_oldest_first(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.open_run("fp", {})
    shards = [
        [_answer("a", 10), _answer("b", 20)],
        [_answer("c", 30), _answer("d", 999, cap=1024), _answer("e", 40, requests=3)],
        [_answer("f", 50), _answer("g", 60)],
    ]
    for rows in shards:
        store.row_writer("c", flush_rows=10, flush_seconds=60).write(rows)
        time.sleep(0.002)  # shard names order by their millisecond
    # another cap (a changed config, a cap lowered to fit the context) and a multi-turn row's summed
    # usage say nothing of one request's answer under this cap
    assert store.recent_answers("c", 256, 100) == [10, 20, 30, 50, 60]
    assert store.recent_answers("c", 256, 3) == [30, 50, 60]  # the newest, still oldest first
    assert store.recent_answers("c", 1024, 100) == [999]
    assert store.recent_answers("other", 256, 100) == []


def test_reading_the_latest_answers_stops_at_the_shards_that_hold_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path / "run")
    store.open_run("fp", {})
    for n in range(5):
        store.row_writer("c", flush_rows=10, flush_seconds=60).write(
            [_answer(f"{n}-{i}", n) for i in range(4)]
        )
        time.sleep(0.002)
    read: list[str] = []
    read_columns = store._read_columns
    monkeypatch.setattr(
        store, "_read_columns", lambda path, columns: read.append(path) or read_columns(path, columns)
    )
    assert store.recent_answers("c", 256, 6) == [3, 3, 4, 4, 4, 4]
    assert len(read) == 2  # a week's run is not read whole at every start
