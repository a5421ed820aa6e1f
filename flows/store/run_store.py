"""The checkpoint store: parquet shards that make a run resumable exactly once.

A row exists once it is in a shard file that was written under a temporary name, fsynced and
atomically renamed; anything not yet renamed is simply asked again on resume. So a kill -9 at any
moment loses at most the rows still buffered (work, not data) and can never leave half a file
or a row twice. The store knows nothing of HTTP or Prefect.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features

from flows.store.schema import REJECT_FEATURES, ROW_FEATURES, arrow_schema

log = logging.getLogger(__name__)

DATA_DIR = "data"
REJECTS_DIR = "rejects"
QUARANTINE_DIR = "quarantine"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"


class FingerprintMismatch(RuntimeError):
    """The run directory holds data generated with a different prompt/sampling config."""


class StoreWriteFailed(RuntimeError):
    """A file of the run directory could not be written (a full disk, a quota, an I/O error).

    Raised instead of the bare ``OSError`` so the run can stop with one line naming the file, the
    space left and what the write needed, rather than a traceback from a worker thread. Nothing
    partial is left behind (``atomic_file`` removed its temporary file) and the rows of the failed
    write are simply asked again on resume.
    """

    def __init__(self, path: Path, error: OSError, needed_bytes: int | None = None) -> None:
        self.path = path
        self.error = error
        self.disk_full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        try:
            free: int | None = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        space = [f"{_size(free)} free"] if free is not None else []
        if needed_bytes is not None:
            space.append(f"the write needed up to {_size(needed_bytes)}")
        what = "the disk is full" if self.disk_full else "a write failed"
        detail = error.strerror or str(error)
        super().__init__(f"{what}: cannot write {path} ({'; '.join([detail, *space])})")


def _size(n: int) -> str:
    """Bytes for a person: ``0 B``, ``1.4 MB``."""
    if n < 1000:
        return f"{n} B"
    scaled = float(n)
    for unit in ("KB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000:
            return f"{scaled:.1f} {unit}"
    return f"{scaled / 1000:.1f} TB"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", *, needed_bytes: int | None = None) -> Iterator[IO[Any]]:
    """Write under a temporary name, fsync, rename, fsync the directory: the file is whole or absent.

    A failure while writing removes the temporary file and leaves any previous ``path`` untouched;
    an ``OSError`` (a full disk above all) comes out as ``StoreWriteFailed`` naming ``path``, with
    ``needed_bytes`` (the caller's estimate of the file's size) in its message.
    """
    tmp = path.with_name(TMP_PREFIX + path.name)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as error:
        with contextlib.suppress(OSError):  # unlinking frees space; it cannot itself need any
            tmp.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise StoreWriteFailed(path, error, needed_bytes) from error
        raise


def write_parquet_atomically(table: pa.Table, path: Path) -> None:
    """One parquet file, whole or absent; a failure's message bounds the space it needed by the
    table's uncompressed size."""
    with atomic_file(path, needed_bytes=table.nbytes) as handle:
        pq.write_table(table, handle, compression="zstd")


def write_json_atomically(payload: Any, path: Path) -> None:
    with atomic_file(path, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, default=str)


class ShardWriter:
    """Buffers rows of one table and one category; says when a shard is due (row count or age).

    Buffering and writing are separate steps (``take`` then ``write``) so the session can write a
    shard in a worker thread: an fsync of tens of megabytes of long answers must not pause the event
    loop that reads thousands of streams. ``write`` is safe to call from another thread; ``add``,
    ``due`` and ``take`` belong to the event loop. File names carry a millisecond timestamp, the
    pid and a sequence number, so writers of two processes (a resumed run racing a forgotten one)
    never overwrite each other.
    """

    def __init__(self, folder: Path, features: Features, *, flush_rows: int, flush_seconds: float) -> None:
        self.folder = folder
        self._schema = arrow_schema(features)
        self._flush_rows = flush_rows
        self._flush_seconds = flush_seconds
        self._rows: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self.written = 0
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()
        self._rows.append(row)

    def due(self) -> bool:
        if not self._rows:
            return False
        age = time.monotonic() - (self._oldest or time.monotonic())
        return len(self._rows) >= self._flush_rows or age >= self._flush_seconds

    @property
    def pending(self) -> int:
        return len(self._rows)

    def take(self) -> list[dict[str, Any]]:
        """The buffered rows, leaving the buffer empty (they are not on disk until written)."""
        rows, self._rows, self._oldest = self._rows, [], None
        return rows

    def write(self, rows: list[dict[str, Any]]) -> Path | None:
        """One finished shard of ``rows`` (written, fsynced, renamed); None for no rows."""
        if not rows:
            return None
        table = pa.Table.from_pylist(rows, schema=self._schema)
        with self._lock:
            seq = next(self._seq)
        path = self.folder / f"part-{int(time.time() * 1000):013d}-{os.getpid()}-{seq:05d}.parquet"
        write_parquet_atomically(table, path)
        with self._lock:
            self.written += len(rows)
        return path

    def flush(self) -> Path | None:
        """Write everything buffered now, in this thread."""
        return self.write(self.take())


