"""Peak memory of streaming a large local prompt file through the real pipeline stream (issue 3).

Claim under test: reading prompts keeps memory flat, whatever the file size, because rows are read,
converted and dropped one at a time (``prompts.readers`` + ``flows.run.prompt_stream.category_items``).
What does grow, by design, is one entry per prompt in the stream's ``seen`` id set and in the
dedup index (that is what makes a prompt asked once); the bench estimates those two structures so
the rest of the growth can be judged on its own.

Each case runs in a fresh subprocess, because ``ru_maxrss`` is a high-water mark of the whole
process: measured in one process, the first case would set the peak for all the others. Each case
runs twice, on N rows and on a baseline of N/100 rows, and memory is reported as a ratio to the
baseline; the "naive" case (every line ``json.loads``-ed into a list) shows what not flat looks like.

Run: ``uv run python -m bench.stream_memory [--rows 1000000]``; results go in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROWS = 1_000_000
BASELINE_DIVISOR = 100
_PARQUET_BATCH = 50_000
_MIB = 1024 * 1024
_WIDTH = 130  # the table's nine columns unwrapped, also when the output is piped to a file
_VOCABULARY = (
    "model cache token request server memory stream prompt answer question data value function "
    "result system network python table index batch queue thread process file record schema "
    "vector matrix graph tree node edge weight layer kernel device buffer string number list "
    "explain describe compare write implement design summarize translate improve analyse why "
    "how what when which should could would the a of to and in for with on by from about"
)
_WORDS = _VOCABULARY.split()


# --- the source file -------------------------------------------------------------------------------


def synthetic_row(index: int, rng: random.Random) -> dict[str, Any]:
    """One UltraChat-layout row (prompt, prompt_id, messages), about 430 characters of message text.

    The row number is part of the question so no two rows are duplicates: dedup must not shrink
    the stream, or the bench would measure fewer prompts than it claims.
    """
    question = f"Question {index}: " + " ".join(rng.choices(_WORDS, k=22)) + "?"
    answer = " ".join(rng.choices(_WORDS, k=45)) + "."
    return {
        "prompt": question,
        "prompt_id": hashlib.sha256(str(index).encode()).hexdigest(),
        "messages": [{"content": question, "role": "user"}, {"content": answer, "role": "assistant"}],
    }


def synthetic_rows(count: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    return (synthetic_row(index, rng) for index in range(count))


def write_sources(directory: Path, rows: int) -> tuple[Path, Path]:
    """A JSONL file of ``rows`` rows and a parquet copy, both written in batches (flat here too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    schema = pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()), ("messages", pa.list_(message))])
    jsonl, parquet = directory / "rows.jsonl", directory / "rows.parquet"
    generated = synthetic_rows(rows)
    with jsonl.open("w", encoding="utf-8") as text, pq.ParquetWriter(parquet, schema) as writer:
        while batch := list(islice(generated, _PARQUET_BATCH)):
            text.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in batch)
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return jsonl, parquet


# --- what runs in each child process ----------------------------------------------------------------


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    Linux's ``VmHWM`` first: ``ru_maxrss`` survives ``execve`` and starts from the parent's RSS at
    fork, so in a child of a 300 MiB parent it reads at least 300 MiB whatever the child did.
    ``ru_maxrss`` elsewhere (macOS reports it in bytes, Linux in KiB).
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def id_structures_bytes(ids: int, id_bytes: int, keys: int, key_bytes: int) -> int:
    """An estimate of what the stream keeps per prompt: the ``seen`` id set and the dedup index.

    Called after the peak was read: it builds same-sized containers to measure them, which must
    not count in the peak it explains.
    """
    seen = sys.getsizeof(set(map(str, range(ids))))
    owners = sys.getsizeof(dict.fromkeys(map(str, range(keys)), ""))
    return seen + id_bytes + owners + keys * key_bytes


def stream_child(path: Path, rows: int) -> dict[str, Any]:
    """Stream ``rows`` rows of ``path`` through ``category_items``, as a run's category does."""
    # Imported here: the naive child must not carry the pipeline's imports in its baseline.
    from flows.config import CategoryConfig
    from flows.run.prompt_stream import Ask, StreamCounts, category_items, source_rows
    from flows.store.run_store import CategoryState
    from prompts.dedup import DedupIndex, prompt_key

    category = CategoryConfig(name="bench", source=str(path), format="messages")
    counts, dedup = StreamCounts(), DedupIndex()
    taken = id_bytes = 0
    started = time.perf_counter()
    opened = islice(source_rows(category), rows)
    for item in category_items(category, CategoryState(), counts, opened, dedup=dedup):
        if isinstance(item, Ask):
            taken += 1
            id_bytes += sys.getsizeof(item.record.id)
    seconds = time.perf_counter() - started
    peak = peak_rss_bytes()
    kept = id_structures_bytes(taken, id_bytes, len(dedup), sys.getsizeof(prompt_key([])))
    return {"rows": counts.read, "seconds": seconds, "peak_rss": peak, "id_bytes": kept}


