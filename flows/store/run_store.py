"""The checkpoint store: parquet shards that make a run resumable exactly once.

A row exists once it is in a shard file that was written under a temporary name, fsynced and
atomically renamed; anything not yet renamed is simply asked again on resume. So a kill -9 at any
moment loses at most the rows still buffered (work, not data) and can never leave half a file
or a row twice. The store knows nothing of HTTP or Prefect.

The run's location is a local path or any fsspec URL (``file://``, ``memory://``, ``s3://``,
``gs://``). Local files keep the temporary name, fsync and rename; elsewhere a shard is one put of
the finished bytes, which object stores make visible whole or not at all, so no temporary name is
needed (a file system whose writes can be seen half done is not a place for a run).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import itertools
import json
import logging
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from flows.say import SAY
from flows.store.config_changes import describe_changes
from flows.store.location import check_location
from flows.store.parts import Part
from flows.store.shard_schema import shard_schema
from prompts.dedup import FIRST_KEY_VERSION, KEY_VERSION, KEY_VERSIONS

log = logging.getLogger(__name__)

DATA_DIR = "data"
REJECTS_DIR = "rejects"
QUARANTINE_DIR = "quarantine"
MANIFEST = "manifest.json"
PROMPT_KEY_VERSION = "prompt_key_version"
"""The manifest's field naming the dedup key version of the run's ``prompt_hash`` (``prompts.dedup``).
Not part of the fingerprint: a run made before the key had versions resumes, with its first key."""
TMP_PREFIX = ".tmp-"
REMOTE_READ_ATTEMPTS = 3
REMOTE_READ_WAIT_S = 1.0
"""The first pause between two reads of a shard over a network (then twice as long)."""


class FingerprintMismatch(RuntimeError):
    """The run directory holds data generated with a different prompt/sampling config."""


class PartsMismatch(RuntimeError):
    """The run directory was written split into another number of parts (ids would land twice)."""


class KeyVersionUnknown(RuntimeError):
    """The run's prompts are keyed with a dedup key version this code does not know (a newer one)."""


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
def atomic_file(
    path: Path, mode: str = "wb", *, writer: str = "", needed_bytes: int | None = None
) -> Iterator[IO[Any]]:
    """Write under a temporary name, fsync, rename, fsync the directory: the file is whole or absent.

    A failure while writing removes the temporary file and leaves any previous ``path`` untouched;
    an ``OSError`` (a full disk above all) comes out as ``StoreWriteFailed`` naming ``path``, with
    ``needed_bytes`` (the caller's estimate of the file's size) in its message. ``writer`` goes into
    the temporary name when several processes may write one file at once (the parts of a run, each
    rewriting the manifest), so that a part removes only its own leftovers; the process id ends it in
    every case, so no writer renames away another's temporary file (the parts of a run both write
    the run's summary at their end: with one temporary name, the second rename failed with ENOENT
    and its part exited as if the disk had failed; seen once in CI).
    """
    tmp = path.with_name(f"{TMP_PREFIX}{writer}{path.name}.{os.getpid()}")
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


SHARD_WRITE: dict[str, Any] = {"compression": "zstd", "write_page_checksum": True}
"""Every page with its CRC, checked when read: a flipped bit in a stored shard (a disk, a copy, an
object store's transfer) is an unreadable shard that gets quarantined and redone, not a training
row with silently changed text (without the CRC, 8 flipped bytes in an answer's page exported as
mangled text or as a UTF-8 error, depending on where they fell)."""


def write_parquet_atomically(table: pa.Table, path: Path) -> None:
    """One parquet file, whole or absent; a failure's message bounds the space it needed by the
    table's uncompressed size."""
    with atomic_file(path, needed_bytes=table.nbytes) as handle:
        pq.write_table(table, handle, **SHARD_WRITE)


def write_json_atomically(payload: Any, path: Path) -> None:
    with atomic_file(path, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, default=str)


def write_text_atomically(text: str, path: Path) -> None:
    with atomic_file(path, "w") as handle:
        handle.write(text)


@functools.cache
def warm_arrow() -> None:
    """Pay pyarrow's first conversion of a Python list now: it imports pandas then (installed with
    ``datasets``) to check for pandas objects, 0.3 s of CPU with bytecode caches and 1.6 s without.
    Paid at the first shard's write, it made that shard a second late and stalled the event loop
    mid-run; a writer pays it when it is made, before any request."""
    pa.array([0])


