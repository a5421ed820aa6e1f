"""A shard write that fails (a full disk) leaves nothing partial, says where, and ends the flusher loudly.

The write is made to fail the way a full disk does: some bytes reach the temporary file, then the
kernel answers ENOSPC. No mount needed (the tmpfs run is in tests/sim/test_disk_full.py).
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.run.rows import reject_row
from flows.store.flusher import Flusher
from flows.store.run_store import RunStore, StoreWriteFailed

real_write_table = pq.write_table


def _reject(rid: str) -> dict[str, Any]:
    return reject_row(
        record_id=rid,
        category="c",
        source={"dataset": "d", "split": "t", "row": 0},
        stage="request",
        reason="x",
    )


def _fill_then_fail(failing: str, code: int = errno.ENOSPC) -> Any:
    """``pq.write_table`` for files under a folder named ``failing``: half a file, then ``code``."""

    def write_table(table: Any, where: Any, **kwargs: Any) -> None:
        if Path(where.name).parent.name != failing:
            real_write_table(table, where, **kwargs)
            return
        where.write(b"PAR1" + b"\0" * 4096)
        raise OSError(code, "No space left on device" if code == errno.ENOSPC else "Input/output error")

    return write_table


def test_a_full_disk_leaves_no_file_and_one_message_naming_the_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path / "run")
    writer = store.reject_writer("c", flush_rows=10, flush_seconds=60)
    monkeypatch.setattr(pq, "write_table", _fill_then_fail("c"))
    with pytest.raises(StoreWriteFailed) as failed:
        writer.write([_reject(f"r{i}") for i in range(5)])
    message = str(failed.value)
    assert failed.value.disk_full
    assert message.startswith(f"the disk is full: cannot write {writer.folder}/part-")
    assert "No space left on device" in message and " free" in message and "needed up to" in message
    assert "\n" not in message
    assert list(Path(writer.folder).iterdir()) == []  # no temporary file, no shard
    monkeypatch.undo()
    writer.write([_reject(f"r{i}") for i in range(5)])  # space back: the same rows are written whole
    assert store.category_state("c").final_reject_ids == {f"r{i}" for i in range(5)}


def test_another_write_error_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = RunStore(tmp_path / "run").reject_writer("c", flush_rows=10, flush_seconds=60)
    monkeypatch.setattr(pq, "write_table", _fill_then_fail("c", errno.EIO))
    with pytest.raises(StoreWriteFailed, match=r"^a write failed: .*Input/output error") as failed:
        writer.write([_reject("r")])
    assert not failed.value.disk_full


async def test_the_flusher_loop_ends_with_the_write_error_and_drain_tries_every_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path / "run")
    full = store.reject_writer("full", flush_rows=1, flush_seconds=60)
    fine = store.reject_writer("fine", flush_rows=1, flush_seconds=60)
    monkeypatch.setattr(pq, "write_table", _fill_then_fail("full"))
    flusher = Flusher(lambda: [full, fine])
    full.add(_reject("a"))
    loop = asyncio.create_task(flusher.loop())
    with pytest.raises(StoreWriteFailed, match="the disk is full"):
        await asyncio.wait_for(loop, timeout=5)  # the loop does not swallow the error and go on
    await flusher.settle()  # the failed write is the loop's error, not raised again here
    full.add(_reject("b"))
    fine.add(_reject("c"))
    with pytest.raises(StoreWriteFailed):
        await flusher.drain()
    assert store.category_state("fine").final_reject_ids == {"c"}  # written despite the other's failure
    assert list(Path(full.folder).iterdir()) == []
    assert full.pending == fine.pending == 0


async def test_drain_writes_every_other_writer_when_one_shard_cannot_be_built(tmp_path: Path) -> None:
    """Not only a full disk: a shard Arrow refuses to build (a row of the wrong shape, a bug) must not
    cost the other categories their finished rows at shutdown."""
    store = RunStore(tmp_path / "run")
    poisoned = store.reject_writer("a", flush_rows=100, flush_seconds=60)
    fine = store.reject_writer("b", flush_rows=100, flush_seconds=60)
    poisoned.add(_reject("p"))
    poisoned._rows[0]["status"] = "not-an-int"  # past `add`'s check: a bug in the writer's own code
    for rid in ("f0", "f1"):
        fine.add(_reject(rid))
    with pytest.raises(pa.ArrowException):
        await Flusher(lambda: [poisoned, fine]).drain()
    assert store.category_state("b").final_reject_ids == {"f0", "f1"}
