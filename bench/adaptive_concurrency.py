"""Adaptive concurrency against fixed settings on the REAL SGLang (CPU), interleaved and repeated.

    uv run python -m bench.adaptive_concurrency [--settings 8,16,32,64,128,256,adaptive] [--repeats 2]
        [--prompts 300] [--max-tokens 64,256] [--max-total-tokens 16384] [--max-running 64] [--engine sglang]

One server for the whole invocation (``../shared/engines/serve.sh``), all its processes pinned to
core 0, and the client pinned to core 1 with a nice-19 spinner on that core in every setting alike
(see ``../shared/engines/README.md``: an idle client core slows the server). Unpinned, vLLM's
engine and API processes wander onto the client's core, and a client woken a second late looks like
a slow controller. Each run is a fresh
``datagen run --no-prefect`` of the same prompts, in two categories with different ``max_tokens``.
Settings run in an interleaved order (A B C ..., then rotated), repeated; the table shows medians:

- output tok/s: the server's own generation-token counter over the seconds the run generated
  (``summary.json``'s ``seconds``: from the first prompt read to the end, without the process's
  start-up, which is the same for every setting and would pull every ratio towards 1);
- retractions (SGLang) or preemptions (vLLM) per 1,000 requests, from the server's counter;
- starved: share of 1 s samples in which the server queue was empty while KV usage was < 0.8, over
  the whole run ("starved") and while the client still had prompts to send ("starved sending": from
  the first request sent to the last, read from the rows' ``created_at - latency_s``). On a run of
  20 s the process start-up, the first fill and the drain after the last prompt are a third of the
  samples, alike for every setting; no law can feed a server from prompts it no longer has;
- warm tok/s, and starved warm: the same over the part of the run that a run of hours spends its
  time in, from the end of the first cohort (the ``N``-th answer, ``N`` the largest fixed setting of
  the invocation, 64 without one: until then every setting is still filling the server) to the last
  request sent (then every setting drains). The tokens are the server's counter read by the 1 s
  samples, interpolated at the window's edges; "warm vs best" is against the best fixed setting
  by this figure;
- server busy (SGLang): the share of those seconds the server spent in decode and prefill steps, by
  its own counters (``/v1/loads``, read before and after the run): whether an empty queue with the
  cache under 0.8 left the server idle, or it was computing all along (bound by compute, not KV);
- batch (SGLang): the mean decode batch, the requests each decode step ran, by the same counters
  (their sums over the decode steps, steps next to a prefill left out). The same prompts and answer
  lengths make the same tokens, so a setting that batches better needs fewer decode steps; unlike
  tok/s this hardly moves with the machine's speed (three runs of the law at 1,200 prompts:
  6,120-6,200 steps by SGLang's log, where their tok/s spread 16 %), and it shows an A/B's effect
  on batching that the tok/s noise hides. It is not the throughput: on these CPUs a step costs more
  the more KV tokens the batch reads;
- p50 / p99 request latency (from the rows), client CPU seconds (user + system of the run).

With ``--keep DIR`` each run's directory also holds its ``-v`` log, its 1 s server readings
(``gauges.jsonl``: what a fixed setting, which has no controller timeline, did to the server) and the
server's own log lines of the run (``server.log``: SGLang logs every prefill batch).

The last line is the ratio of adaptive to the best fixed setting in hindsight. A setting ``N@HZ``
polls the server HZ times a second during the run instead of once (``32@0``, ``32@10``): the cost
of polling on the server, measured as a throughput ratio. A setting ``LAW:NAME`` runs ``datagen``
from the source tree given by ``--tree NAME=PATH`` (a ``git worktree`` of another commit, sharing
this virtual environment): an A/B of two versions of the law on one server, interleaved like the rest
(``--settings adaptive:before,adaptive --tree before=../wt-before``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from bench.spinner import busy_core
from flows.control.signals import ServerSample, decode_moment, parse_loads, parse_metrics, rank_loads
from prompts.synthetic import write_synthetic_prompts
from sglang_launch.launcher import remove_leftover_shm, shm_files
from sglang_launch.ports import free_port

console = Console(width=180)
ENGINES = Path(__file__).resolve().parents[2] / "shared" / "engines"
MODEL = Path(os.environ.get("ENGINES_HOME", Path.home() / ".cache" / "cpu-engines")) / "tiny-llm"


@dataclass
class Outcome:
    tok_s: float
    retractions_per_1k: float
    starved: float
    starved_sending: float | None
    """None when no 1 s sample fell between the first and the last send (a run of a few seconds)."""
    p50: float
    p99: float
    cpu_s: float
    requests: int
    peak_queue: int = 0
    busy: float | None = None
    """The share of the run's time the server spent in decode and prefill steps, by its own counters
    (SGLang's ``/v1/loads``; None for vLLM): what an empty queue with a cache under 0.8 ("starved")
    does not tell, whether the server was idle."""
    batch: float | None = None
    """The mean decode batch over the run (SGLang's ``/v1/loads``; None for vLLM)."""
    warm_tok_s: float | None = None
    """Output tok/s from the end of the first cohort to the last send (``warm_window``); None for a
    run too short to have that window or samples to cover it."""
    starved_warm: float | None = None
    samples: list[ServerSample] = field(default_factory=list)


class Poller(threading.Thread):
    """The server's /metrics ``hz`` times a second while a run goes on (1 Hz for every setting unless
    a setting says ``@HZ``); above 1 Hz also ``/v1/loads``, as a client polling hard would."""

    def __init__(self, url: str, hz: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url, self.hz = url, hz
        self.samples: list[ServerSample] = []
        self.times: list[float] = []
        self.wall_offset = time.time() - time.monotonic()
        """Added to ``times``: wall-clock seconds, to set beside the rows' ``created_at``."""
        self.stop = threading.Event()

    def run(self) -> None:
        if self.hz <= 0:
            return
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(1.0 / self.hz):
                try:
                    sample = parse_metrics(client.get(f"{self.url}/metrics").text)
                    if self.hz > 1:
                        client.get(f"{self.url}/v1/loads")
                except httpx.HTTPError:
                    continue
                if sample is not None:
                    self.samples.append(sample)
                    self.times.append(time.monotonic())


def read_sample(url: str) -> ServerSample:
    sample = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    assert sample is not None, "the server serves no load metrics"
    return sample


@dataclass(frozen=True)
class StepCounters:
    """SGLang's step counters so far (``/v1/loads``)."""

    busy_us: float
    """Decode and prefill step time, the mean over DP ranks (as ``parse_loads`` reads it)."""
    decode_steps: float
    batch_sum: float
    """The decode steps' batch sizes summed; both sums over DP ranks (steps next to a prefill are left
    out of both)."""

    def since(self, before: StepCounters) -> StepCounters:
        """What the server counted between ``before`` and these."""
        return StepCounters(
            busy_us=self.busy_us - before.busy_us,
            decode_steps=self.decode_steps - before.decode_steps,
            batch_sum=self.batch_sum - before.batch_sum,
        )

    @property
    def batch(self) -> float | None:
        """The mean decode batch; None before any decode step."""
        return self.batch_sum / self.decode_steps if self.decode_steps > 0 else None


def read_step_counters(url: str) -> StepCounters | None:
    """None where the server has no such counters (vLLM, SGLang before 0.5.2x)."""
    try:
        response = httpx.get(f"{url}/v1/loads", timeout=10)
        document = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return step_counters(document) if isinstance(document, dict) else None


def step_counters(document: dict[str, Any]) -> StepCounters | None:
    sample = parse_loads(document)
    if sample is None or sample.busy_us is None:
        return None
    loads = rank_loads(document)
    return StepCounters(
        busy_us=sample.busy_us,
        decode_steps=sum(decode_moment(e, 0) or 0.0 for e in loads),
        batch_sum=sum(decode_moment(e, 1) or 0.0 for e in loads),
    )


def start_server(engine: str, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MAX_TOTAL_TOKENS": str(args.max_total_tokens), "MAX_RUNNING": str(args.max_running)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["taskset", "-c", "0", "bash", str(ENGINES / "serve.sh"), engine, str(port), str(MODEL)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    probe = "/health" if engine == "sglang" else "/v1/models"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{engine} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{engine} did not start in 300 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


Sources = list[tuple[str, Path, int]]
"""(category name, prompt file, max_tokens) per category."""


def write_config(
    path: Path, url: str, run_dir: Path, sources: Sources, setting: str, *, poll_s: float | None = None
) -> None:
    """A run config of the benchmark: ``setting`` is a fixed number in flight, ``adaptive``,
    ``adaptive-unpaced`` (the same law admitting refills at once: the A/B of the pacer),
    ``adaptive-paceF`` (pacing at F times the limit's turnover instead of 1.1), or
    ``adaptive-targetT`` (``target_kv_usage = T``: the budget's peak moves with it)."""
    lines = [
        f'[run]\nname = "{run_dir.name}"\noutput_dir = "{run_dir.parent}"\n',
        f'[[endpoints]]\nurl = "{url}"\nstream = false\n',
        "[generation]\ntemperature = 1.0\n",
        "[store]\nflush_rows = 256\nflush_seconds = 5\nshard_prompts = 1000\n",
    ]
    if setting.isdigit():
        lines.append(f"[concurrency]\nlimit = {int(setting)}\n")
    else:
        unpaced = "pace_admissions = false\n" if setting == "adaptive-unpaced" else ""
        factor = setting.removeprefix("adaptive-pace")
        paced = f"pace_factor = {float(factor)}\n" if setting.startswith("adaptive-pace") else ""
        target = setting.removeprefix("adaptive-target")
        targeted = f"target_kv_usage = {float(target)}\n" if setting.startswith("adaptive-target") else ""
        polled = f"poll_s = {poll_s}\n" if poll_s is not None else ""
        lines.append(f"[concurrency]\n{polled}{unpaced}{paced}{targeted}")
    for name, source, max_tokens in sources:
        lines.append(
            f'[[categories]]\nname = "{name}"\nsource = "{source}"\nformat = "messages"\n'
            f"generation = {{ max_tokens = {max_tokens} }}\n"
        )
    path.write_text("\n".join(lines))


def one_run(
    url: str,
    config: Path,
    run_dir: Path,
    requests: int,
    poll_hz: float = 1.0,
    server_log: Path | None = None,
    tree: Path | None = None,
    cohort: int = 64,
) -> Outcome:
    """One ``datagen run`` of ``config``; ``tree``: the source tree to run it from (default: this one);
    ``cohort``: the answers that end the run's start (``warm_window``)."""
    log_from = server_log.stat().st_size if server_log else 0
    before, counters_before = read_sample(url), read_step_counters(url)
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    poller = Poller(url, poll_hz)
    poller.start()
    result = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-m", "flows.cli", "run", str(config), "--no-prefect", "-v"],
        capture_output=True,
        check=False,
        cwd=tree,  # `-m flows.cli` imports the package from the working directory first
    )
    run_dir.mkdir(parents=True, exist_ok=True)  # its log (limit changes, retried attempts) by its data
    (run_dir / "datagen.log").write_bytes(result.stdout + result.stderr)
    poller.stop.set()
    poller.join()
    usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.decode()[-3000:])
    after, counters_after = read_sample(url), read_step_counters(url)
    rows = [
        row
        for path in (run_dir / "data").rglob("*.parquet")
        for row in pq.read_table(path, columns=["latency_s", "created_at"]).to_pylist()
    ]
    latencies = sorted(row["latency_s"] for row in rows)
    answered = [row["created_at"].timestamp() for row in rows]
    sent = [at - row["latency_s"] for at, row in zip(answered, rows, strict=True)]
    samples = poller.samples
    write_gauges(run_dir / "gauges.jsonl", poller)
    if server_log:  # the server's own lines of this run (SGLang logs every prefill batch)
        with server_log.open("rb") as log:
            log.seek(log_from)
            (run_dir / "server.log").write_bytes(log.read())
    starved = [is_starved(s) for s in samples]
    wall = [at + poller.wall_offset for at in poller.times]
    window = warm_window(answered, sent, cohort)
    totals = [float(s.generation_tokens_total or 0) for s in samples]
    generated = (after.generation_tokens_total or 0) - (before.generation_tokens_total or 0)
    retractions = (after.preemptions_total or 0) - (before.preemptions_total or 0)
    seconds = json.loads((run_dir / "summary.json").read_text())["seconds"]
    spent = counters_after.since(counters_before) if counters_before and counters_after else None
    return Outcome(
        tok_s=generated / seconds,
        retractions_per_1k=1000 * retractions / max(requests, 1),
        starved=sum(starved) / max(len(samples), 1),
        starved_sending=share_within(starved, wall, min(sent), max(sent)) if sent else None,
        p50=latencies[len(latencies) // 2] if latencies else 0.0,
        p99=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0,
        cpu_s=(usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime),
        requests=len(latencies),
        peak_queue=max((s.queued or 0 for s in samples), default=0),
        busy=None if spent is None else spent.busy_us / 1e6 / seconds,
        batch=None if spent is None else spent.batch,
        warm_tok_s=None if window is None else rate_between(wall, totals, *window),
        starved_warm=None if window is None else share_within(starved, wall, *window),
    )


def share_within(flags: list[bool], times: list[float], start: float, end: float) -> float | None:
    """The share of the samples taken from ``start`` to ``end`` that were flagged; None if none was."""
    inside = [flag for flag, at in zip(flags, times, strict=True) if start <= at <= end]
    return sum(inside) / len(inside) if inside else None


def warm_window(answered: list[float], sent: list[float], cohort: int) -> tuple[float, float] | None:
    """The run's part past its start and before its drain: from the ``cohort``-th answer (the largest
    fixed setting's first cohort ended) to the last request sent. None for a run without one."""
    if len(answered) < cohort or not sent or cohort < 1:
        return None
    start, end = sorted(answered)[cohort - 1], max(sent)
    return (start, end) if end > start else None


def rate_between(times: list[float], totals: list[float], start: float, end: float) -> float | None:
    """A counter's rate from ``start`` to ``end``, read between its samples ``(times, totals)``; None
    where the samples do not reach both edges (a reading missed at the run's start or end)."""
    if len(times) < 2 or start < times[0] or end > times[-1] or end <= start:
        return None
    return float(np.interp(end, times, totals) - np.interp(start, times, totals)) / (end - start)


def is_starved(sample: ServerSample) -> bool:
    """The server could have taken more: nothing queued and the KV cache below 0.8."""
    return sample.queued == 0 and (sample.kv_usage or 0) < 0.8


def write_gauges(path: Path, poller: Poller) -> None:
    """The server's 1 s readings during a run, beside its data: what a fixed setting did to the
    server (it has no controller timeline) is read from these."""
    start = poller.times[0] if poller.times else 0.0
    with path.open("w") as out:
        for at, sample in zip(poller.times, poller.samples, strict=True):
            out.write(json.dumps({"at": round(at - start, 2), **dataclasses.asdict(sample)}) + "\n")


def add_tree_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH", help="a source tree for settings LAW:NAME"
    )


def split_tree(setting: str) -> tuple[str, str]:
    """A setting ``X[:TREE]`` as (X, TREE), TREE empty where the setting runs from this tree. The
    benches share it; what X holds is each bench's own (``setting_parts`` reads an ``@HZ`` in it)."""
    rest, _, tree = setting.partition(":")
    return rest, tree


def run_name(setting: str) -> str:
    """A setting as a run directory's name: ``64@10`` as ``64at10``, ``adaptive:before`` as
    ``adaptive-before``."""
    return setting.replace("@", "at").replace(":", "-")


def source_trees(parser: argparse.ArgumentParser, given: list[str], settings: list[str]) -> dict[str, Path]:
    """``--tree NAME=PATH`` options by name; every ``LAW:NAME`` setting must have one."""
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in given)}
    unknown = {tree for _, tree in map(split_tree, settings) if tree} - trees.keys()
    if unknown:
        parser.error(f"no --tree NAME=PATH for {', '.join(sorted(unknown))}")
    return trees


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", default="8,16,32,64,128,256,adaptive")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--max-tokens", default="64,256", help="one category per value")
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--engine", choices=["sglang", "vllm"], default="sglang")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs (data, timelines) here")
    add_tree_option(parser)
    args = parser.parse_args()
    settings = args.settings.split(",")
    trees = source_trees(parser, args.tree, settings)
    keep = args.keep.resolve() if args.keep else None
    budgets = [int(v) for v in args.max_tokens.split(",")]
    cohort = first_cohort(settings)
    results: dict[str, list[Outcome]] = {s: [] for s in settings}
    with busy_core(1), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sources = []
        per_category = args.prompts // len(budgets)
        for i, budget in enumerate(budgets):
            source = tmp / f"c{i}.jsonl"
            write_synthetic_prompts(source, per_category, tag=f"c{i}-", max_words=400)
            sources.append((f"max{budget}", source, budget))
        port = free_port("127.0.0.1")
        shm_before = shm_files()
        server = start_server(args.engine, port, args, tmp / "server.log")
        url = f"http://127.0.0.1:{port}"
        try:
            runs = 0
            for repeat in range(args.repeats):
                order = settings[repeat % len(settings) :] + settings[: repeat % len(settings)]
                for setting in order:
                    runs += 1
                    run_dir = (keep or tmp / "runs") / f"r{runs}-{run_name(setting)}"
                    config = tmp / f"r{runs}.toml"
                    law, hz, tree = setting_parts(setting)
                    write_config(config, url, run_dir, sources, law)
                    outcome = one_run(
                        url,
                        config,
                        run_dir,
                        per_category * len(budgets),
                        float(hz or 1.0),
                        tmp / "server.log",
                        trees[tree] if tree else None,
                        cohort,
                    )
                    results[setting].append(outcome)
                    console.print(
                        f"repeat {repeat + 1} {setting:>8}: {outcome.tok_s:7.0f} tok/s, "
                        f"{outcome.retractions_per_1k:5.1f} retr/1k, starved {outcome.starved:.0%} "
                        f"({percent(outcome.starved_sending)} sending), busy {percent(outcome.busy)}, "
                        f"peak queue {outcome.peak_queue}, batch {number(outcome.batch, 1)}, "
                        f"warm {number(outcome.warm_tok_s, 0)} tok/s "
                        f"(starved {percent(outcome.starved_warm)}), "
                        f"cpu {outcome.cpu_s:.1f} s"
                    )
        finally:
            stop(server)
            remove_leftover_shm(shm_before)  # SGLang's load slots, one file per server otherwise
    print_table(results, args)