class UnstorableRow(ValueError):
    """A row its shard's schema cannot hold: an answer of a type no reader foresaw (a tool call's
    arguments as a JSON object, a number where a string belongs)."""


class ShardWriter:
    """Buffers rows of one table and one category; says when a shard is due (row count or age).

    Buffering and writing are separate steps (``take`` then ``write``) so the session can write a
    shard in a worker thread: an fsync of tens of megabytes of long answers must not pause the event
    loop that reads thousands of streams. ``write`` is safe to call from another thread; ``add``,
    ``due`` and ``take`` belong to the event loop. File names carry the part (``part-2-of-4-``,
    for a run split into parts), a millisecond timestamp, the pid and a sequence number, so writers
    of two processes (a resumed run racing a forgotten one, two parts on two machines) never
    overwrite each other.
    """

    def __init__(
        self, store: RunStore, folder: str, schema: pa.Schema, *, flush_rows: int, flush_seconds: float
    ) -> None:
        self.store = store
        self.folder = folder
        self._prefix = f"{store.part.label}-" if store.part is not None else "part-"
        self._schema = schema
        self._row_type = pa.struct(list(schema))
        warm_arrow()
        self._flush_rows = flush_rows
        self._flush_seconds = flush_seconds
        self._rows: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self.written = 0
        store.fs.makedirs(folder, exist_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        """Buffer ``row``; ``UnstorableRow`` if the schema cannot hold it.

        Checked here, one row at a time (about 50 µs), because at the flush one such row failed its
        whole shard: the run stopped, the other buffered rows were lost, and every resume asked the
        prompt again and stopped again.
        """
        try:
            pa.array([row], type=self._row_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
            raise UnstorableRow(str(error)) from None
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

    def write(self, rows: list[dict[str, Any]]) -> str | None:
        """One finished shard of ``rows`` (whole or absent, see the module); None for no rows."""
        if not rows:
            return None
        table = pa.Table.from_pylist(rows, schema=self._schema)
        with self._lock:
            seq = next(self._seq)
        name = f"{self._prefix}{int(time.time() * 1000):013d}-{os.getpid()}-{seq:05d}.parquet"
        path = posixpath.join(self.folder, name)
        self.store.write_parquet(table, path)
        with self._lock:
            self.written += len(rows)
        return path

    def flush(self) -> str | None:
        """Write everything buffered now, in this thread."""
        return self.write(self.take())


@dataclass
class CategoryState:
    """What a category already has on disk: the ids to skip on resume, and the counts to report."""

    row_ids: set[str] = field(default_factory=set)
    final_reject_ids: set[str] = field(default_factory=set)
    retryable_reject_ids: set[str] = field(default_factory=set)
    retryable_reasons: dict[str, str] = field(default_factory=dict)
    """Why each retryable reject was made (the last shard's read, for an id rejected at several
    starts): what a start asks it with may depend on it (``flows/run/suspects.py``)."""
    prompt_hashes: set[str] = field(default_factory=set)
    """Dedup keys of the prompts this category already holds (rows and final rejects)."""
    source_reject_ids: set[str] = field(default_factory=set)
    """The final rejects that are source rows no format could read (stage ``convert``): done, but
    never a record, so not among what the category's ``limit`` counts."""

    @functools.cached_property
    def done_ids(self) -> set[str]:
        """Ids not to ask again: rows and rejects that retrying cannot change.

        Built once: the state is read from the shards at the start and not changed after. Built at
        each use, the stream's test of every source row made a resume's walk quadratic in the rows
        done (a million done: hours before the first request)."""
        return self.row_ids | self.final_reject_ids

    def add_reject(
        self,
        record_id: str,
        retryable: bool,
        prompt_hash: str | None = None,
        stage: str | None = None,
        reason: str | None = None,
    ) -> None:
        """One reject read from a shard: a final one also holds its prompt's dedup key, and one of a
        source row no format could read (stage ``convert``) is not a record."""
        if retryable:
            self.retryable_reject_ids.add(record_id)
            self.retryable_reasons[record_id] = reason or ""
            return
        self.final_reject_ids.add(record_id)
        if prompt_hash:
            self.prompt_hashes.add(prompt_hash)
        if stage == "convert":
            self.source_reject_ids.add(record_id)

    @property
    def records_done(self) -> int:
        """Records the category holds for good: a resume counts them toward its ``limit`` before it
        takes any prompt, since which category takes a prompt two of them hold may change from one
        start to the next (see ``flows/run/prompt_stream.py``)."""
        return len(self.done_ids - self.source_reject_ids)

    @property
    def effective_reject_ids(self) -> set[str]:
        """Rejects still standing: an id later answered on resume is no longer a reject."""
        return (self.final_reject_ids | self.retryable_reject_ids) - self.row_ids


def _asked_cap(sampling: str | None) -> int | None:
    """The ``max_tokens`` a row's request was sent with (its ``sampling`` column), None if unreadable."""
    try:
        cap = json.loads(sampling or "{}").get("max_tokens")
    except (ValueError, AttributeError):
        return None
    return cap if isinstance(cap, int) else None


def key_version(manifest: dict[str, Any] | None) -> int:
    """The run's dedup key version: the new one for a run not made yet, the first for a manifest
    written before the key had versions."""
    if manifest is None:
        return KEY_VERSION
    return int(manifest.get(PROMPT_KEY_VERSION, FIRST_KEY_VERSION))


class RunStore:
    """One run's location: manifest, per-category row and reject shards, quarantine for bad files.

    ``location`` is a local path or an fsspec URL. ``part`` (a run split across machines) names this
    process's shards and scopes its clean-up; reading is always the union of every part's shards:
    the done-set of other parts' ids costs little and keeps each part's walk of the prompts the same
    as everyone's (see ``flows/run/prompt_stream.py``).
    """

    def __init__(self, location: str | os.PathLike[str], part: Part | None = None) -> None:
        self.location = check_location(str(location))
        self.fs, self.root = fsspec.core.url_to_fs(self.location)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.part = part

    # -- layout ----------------------------------------------------------------------------------
    def _path(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    def data_dir(self, category: str | None = None) -> str:
        return self._path(DATA_DIR, *([category] if category else []))

    def rejects_dir(self, category: str | None = None) -> str:
        return self._path(REJECTS_DIR, *([category] if category else []))

    @property
    def manifest_path(self) -> str:
        return self._path(MANIFEST)

    def url(self, path: str | None = None) -> str:
        """A path of this store as people and other tools (``datasets``, ``datagen status``) take it."""
        path = self.root if path is None else path
        return path if self.local else self.fs.unstrip_protocol(path)

    # -- bytes -----------------------------------------------------------------------------------
    def _put(self, path: str, data: bytes) -> None:
        if self.local:
            writer = f"{self.part.label}-" if self.part is not None else ""
            with atomic_file(Path(path), writer=writer) as handle:
                handle.write(data)
        else:
            self.fs.pipe_file(path, data)

    def write_parquet(self, table: pa.Table, path: str) -> None:
        if self.local:  # streamed into the temporary file: no copy of the shard in memory
            write_parquet_atomically(table, Path(path))
            return
        buffer = io.BytesIO()
        pq.write_table(table, buffer, **SHARD_WRITE)
        self._put(path, buffer.getvalue())

    def shard_files(self, folder: str) -> list[str]:
        """Finished shards only, every part's: temporary files are never part of the data."""
        if not self.fs.isdir(folder):
            return []
        names = (posixpath.basename(p) for p in self.fs.ls(folder, detail=False))
        return sorted(
            posixpath.join(folder, n) for n in names if n.startswith("part-") and n.endswith(".parquet")
        )

    def parquet_file(self, path: str) -> pq.ParquetFile:
        """A shard opened for reading in batches (the export streams rows through it)."""
        source = path if self.local else self.fs.open(path, "rb")
        return pq.ParquetFile(source, page_checksum_verification=True)

    # -- manifest --------------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        if not self.fs.exists(self.manifest_path):
            return None
        return json.loads(self.fs.cat_file(self.manifest_path).decode("utf-8"))

    def open_run(
        self,
        fingerprint: str,
        snapshot: dict[str, Any],
        *,
        force: bool = False,
        fingerprinted: dict[str, Any] | None = None,
        earlier: Collection[str] = (),
    ) -> bool:
        """Create or reopen the run; refuse to mix data of another config unless ``force``.

        ``fingerprinted`` (what the fingerprint hashes) is kept in the manifest, so that a refusal
        names the fields that changed (a run made before it was kept is refused by hash alone).
        ``earlier``: this config's fingerprints as earlier versions hashed it; a run carrying one
        resumes, and carries the fingerprint of now from then on.

        A run split into parts records its number of parts; a start with another number (or none)
        is refused, since the same id would then belong to two parts. Parts starting at the same
        moment may each rewrite the manifest; the last rename wins and one ``history`` line can be
        lost, never the data. Returns True when an existing run is resumed.

        A new run records the dedup key version it uses; an existing one keeps its own (also with
        ``force``: the rows already there hold keys of that version).
        """
        self.fs.makedirs(self.root, exist_ok=True)
        manifest = self.read_manifest()
        resumed = manifest is not None
        known = {fingerprint, *earlier}
        if manifest is not None and manifest.get("fingerprint") not in known and not force:
            kept = manifest.get("fingerprinted")
            changed = describe_changes(kept, fingerprinted) if kept and fingerprinted else []
            raise FingerprintMismatch(
                f"{self.url()} was generated with another prompt/sampling config "
                f"(fingerprint {manifest.get('fingerprint')}, now {fingerprint})"
                + (f": {'; '.join(changed)}" if changed else "")
                + ". Use a new run name, or pass --force to add rows made with the new config to this run."
            )
        parts = self.part.count if self.part is not None else None
        if manifest is not None and manifest.get("parts") != parts:
            written = f"in {manifest.get('parts')} parts" if manifest.get("parts") else "without --part"
            wanted = f"--part i/{parts}" if parts else "no --part"
            raise PartsMismatch(
                f"{self.url()} was written {written}, now {wanted}: run every part with the same K "
                "(or use a new run name); another K would give some ids to two parts"
            )
        version = key_version(manifest)
        if version not in KEY_VERSIONS:
            raise KeyVersionUnknown(
                f"{self.url()} keys its prompts with dedup key version {version}, which this version of "
                f"eagle-datagen does not know (it knows {', '.join(map(str, sorted(KEY_VERSIONS)))}): resume "
                "it with the version that started it, or use a new run name"
            )
        self.remove_temporary_files()  # after the checks: a refused start touches nothing
        history = list(manifest.get("history", [])) if manifest else []
        start = {"fingerprint": fingerprint, "started_at": datetime.now(UTC).isoformat()}
        if self.part is not None:
            start["part"] = str(self.part)
        history.append(start)
        document = {
            "fingerprint": fingerprint,
            "created_at": manifest.get("created_at") if manifest else datetime.now(UTC).isoformat(),
            "config": snapshot,
            **({"fingerprinted": fingerprinted} if fingerprinted is not None else {}),
            "history": history,
            **({"parts": parts} if parts else {}),
            PROMPT_KEY_VERSION: version,
        }
        self._put(self.manifest_path, json.dumps(document, indent=2, sort_keys=True, default=str).encode())
        return resumed

    def prompt_key_version(self) -> int:
        """The dedup key version of this run's ``prompt_hash`` (what a new run uses, before one is made)."""
        return key_version(self.read_manifest())

    def remove_temporary_files(self) -> int:
        """Leftovers of a killed writer: never data, always safe to delete.

        A part removes only its own: another part may be writing one of its temporary files now.
        """
        prefix = TMP_PREFIX + (self.part.label if self.part is not None else "")
        removed = 0
        for path in self.fs.find(self.root):
            if posixpath.basename(path).startswith(prefix):
                self.fs.rm_file(path)
                removed += 1
        return removed

    # -- reading ---------------------------------------------------------------------------------
    def _read_columns(self, path: str, columns: list[str]) -> pa.Table | None:
        """Read a few columns; a shard that cannot be read is quarantined (its ids get redone).

        Over a network (an fsspec URL) a read is tried ``REMOTE_READ_ATTEMPTS`` times first: a
        connection reset at a start would otherwise have moved a good shard aside and paid for its
        rows again; a damaged shard fails every time."""
        read = functools.partial(
            pq.read_table,
            path,
            columns=columns,
            filesystem=None if self.local else self.fs,
            page_checksum_verification=True,
        )
        try:
            if self.local:
                return read()
            return Retrying(
                stop=stop_after_attempt(REMOTE_READ_ATTEMPTS),
                wait=wait_exponential(multiplier=REMOTE_READ_WAIT_S),
                retry=retry_if_exception_type((OSError, pa.ArrowException)),
                reraise=True,
            )(read)
        except (OSError, pa.ArrowException) as error:
            self.quarantine(path, error)
            return None

    def quarantine(self, path: str, error: Exception) -> str:
        """Move an unreadable shard out of the data (into ``quarantine/<category>/``): the next start
        no longer finds its ids, so it asks them again. Returns the folder it went to.

        A rejects shard keeps ``rejects-`` before its name: a category's rows and rejects shards are
        numbered apart and may share a name, and the second moved would replace the first.

        A shard already gone was moved aside by another reader of the run between this reader's
        listing and its move (a part starting beside `datagen status` or an export, which found it
        unreadable too): it is out of the data all the same, so this reader goes on, where the
        move's ``FileNotFoundError`` stopped the status, the start or the export with a traceback."""
        folder = posixpath.dirname(path)
        target = self._path(QUARANTINE_DIR, posixpath.basename(folder))
        kind = posixpath.basename(posixpath.dirname(folder))
        name = posixpath.basename(path) if kind == DATA_DIR else f"{kind}-{posixpath.basename(path)}"
        self.fs.makedirs(target, exist_ok=True)
        try:
            self.fs.mv(path, posixpath.join(target, name))
        except FileNotFoundError:
            if self.fs.exists(path):
                raise
            log.info("shard %s was moved out of the data by another reader meanwhile", path)
            return target
        log.warning(
            "unreadable shard %s moved to %s (%s): a start asks its prompts again",
            path,
            target,
            error,
            extra=SAY,
        )
        return target

    def shard_tables(self, folder: str, columns: list[str]) -> Iterator[tuple[str, pa.Table]]:
        """(path, columns) of each readable shard of ``folder``: a path names the part that wrote it."""
        for path in self.shard_files(folder):
            table = self._read_columns(path, columns)
            if table is not None:
                yield path, table

    def category_state(self, category: str) -> CategoryState:
        state = CategoryState()
        for _, table in self.shard_tables(self.data_dir(category), ["id", "prompt_hash"]):
            state.row_ids.update(table.column("id").to_pylist())
            state.prompt_hashes.update(h for h in table.column("prompt_hash").to_pylist() if h)
        columns = ["id", "retryable", "prompt_hash", "stage", "reason"]
        for _, table in self.shard_tables(self.rejects_dir(category), columns):
            for rid, retryable, key, stage, reason in zip(
                *(table.column(name).to_pylist() for name in columns), strict=True
            ):
                state.add_reject(rid, retryable, key, stage, reason)
        return state

    def recent_answers(self, category: str, max_tokens: int, count: int) -> list[int]:
        """Output tokens of the category's latest ``count`` answers asked with ``max_tokens`` in one
        request, oldest first: what the adaptive law learns answers' lengths from, for a resume to
        start from them rather than from every answer at its cap (``CategoryDemand.seed``).

        Read from the newest shards back, only as many as hold them. An answer asked with another cap
        (the config's was changed, or a long prompt's was lowered to fit the context) or in several
        requests (a multi-turn regeneration: its usage is the sum) says nothing of one request's
        length under this cap, so it is left out."""
        answers: list[int] = []
        for path in reversed(self.shard_files(self.data_dir(category))):
            table = self._read_columns(path, ["usage", "requests", "sampling"])
            if table is None:
                continue
            rows = zip(
                table.column("usage").combine_chunks().field("completion_tokens").to_pylist(),
                table.column("requests").to_pylist(),
                table.column("sampling").to_pylist(),
                strict=True,
            )
            answers.extend(
                tokens
                for tokens, requests, sampling in reversed(list(rows))
                if requests == 1 and tokens is not None and _asked_cap(sampling) == max_tokens
            )
            if len(answers) >= count:
                break
        return answers[:count][::-1]

    def categories_on_disk(self) -> list[str]:
        names: set[str] = set()
        for base in (self.data_dir(), self.rejects_dir()):
            if self.fs.isdir(base):
                names.update(
                    posixpath.basename(entry["name"].rstrip("/"))
                    for entry in self.fs.ls(base, detail=True)
                    if entry["type"] == "directory"
                )
        return sorted(names)

    def iter_row_columns(self, category: str, columns: list[str]) -> Iterator[dict[str, Any]]:
        for _, table in self.shard_tables(self.data_dir(category), columns):
            yield from table.to_pylist()

    # -- writing ---------------------------------------------------------------------------------
    def row_writer(self, category: str, *, flush_rows: int, flush_seconds: float) -> ShardWriter:
        return ShardWriter(
            self,
            self.data_dir(category),
            shard_schema("row"),
            flush_rows=flush_rows,
            flush_seconds=flush_seconds,
        )

    def reject_writer(self, category: str, *, flush_rows: int, flush_seconds: float) -> ShardWriter:
        return ShardWriter(
            self,
            self.rejects_dir(category),
            shard_schema("reject"),
            flush_rows=flush_rows,
            flush_seconds=flush_seconds,
        )
