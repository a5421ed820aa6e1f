"""The client's CPU per request: `datagen run` beside a minimal aiohttp client, on one pinned core.

    uv run python -m bench.client_cpu [--prompts 10000] [--endpoints 1,2,4] [--repeats 2]

The simulator is made nearly instant (time scale 0.001, stream interval 0.001), so what a run costs
is the client's own CPU. Every client is a fresh child process pinned to one core (the start-up is
counted: imports, config, the store), the simulators are pinned to the other cores, and the CPU of
each child is read from ``os.wait4``'s rusage. Three clients send the same prompts (max_tokens 128,
``limit`` in flight per endpoint):

- ``minimal``: one aiohttp session posting the requests and parsing the JSON answers; no
  conversion, no store: the floor any client pays for HTTP and JSON; ``minimal stream`` the same
  with ``stream = true``, parsing every SSE chunk (what any client pays per streamed token);
- ``datagen``: ``datagen run --no-prefect`` (prompt stream -> request -> row -> parquet shard),
  non-streaming, and the same with ``stream = true``.

Settings are interleaved and repeated (the machine is shared), with a nice-19 spinner on the client
core in every setting alike (``bench/spinner.py``); the table gives each one's median.
"rows/CPU-s" is what one core sustains (rows over the child's user+sys seconds); "rows/s" is over
wall time, start-up included, and is bounded by the simulators when they share few cores. A
``datagen`` run on the first 1 % of the prompts measures a run's fixed CPU (start-up, report, close);
the goal line also gives the rate once started: the extra rows over the extra CPU of the full run.
``--startup`` also prints where a `datagen run` spends its start-up (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.spinner import busy_core
from prompts.synthetic import write_synthetic_prompts

LIMIT = 256
MAX_TOKENS = 128


@dataclass(frozen=True)
class Measure:
    """One child process: rows it produced, wall seconds, CPU seconds (user + sys)."""

    rows: int
    wall_s: float
    cpu_s: float


def _cores() -> tuple[int, set[int]]:
    """The core the clients get, and the cores the simulators get (the rest; the same one if alone)."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[0], set(cores[1:]) or {cores[0]}