def naive_child(path: Path, rows: int) -> dict[str, Any]:
    """What flat is measured against: the whole file parsed into a list first."""
    started = time.perf_counter()
    with path.open("rb") as handle:
        loaded = [json.loads(line) for line in islice(handle, rows)]
    seconds = time.perf_counter() - started
    return {
        "rows": len(loaded),
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "id_bytes": 0,
    }


CHILDREN: dict[str, Callable[[Path, int], dict[str, Any]]] = {"stream": stream_child, "naive": naive_child}


# --- the parent: cases, subprocesses, the table -----------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    child: str
    path: Path
    rows: int


@dataclass(frozen=True)
class Measurement:
    case: Case
    rows: int
    seconds: float
    peak_rss: int
    id_bytes: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


Spawn = Callable[[Case], dict[str, Any]]


def run_child(case: Case) -> dict[str, Any]:
    """One case in a fresh interpreter, so its peak RSS is its own."""
    command = [sys.executable, "-m", "bench.stream_memory", "--child", case.child, "--path", str(case.path)]
    done = subprocess.run(
        [*command, "--rows", str(case.rows)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case.name} ({case.rows} rows) failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cases(jsonl: Path, parquet: Path, rows: int) -> list[tuple[Case, Case]]:
    """(baseline, full) pairs: N/100 and N rows of the same file, for each way of reading it."""
    baseline = max(rows // BASELINE_DIVISOR, 1)
    kinds = [
        ("stream jsonl", "stream", jsonl),
        ("stream parquet", "stream", parquet),
        ("naive list", "naive", jsonl),
    ]
    return [(Case(n, c, p, baseline), Case(n, c, p, rows)) for n, c, p in kinds]


def measure(
    pairs: Sequence[tuple[Case, Case]], spawn: Spawn = run_child
) -> list[tuple[Measurement, Measurement]]:
    """Run every case, one at a time (cases in parallel would compete for the same two cores)."""

    def one(case: Case) -> Measurement:
        raw = spawn(case)
        return Measurement(case, raw["rows"], raw["seconds"], raw["peak_rss"], raw["id_bytes"])

    return [(one(baseline), one(full)) for baseline, full in pairs]


def _mib(value: float) -> str:
    return f"{value / _MIB:,.1f}"


def results_table(results: Sequence[tuple[Measurement, Measurement]]) -> Table:
    table = Table("case")
    for column in ("rows", "seconds", "rows/s", "peak RSS MiB", "× base", "id sets MiB", "peak − ids MiB"):
        table.add_column(column, justify="right")
    table.add_column("× base excl. ids", justify="right")
    for pair in results:
        base = pair[0]
        for m in pair:
            rest, base_rest = m.peak_rss - m.id_bytes, base.peak_rss - base.id_bytes
            table.add_row(
                m.case.name,
                f"{m.rows:,}",
                f"{m.seconds:,.1f}",
                f"{m.rows_per_s:,.0f}",
                _mib(m.peak_rss),
                f"{m.peak_rss / base.peak_rss:.2f}",
                _mib(m.id_bytes),
                _mib(rest),
                f"{rest / base_rest:.2f}",
            )
    return table


def growth_lines(results: Sequence[tuple[Measurement, Measurement]]) -> list[str]:
    """For each streaming case: how much of the RSS growth the per-prompt id structures explain."""
    lines = []
    for base, full in results:
        growth = full.peak_rss - base.peak_rss
        ids = full.id_bytes - base.id_bytes
        if ids <= 0:
            continue
        share = f"{ids / growth:.0%}" if growth > 0 else "all"
        lines.append(
            f"{full.case.name}: +{_mib(growth)} MiB from {base.rows:,} to {full.rows:,} rows; "
            f"the seen-id set and dedup index account for {_mib(ids)} MiB of it ({share}), "
            f"{ids / max(full.rows - base.rows, 1):.0f} bytes per prompt"
        )
    return lines


def run_bench(rows: int, console: Console, spawn: Spawn = run_child) -> list[tuple[Measurement, Measurement]]:
    with tempfile.TemporaryDirectory(prefix="stream-memory-") as tmp:
        started = time.perf_counter()
        jsonl, parquet = write_sources(Path(tmp), rows)
        size = jsonl.stat().st_size
        console.print(
            f"wrote {rows:,} rows ({_mib(size)} MiB JSONL + parquet) in {time.perf_counter() - started:.1f} s"
        )
        results = measure(cases(jsonl, parquet, rows), spawn)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    console.print(f"streaming memory, {when}, {machine}")
    console.print(results_table(results))
    for line in growth_lines(results):
        console.print(line, soft_wrap=True)
    console.print(f"reproduce: uv run python -m bench.stream_memory --rows {rows}")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stream_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows in the generated file")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](args.path, args.rows)))
        return
    run_bench(args.rows, Console(width=_WIDTH))


if __name__ == "__main__":
    main()