def setting_parts(setting: str) -> tuple[str, str, str]:
    """A setting ``LAW[@HZ][:TREE]`` as (law, hz, tree), the absent parts empty."""
    law_at, tree = split_tree(setting)
    law, _, hz = law_at.partition("@")
    return law, hz, tree


def first_cohort(settings: list[str]) -> int:
    """The answers that end every run's start: the largest fixed setting's first cohort (``64@10``
    counts as 64), 64 where the invocation has no fixed setting."""
    fixed = [int(law) for law, _, _ in map(setting_parts, settings) if law.isdigit()]
    return max(fixed, default=64)


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def number(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:,.{decimals}f}"


def median_known(values: Iterable[float | None]) -> float | None:
    """The median of the values that were measured; None when none was."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def print_table(results: dict[str, list[Outcome]], args: argparse.Namespace) -> None:
    def med(setting: str, attr: str) -> float:
        return statistics.median(getattr(o, attr) for o in results[setting])

    def warm(setting: str) -> float | None:
        return median_known(o.warm_tok_s for o in results[setting])

    fixed = [s for s in results if s.isdigit() and results[s]]
    best = max(fixed, key=lambda s: med(s, "tok_s")) if fixed else None
    warm_fixed = [s for s in fixed if warm(s) is not None]
    best_warm = max(warm_fixed, key=lambda s: warm(s) or 0.0) if warm_fixed else None
    table = Table(
        title=f"{args.engine}: {args.prompts} prompts, max_tokens {args.max_tokens}, KV pool "
        f"{args.max_total_tokens}, max running {args.max_running}; medians of {args.repeats}"
    )
    columns = [
        "setting",
        "tok/s",
        "vs best fixed",
        "retr/1k req",
        "starved",
        "starved sending",
        "warm tok/s",
        "warm vs best",
        "starved warm",
        "server busy",
        "peak queue",
        "batch",
        "p50 s",
        "p99 s",
    ]
    for column in [*columns, "client CPU s"]:
        table.add_column(column, justify="left" if column == "setting" else "right")
    for setting, outcomes in results.items():
        if not outcomes:
            continue
        ratio = med(setting, "tok_s") / med(best, "tok_s") if best else 1.0
        table.add_row(
            setting,
            f"{med(setting, 'tok_s'):,.0f}",
            f"{ratio:.2f}x",
            f"{med(setting, 'retractions_per_1k'):.1f}",
            f"{med(setting, 'starved'):.0%}",
            percent(median_known(o.starved_sending for o in outcomes)),
            number(warm(setting), 0),
            warm_ratio(warm(setting), warm(best_warm) if best_warm else None),
            percent(median_known(o.starved_warm for o in outcomes)),
            percent(median_known(o.busy for o in outcomes)),
            f"{med(setting, 'peak_queue'):.0f}",
            number(median_known(o.batch for o in outcomes), 1),
            f"{med(setting, 'p50'):.2f}",
            f"{med(setting, 'p99'):.2f}",
            f"{med(setting, 'cpu_s'):.1f}",
        )
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps({s: [o.__dict__ | {"samples": []} for o in v] for s, v in results.items()})
        )
    variants = [s for s in results if s.startswith("adaptive") and s != "adaptive" and results[s]]
    if best is None:
        return
    for setting in [*variants, "adaptive"]:
        if results.get(setting):
            ratio = med(setting, "tok_s") / med(best, "tok_s")
            line = f"{setting} / best fixed ({best}): {ratio:.2f}x output tok/s"
            if best_warm:
                line += f"; warm {warm_ratio(warm(setting), warm(best_warm))} ({best_warm})"
            console.print(line)


def warm_ratio(value: float | None, best: float | None) -> str:
    return "-" if value is None or not best else f"{value / best:.2f}x"


if __name__ == "__main__":
    main()