def run_child(argv: list[str], client_core: int, env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``argv`` pinned to ``client_core``: wall seconds, CPU seconds (user + sys), its stderr."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, {client_core}),
    )
    assert proc.stderr is not None
    errors = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} exited {os.waitstatus_to_exitcode(status)}:\n{errors[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, errors


def child_env(cache: Path) -> dict[str, str]:
    """The children's environment: bytecode cached under ``cache``, as an installed tool runs
    (a sandbox's PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module at every start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def run_minimal(
    urls: list[str], source: Path, client_core: int, env: dict[str, str], out: Path, *, stream: bool
) -> Measure:
    """The minimal aiohttp client in a child process."""
    mode = "stream" if stream else "whole"
    argv = [sys.executable, "-m", "bench.client_cpu", "--minimal-child", mode, str(source), str(out), *urls]
    wall, cpu, _ = run_child(argv, client_core, env)
    return Measure(int(out.read_text()), wall, cpu)


def run_datagen(
    urls: list[str], source: Path, client_core: int, env: dict[str, str], out: Path, *, stream: bool
) -> Measure:
    """``datagen run --no-prefect`` in a child process, on a fresh output directory."""
    endpoints = "".join(
        f'[[endpoints]]\nurl = "{url}"\nmodel = "sim-model"\nstream = {str(stream).lower()}\n\n'
        for url in urls
    )
    config = out / "run.toml"
    out.mkdir(parents=True)
    config.write_text(
        f'[run]\nname = "bench"\noutput_dir = "{out}"\n\n{endpoints}'
        f"[concurrency]\nlimit = {LIMIT}\n\n[generation]\nmax_tokens = {MAX_TOKENS}\n\n"
        f'[[categories]]\nname = "bench"\nsource = "{source}"\nformat = "messages"\n'
    )
    argv = [sys.executable, "-m", "flows.cli", "run", str(config), "--no-prefect"]
    wall, cpu, _ = run_child(argv, client_core, env)
    summary = json.loads((out / "bench" / "summary.json").read_text())
    return Measure(int(summary["rows"]), wall, cpu)


async def _minimal(source: Path, urls: list[str], stream: bool) -> int:
    """Post every prompt of ``source``, ``LIMIT`` in flight per endpoint, round robin; count the
    answers (streamed: every ``data:`` line parsed, the content pieces joined)."""
    import aiohttp  # here: the parent process never needs it

    gates = [asyncio.Semaphore(LIMIT) for _ in urls]
    answered = 0
    connector = aiohttp.TCPConnector(limit=LIMIT * len(urls))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(index: int, row: dict[str, object]) -> None:
            nonlocal answered
            body = {
                "model": "sim-model",
                "messages": row["messages"],
                "max_tokens": MAX_TOKENS,
                "stream": stream,
            }
            url = urls[index % len(urls)]
            async with gates[index % len(urls)]:
                for attempt in range(3):
                    # The one retry any client needs: a kept-alive connection the server closed.
                    try:
                        async with session.post(f"{url}/v1/chat/completions", json=body) as reply:
                            text = await (_streamed(reply) if stream else _whole(reply))
                        break
                    except aiohttp.ServerDisconnectedError:
                        if attempt == 2:
                            raise
            answered += bool(text)

        with source.open(encoding="utf-8") as lines:
            await asyncio.gather(*(one(i, json.loads(line)) for i, line in enumerate(lines)))
    return answered


async def _whole(reply: Any) -> str:
    answer = await reply.json()
    return str(answer["choices"][0]["message"]["content"])


async def _streamed(reply: Any) -> str:
    pieces = []
    async for line in reply.content:
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                pieces.append(choice["delta"].get("content") or "")
    return "".join(pieces)


def _table(results: dict[str, list[Measure]], title: str) -> None:
    """The medians, each client's CPU per row against the minimal client's (same endpoints, same
    mode), and the issue's three goals, measured in this invocation, met or not."""
    from rich.console import Console
    from rich.table import Table

    def median(name: str, key: str) -> float:
        return statistics.median(getattr(m, key) for m in results[name])

    def per_row(name: str) -> float:
        return median(name, "cpu_s") / median(name, "rows")

    table = Table(title=title)
    for column in (
        "client",
        "rows",
        "wall s",
        "CPU s",
        "rows/s",
        "rows/CPU-s",
        "CPU ms/row",
        "× minimal CPU",
    ):
        table.add_column(column, justify="left" if column == "client" else "right")
    for name in results:
        client, where = name.split(" @ ")
        if client == FEW:
            continue
        rows, wall, cpu = median(name, "rows"), median(name, "wall_s"), median(name, "cpu_s")
        floor = f"minimal aiohttp{' stream' * client.endswith('stream')} @ {where}"
        table.add_row(
            name,
            f"{rows:,.0f}",
            f"{wall:.2f}",
            f"{cpu:.2f}",
            f"{rows / wall:,.0f}",
            f"{rows / cpu:,.0f}",
            f"{1000 * cpu / rows:.2f}",
            f"{per_row(name) / per_row(floor):.2f}x",
        )
    Console(width=140).print(table)
    for where in sorted({name.split(" @ ")[1] for name in results}):
        whole, minimal = f"datagen @ {where}", f"minimal aiohttp @ {where}"
        few = f"{FEW} @ {where}"
        rows_after = median(whole, "rows") - median(few, "rows")
        started = median(few, "cpu_s")
        goals = [
            f"{1 / per_row(whole):,.0f} rows per CPU-second with start-up, "
            f"{rows_after / (median(whole, 'cpu_s') - started):,.0f} once started "
            f"(goal >= 1,000; a run's start-up and close {started:.2f} CPU s)",
            f"{per_row(whole) / per_row(minimal):.2f}x the minimal client's CPU per row (goal <= 3x)",
        ]
        if f"datagen stream @ {where}" in results:
            ratio = per_row(f"datagen stream @ {where}") / per_row(whole)
            goals.append(f"streaming {ratio:.2f}x non-streaming (goal <= 2x)")
        print(f"datagen @ {where}: " + "; ".join(goals))


FEW = "datagen, 1 % of the prompts"
"""The run whose CPU is a run's fixed cost (start-up, report, close), subtracted for the rate once started."""

# The packages whose first import a start-up pays for, in the order `datagen run` meets them.
HEAVY = ("typer", "rich", "pydantic", "openai", "aiohttp", "tenacity", "pyarrow", "pandas", "datasets")


def _startup(client_core: int, env: dict[str, str]) -> None:
    """Where `datagen run`'s start-up goes: CPU of the bare interpreter, of ``import flows.cli.main``
    with and without bytecode caches, and each heavy package's cumulative import time."""
    _, bare, _ = run_child([sys.executable, "-c", "pass"], client_core, env)
    no_caches = {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": os.devnull}
    _, uncached, _ = run_child([sys.executable, "-c", "import flows.cli.main"], client_core, no_caches)
    argv = [sys.executable, "-X", "importtime", "-c", "import flows.cli.main"]
    _, cached, report = run_child(argv, client_core, env)
    cumulative: dict[str, int] = {}
    for line in report.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[1].strip().isdigit():
            cumulative.setdefault(fields[2].strip(), int(fields[1]))
    print(
        f"start-up CPU: python alone {bare:.2f} s; import flows.cli.main {cached:.2f} s with bytecode "
        f"caches, {uncached:.2f} s without (PYTHONDONTWRITEBYTECODE=1 compiles every module at every start)"
    )
    print("first imports, cumulative (-X importtime; each includes what it pulls in first):")
    for name in HEAVY:
        if name in cumulative:
            print(f"  {cumulative[name] / 1e6:6.3f} s  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--endpoints", default="1", help="comma-separated endpoint counts, e.g. 1,2,4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-stream", action="store_true", help="leave out the streaming runs")
    parser.add_argument("--startup", action="store_true", help="also show where the start-up goes")
    parser.add_argument("--minimal-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.minimal_child:
        mode, source, result, *urls = args.minimal_child
        Path(result).write_text(str(asyncio.run(_minimal(Path(source), urls, mode == "stream"))))
        return
    from sglang_launch.simulator import SimConfig, SimulatorProcess

    client_core, sim_cores = _cores()
    counts = [int(n) for n in args.endpoints.split(",")]
    results: dict[str, list[Measure]] = {}
    numbers = itertools.count()
    with busy_core(client_core), tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "prompts.jsonl"
        write_synthetic_prompts(source, args.prompts, max_words=200)
        # The same run on the first 1 % of the prompts: its CPU is the start-up and close-down a run
        # pays once, so the difference to the full run is what each further row costs.
        few = Path(tmp) / "few.jsonl"
        with source.open(encoding="utf-8") as lines:
            few.write_text("".join(itertools.islice(lines, max(args.prompts // 100, 1))), encoding="utf-8")
        env = child_env(Path(tmp) / "pycache")
        # Warm the bytecode cache once, so no measured run pays for compiling.
        run_child([sys.executable, "-c", "import flows.cli.main, flows.runner, aiohttp"], client_core, env)
        sims = [
            SimulatorProcess(
                SimConfig(time_scale=0.001, stream_interval_s=0.001, log_level="warning")
            ).start()
            for _ in range(max(counts))
        ]
        try:
            for sim in sims:
                os.sched_setaffinity(sim.pid, sim_cores)
            for repeat in range(args.repeats):
                for count in counts:
                    urls = [sim.url for sim in sims[:count]]
                    where = f"{count} endpoint{'s' * (count > 1)}"
                    runs: dict[str, Callable[[Path], Measure]] = {
                        f"minimal aiohttp @ {where}": partial(
                            run_minimal, urls, source, client_core, env, stream=False
                        ),
                        f"datagen @ {where}": partial(
                            run_datagen, urls, source, client_core, env, stream=False
                        ),
                        f"{FEW} @ {where}": partial(run_datagen, urls, few, client_core, env, stream=False),
                    }
                    if not args.no_stream:
                        runs[f"minimal aiohttp stream @ {where}"] = partial(
                            run_minimal, urls, source, client_core, env, stream=True
                        )
                        runs[f"datagen stream @ {where}"] = partial(
                            run_datagen, urls, source, client_core, env, stream=True
                        )
                    order = list(runs.items())
                    for name, runner in order if repeat % 2 == 0 else reversed(order):
                        measure = runner(Path(tmp) / f"run-{next(numbers)}")
                        results.setdefault(name, []).append(measure)
                        print(
                            f"{name}: {measure.rows} rows, {measure.wall_s:.2f} s, {measure.cpu_s:.2f} CPU s",
                            flush=True,
                        )
        finally:
            for sim in sims:
                sim.stop()
        ordered = {name: results[name] for name in sorted(results, key=lambda n: (n.split(" @ ")[1], n))}
        title = (
            f"{args.prompts:,} prompts, max_tokens {MAX_TOKENS}, limit {LIMIT}, client on core {client_core}"
        )
        _table(ordered, title)
        if args.startup:
            _startup(client_core, env)
    print(
        "reproduce: uv run python -m bench.client_cpu "
        f"--prompts {args.prompts} --endpoints {args.endpoints} --repeats {args.repeats}"
        + " --no-stream" * args.no_stream
        + " --startup" * args.startup
    )


if __name__ == "__main__":
    main()
