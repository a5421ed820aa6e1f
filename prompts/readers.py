"""Streaming readers: every prompt source becomes ``(row index, row dict)`` pairs, one at a time.

Prompt sets run to millions of rows, so nothing here holds a whole source in memory (the single
exception is a ``.json`` file, which is one document by nature). A line that is not valid JSON does
not stop a run and is not skipped either: it is yielded as an ``INVALID_KEY`` marker row that
``prompts.formats.to_record`` turns into a ``ConversionError``, so it lands in the rejects table
with its line number. Row indices count every row yielded (markers included) and run on across the
files of a directory, so ``(dataset, split, row)`` points back at one input row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from prompts.formats import INVALID_KEY

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_PARQUET_BATCH_ROWS = 1024

Row = dict[str, Any]
DataFiles = str | Sequence[str] | dict[str, str | Sequence[str]] | None


def looks_local(source: str) -> bool:
    """A path the user meant as a file: used to fail fast instead of asking the Hub for it."""
    return source.startswith(("/", "./", "../", "~")) or source.endswith(LOCAL_SUFFIXES)


def missing_local(source: str) -> bool:
    """A source meant as a local path that is not there (checked before a run spends anything)."""
    return looks_local(source) and not Path(source).expanduser().exists()


def _invalid(where: str, why: str) -> Row:
    return {INVALID_KEY: f"{where}: {why}"}


def _jsonl_rows(path: Path) -> Iterator[Row]:
    """One row per non-blank line; undecodable lines become markers naming the 1-based line number."""
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path.name} line {line_number}"
            try:
                value = json.loads(raw.decode("utf-8-sig").rstrip("\r\n"))
            except UnicodeDecodeError:
                yield _invalid(where, "invalid UTF-8")
                continue
            except json.JSONDecodeError as exc:
                yield _invalid(f"{where} column {exc.colno}", exc.msg)
                continue
            yield value if isinstance(value, dict) else _invalid(where, "not a JSON object")


def _json_rows(path: Path) -> Iterator[Row]:
    """A JSON list of objects, or ``{"data": [...]}``; a file that does not parse is a fatal error."""
    with path.open("r", encoding="utf-8-sig") as handle:
        document = json.load(handle)
    items = document.get("data") if isinstance(document, dict) else document
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of rows or an object with a 'data' list")
    for position, item in enumerate(items):
        yield (
            item if isinstance(item, dict) else _invalid(f"{path.name} item {position}", "not a JSON object")
        )


def _parquet_rows(path: Path) -> Iterator[Row]:
    """One row group at a time, batch by batch: memory stays at one row group whatever the file size.

    ``iter_batches`` over the whole file lets Arrow's pool grow to about the file's size (pyarrow 26,
    measured in bench/stream_memory.py; apache/arrow#39808); per row group it stays at one group.
    """
    parquet = pq.ParquetFile(path)
    for group in range(parquet.num_row_groups):
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group]):
            yield from batch.to_pylist()


_FILE_READERS = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}


def _file_rows(path: Path) -> Iterator[Row]:
    reader = _FILE_READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{path}: unsupported file type; expected one of {', '.join(LOCAL_SUFFIXES)}")
    return reader(path)


def _directory_files(directory: Path, data_files: DataFiles) -> list[Path]:
    """The directory's readable files in sorted order, or the files matching ``data_files`` globs."""
    if data_files is None:
        files = [p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in LOCAL_SUFFIXES]
    elif isinstance(data_files, dict):
        raise ValueError("data_files as a split mapping only applies to Hugging Face datasets")
    else:
        patterns = [data_files] if isinstance(data_files, str) else list(data_files)
        files = list({p for pattern in patterns for p in directory.glob(pattern) if p.is_file()})
    if not files:
        raise FileNotFoundError(f"{directory}: no {', '.join(LOCAL_SUFFIXES)} files to read")
    return sorted(files)


def _hub_rows(source: str, split: str, subset: str | None, data_files: DataFiles) -> Iterator[Row]:
    """A Hugging Face dataset, streamed: rows arrive as downloaded, never the whole set at once."""
    import datasets  # imported here: it is slow to import and only the Hub path needs it

    stream = datasets.load_dataset(source, name=subset, split=split, streaming=True, data_files=data_files)
    for row in stream:
        yield dict(row)


def iter_rows(
    source: str,
    *,
    split: str = "train",
    subset: str | None = None,
    data_files: DataFiles = None,
) -> Iterator[tuple[int, Row]]:
    """Stream ``(row index, row)`` from a local file, a local directory, or a Hugging Face dataset id.

    ``split`` and ``subset`` only apply to Hugging Face datasets (a local file is one split);
    ``data_files`` selects files by glob inside a local directory, or is passed to ``load_dataset``.
    """
    path = Path(source).expanduser()
    if path.is_file():
        if data_files is not None:
            raise ValueError(f"{source}: data_files does not apply to a single file")
        rows = _file_rows(path)
    elif path.is_dir():
        rows = (row for file in _directory_files(path, data_files) for row in _file_rows(file))
    elif looks_local(source):
        raise FileNotFoundError(f"{source}: no such file or directory")
    else:
        rows = _hub_rows(source, split, subset, data_files)
    yield from enumerate(rows)


def count_rows(source: str) -> int | None:
    """Rows of a local single-file source, cheaply (parquet metadata, or newlines of JSONL); None otherwise.

    Counted up front so a run's progress has a total from its first second; a JSON array or a Hub
    stream would have to be read whole, so they are not counted.
    """
    path = Path(source).expanduser()
    if not path.is_file():
        return None
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    if suffix != ".jsonl":
        return None
    lines, last = 0, b"\n"
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def dataset_label(source: str) -> str:
    """A short dataset name for ``SourceRef.dataset``: a file's stem, a directory's name, or the hub id."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.stem
    if path.is_dir():
        return path.resolve().name
    return source