def shard_files(folder: Path) -> list[Path]:
    """Finished shards only: temporary files are never part of the data."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("part-*.parquet") if not p.name.startswith(TMP_PREFIX))


@dataclass
class CategoryState:
    """What a category already has on disk: the ids to skip on resume, and the counts to report."""

    row_ids: set[str] = field(default_factory=set)
    final_reject_ids: set[str] = field(default_factory=set)
    retryable_reject_ids: set[str] = field(default_factory=set)
    prompt_hashes: set[str] = field(default_factory=set)
    """Dedup keys of the prompts this category already holds (rows and final rejects)."""

    @property
    def done_ids(self) -> set[str]:
        """Ids not to ask again: rows and rejects that retrying cannot change."""
        return self.row_ids | self.final_reject_ids

    @property
    def effective_reject_ids(self) -> set[str]:
        """Rejects still standing: an id later answered on resume is no longer a reject."""
        return (self.final_reject_ids | self.retryable_reject_ids) - self.row_ids


class RunStore:
    """One run directory: manifest, per-category row and reject shards, quarantine for bad files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    # -- layout ----------------------------------------------------------------------------------
    def data_dir(self, category: str | None = None) -> Path:
        base = self.run_dir / DATA_DIR
        return base / category if category else base

    def rejects_dir(self, category: str | None = None) -> Path:
        base = self.run_dir / REJECTS_DIR
        return base / category if category else base

    @property
    def manifest_path(self) -> Path:
        return self.run_dir / MANIFEST

    # -- manifest --------------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            return None
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def open_run(self, fingerprint: str, snapshot: dict[str, Any], *, force: bool = False) -> bool:
        """Create or reopen the run; refuse to mix data of another config unless ``force``.

        Returns True when an existing run is resumed.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.remove_temporary_files()
        manifest = self.read_manifest()
        resumed = manifest is not None
        if manifest is not None and manifest.get("fingerprint") != fingerprint and not force:
            raise FingerprintMismatch(
                f"{self.run_dir} was generated with another prompt/sampling config "
                f"(fingerprint {manifest.get('fingerprint')}, now {fingerprint}). Use a new run name, "
                "or pass --force to add rows made with the new config to this run."
            )
        history = list(manifest.get("history", [])) if manifest else []
        history.append({"fingerprint": fingerprint, "started_at": datetime.now(UTC).isoformat()})
        write_json_atomically(
            {
                "fingerprint": fingerprint,
                "created_at": manifest.get("created_at") if manifest else datetime.now(UTC).isoformat(),
                "config": snapshot,
                "history": history,
            },
            self.manifest_path,
        )
        return resumed

    def remove_temporary_files(self) -> int:
        """Leftovers of a killed writer: never data, always safe to delete."""
        removed = 0
        for tmp in self.run_dir.rglob(TMP_PREFIX + "*"):
            tmp.unlink(missing_ok=True)
            removed += 1
        return removed

    # -- reading ---------------------------------------------------------------------------------
    def _read_columns(self, path: Path, columns: list[str]) -> pa.Table | None:
        """Read a few columns; a shard that cannot be read is quarantined (its ids get redone)."""
        try:
            return pq.read_table(path, columns=columns)
        except (OSError, pa.ArrowException) as error:
            target = self.run_dir / QUARANTINE_DIR / path.parent.name
            target.mkdir(parents=True, exist_ok=True)
            os.replace(path, target / path.name)
            log.warning("unreadable shard %s moved to %s: %s", path, target, error)
            return None

    def category_state(self, category: str) -> CategoryState:
        state = CategoryState()
        for path in shard_files(self.data_dir(category)):
            table = self._read_columns(path, ["id", "prompt_hash"])
            if table is not None:
                state.row_ids.update(table.column("id").to_pylist())
                state.prompt_hashes.update(h for h in table.column("prompt_hash").to_pylist() if h)
        for path in shard_files(self.rejects_dir(category)):
            table = self._read_columns(path, ["id", "retryable", "prompt_hash"])
            if table is None:
                continue
            for rid, retryable, key in zip(
                *(table.column(name).to_pylist() for name in ("id", "retryable", "prompt_hash")), strict=True
            ):
                if retryable:
                    state.retryable_reject_ids.add(rid)
                else:
                    state.final_reject_ids.add(rid)
                    if key:
                        state.prompt_hashes.add(key)
        return state

    def categories_on_disk(self) -> list[str]:
        names: set[str] = set()
        for base in (self.data_dir(), self.rejects_dir()):
            if base.is_dir():
                names.update(p.name for p in base.iterdir() if p.is_dir())
        return sorted(names)

    def iter_rejects(self, category: str) -> Iterator[dict[str, Any]]:
        for path in shard_files(self.rejects_dir(category)):
            table = self._read_columns(path, ["id", "stage", "reason", "retryable"])
            if table is not None:
                yield from table.to_pylist()

    def iter_row_columns(self, category: str, columns: list[str]) -> Iterator[dict[str, Any]]:
        for path in shard_files(self.data_dir(category)):
            table = self._read_columns(path, columns)
            if table is not None:
                yield from table.to_pylist()

    # -- writing ---------------------------------------------------------------------------------
    def row_writer(self, category: str, *, flush_rows: int, flush_seconds: float) -> ShardWriter:
        return ShardWriter(
            self.data_dir(category), ROW_FEATURES, flush_rows=flush_rows, flush_seconds=flush_seconds
        )

    def reject_writer(self, category: str, *, flush_rows: int, flush_seconds: float) -> ShardWriter:
        return ShardWriter(
            self.rejects_dir(category), REJECT_FEATURES, flush_rows=flush_rows, flush_seconds=flush_seconds
        )
