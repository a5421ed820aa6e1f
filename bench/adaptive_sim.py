"""Adaptive concurrency against fixed settings on the simulator at the seeds' scale, with a phase shift.

    uv run python -m bench.adaptive_sim [--settings 50,100,150,250,adaptive] [--repeats 2] [--prompts 600]

The simulated server has the seeds' KV pool (116,171 tokens). Every answer may run to ``max_tokens``
4,096: in the first phase answers stop early at a uniform point (about 2,000 tokens on average),
and once a third of the prompts are done every answer runs to the end (4,096): the mix shifts from
short to long answers in the middle of the run, as when a second category starts. (Answers are
planned when a request arrives, so the requests already in flight at the switch stay short: keep
the prompts many times the largest setting.) The seeds' hand-picked
150 is the named baseline. Per phase, the table compares each setting's output tok/s (the server's
own token counter) with the best fixed setting of that phase (an oracle that knows the phases).
"Steady" is the long phase without its edges: from the end of the last request the server had
received before the switch (a setting with a deep queue still answers short ones well into the
long phase, where the cache holds more of them) to the arrival of the last prompt (then every
setting drains): what a run of hours spends its time in. "Short warm" is the first phase without
its start, from the end of the 150th request (the seeds' setting's first cohort) to the switch: until
then no answer's length is known (one phase: "warm", to the arrival of the last prompt). With
``--keep`` each run's directory holds the server's state every 0.2 s (``gauges.jsonl``: running,
queued, KV usage, generated tokens), what a fixed setting did to the server.
Settings are interleaved and repeated; medians are shown. The client runs pinned to core 1 with a
nice-19 spinner there in every setting alike.

    uv run python -m bench.adaptive_sim --no-shift --max-tokens 16384 --stop-length-mean 1500

One phase instead, answers of a long tail (an exponential length, as reasoning chains: most end
short, one in twenty runs past three times the mean, the cap is far off). The budget then rests on
what a request that has already run long is expected to hold: its cap says little.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.adaptive_concurrency import add_tree_option, run_name, source_trees, split_tree, write_config
from bench.spinner import busy_core
from prompts.synthetic import write_synthetic_prompts
from sglang_launch.simulator import SimConfig, SimulatorProcess

console = Console(width=140)
SEEDS_KV = 116_171
MAX_TOKENS = 4096
WARM = 150
"""Requests ended before "warm" (the seeds' 150: the largest fixed setting's first cohort)."""


@dataclass
class PhaseOutcome:
    short_tok_s: float
    long_tok_s: float
    steady_tok_s: float
    """The long phase without its edges: from the end of the last request the server had received
    before the switch (a deep queue holds short answers well into the long phase) to the arrival of
    the last prompt (then the run drains)."""
    warm_tok_s: float
    """The first phase without its start: from the end of the ``WARM``-th request to the switch (with
    no shift: to the arrival of the last prompt). Before it no answer's length is known, and a law
    that does not guess fills the cache only as the answers come back."""
    peak_queue: int
    retractions: int
    seconds: float


class PhaseDriver(threading.Thread):
    """Switches the simulator to long answers once a third of the prompts are done; watches the queue."""

    def __init__(self, sim: SimulatorProcess, switch_after: int, total: int) -> None:
        super().__init__(daemon=True)
        self.sim, self.switch_after, self.total = sim, switch_after, total
        self.warm: tuple[float, int] | None = None
        """(when, generated tokens) once ``WARM`` requests have ended."""
        self.last_arrival: tuple[float, int] | None = None
        """(when, generated tokens) once the last prompt has arrived."""
        self.stop = threading.Event()
        self.switched_at: float | None = None
        self.tokens_at_switch = 0
        self.peak_queue = 0
        self.received_at_switch = 0
        self.steady_start: tuple[float, int] | None = None
        """(when, generated tokens) once every request received before the switch has ended."""
        self.readings: list[dict[str, float]] = []
        """The server's state every 0.2 s (what a fixed setting, which has no timeline, did to it)."""

    def run(self) -> None:
        while not self.stop.wait(0.2):
            stats = self.sim.stats()
            now = time.monotonic()
            self.peak_queue = max(self.peak_queue, stats["queued"])
            self.readings.append(
                {
                    "at": now,
                    **{key: stats[key] for key in ("running", "queued", "token_usage", "generated_tokens")},
                }
            )
            if self.warm is None and stats["finished_requests"] >= WARM:
                self.warm = (now, stats["generated_tokens"])
            if self.last_arrival is None and stats["requests_received"] >= self.total:
                self.last_arrival = (now, stats["generated_tokens"])
            if self.switched_at is None:
                if stats["finished_requests"] >= self.switch_after:
                    self.sim.set_answers(stop_probability=0.0)
                    self.switched_at = now
                    self.tokens_at_switch = stats["generated_tokens"]
                    self.received_at_switch = stats["requests_received"]
                continue
            if self.steady_start is None and stats["finished_requests"] >= self.received_at_switch:
                self.steady_start = (now, stats["generated_tokens"])

    def steady_tok_s(self) -> float:
        """Output tok/s over the steady window (0 where the run never had one)."""
        return _rate(self.steady_start, self.last_arrival)

    def warm_tok_s(self) -> float:
        """Output tok/s of the first phase from the ``WARM``-th end on (0 where it had none)."""
        end = (self.switched_at, self.tokens_at_switch) if self.switched_at is not None else self.last_arrival
        return _rate(self.warm, end)


def _rate(start: tuple[float, int] | None, end: tuple[float, int] | None) -> float:
    """Output tok/s between two (when, generated tokens) marks (0 where either is missing or out of order)."""
    if start is None or end is None or end[0] <= start[0]:
        return 0.0
    return (end[1] - start[1]) / (end[0] - start[0])


def one_run(
    sim_cfg: SimConfig,
    runs_dir: Path,
    name: str,
    setting: str,
    prompts: Path,
    args: argparse.Namespace,
    tree: Path | None,
) -> PhaseOutcome:
    """One run of ``setting``; ``tree``: the source tree to run ``datagen`` from (default: this one)."""
    count = args.prompts
    with SimulatorProcess(sim_cfg) as sim:
        config, run_dir = runs_dir / f"{name}.toml", runs_dir / name
        write_config(config, sim.url, run_dir, [("mix", prompts, args.max_tokens)], setting, poll_s=0.25)
        driver = PhaseDriver(sim, count // 3 if args.shift else count + 1, count)
        driver.start()
        started = time.monotonic()
        run_datagen(config, tree)
        ended = time.monotonic()
        driver.stop.set()
        driver.join()
        stats = sim.stats()
    with (run_dir / "gauges.jsonl").open("w") as out:
        out.writelines(json.dumps({**r, "at": round(r["at"] - started, 2)}) + "\n" for r in driver.readings)
    switch = driver.switched_at or ended
    at_switch = driver.tokens_at_switch if driver.switched_at else stats["generated_tokens"]
    return PhaseOutcome(
        short_tok_s=at_switch / max(switch - started, 1e-9),
        long_tok_s=(stats["generated_tokens"] - at_switch) / max(ended - switch, 1e-9),
        steady_tok_s=driver.steady_tok_s(),
        warm_tok_s=driver.warm_tok_s(),
        peak_queue=driver.peak_queue,
        retractions=stats["retracted_requests"],
        seconds=ended - started,
    )


def seeds_server(
    time_scale: float, max_tokens: int = MAX_TOKENS, stop_length_mean: float | None = None
) -> SimConfig:
    """The simulated server at the seeds' scale: their KV pool, every answer stopping before its cap
    (at a uniform point, or at an exponential length of ``stop_length_mean``)."""
    return SimConfig(
        port=0,
        max_total_tokens=SEEDS_KV,
        context_length=max(16384, max_tokens + 4096),
        time_scale=time_scale,
        stop_probability=1.0,
        stop_length_mean=stop_length_mean,
        log_level="warning",
    )


def run_datagen(config: Path, tree: Path | None) -> None:
    """``datagen run CONFIG --no-prefect`` on core 1 (the spinner's), from ``tree`` (default: this one)."""
    subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-m", "flows.cli", "run", str(config), "--no-prefect"],
        capture_output=True,
        check=True,
        cwd=tree,  # `-m flows.cli` imports the package from the working directory first
    )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--settings", default="50,100,150,250,adaptive")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=900)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument(
        "--stop-length-mean",
        type=float,
        default=None,
        help="answers stop at an exponential length of this mean (a long tail) instead of a uniform point",
    )
    parser.add_argument(
        "--no-shift", dest="shift", action="store_false", help="no switch to long answers: one phase"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs (data, timelines) here")
    add_tree_option(parser)
    args = parser.parse_args()
    settings = args.settings.split(",")
    trees = source_trees(parser, args.tree, settings)
    keep = args.keep.resolve() if args.keep else None
    sim_cfg = seeds_server(args.time_scale, args.max_tokens, args.stop_length_mean)
    results: dict[str, list[PhaseOutcome]] = {s: [] for s in settings}
    with busy_core(1), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        prompts = tmp / "prompts.jsonl"
        write_synthetic_prompts(prompts, args.prompts, max_words=300)
        runs = 0
        for repeat in range(args.repeats):
            for setting in settings[repeat % len(settings) :] + settings[: repeat % len(settings)]:
                runs += 1
                runs_dir = keep or tmp / "runs"
                runs_dir.mkdir(parents=True, exist_ok=True)
                law, tree = split_tree(setting)
                outcome = one_run(
                    sim_cfg,
                    runs_dir,
                    f"r{runs}-{run_name(setting)}",
                    law,
                    prompts,
                    args,
                    trees[tree] if tree else None,
                )
                results[setting].append(outcome)
                phases = (
                    f"short {outcome.short_tok_s:8.0f} tok/s (warm {outcome.warm_tok_s:.0f}), "
                    f"long {outcome.long_tok_s:8.0f} tok/s (steady {outcome.steady_tok_s:.0f})"
                    if args.shift
                    else f"{outcome.short_tok_s:8.0f} tok/s (warm {outcome.warm_tok_s:.0f})"
                )
                console.print(
                    f"repeat {repeat + 1} {setting:>8}: {phases}, peak queue {outcome.peak_queue}, "
                    f"retractions {outcome.retractions}, {outcome.seconds:.1f} s"
                )
    print_table(results, args)


def print_table(results: dict[str, list[PhaseOutcome]], args: argparse.Namespace) -> None:
    def med(setting: str, attr: str) -> float:
        return statistics.median(getattr(o, attr) for o in results[setting])

    fixed = [s for s in results if s.isdigit()] or list(results)  # no fixed: ratios to itself
    named = {
        "short_tok_s": "short",
        "warm_tok_s": "short warm",
        "long_tok_s": "long",
        "steady_tok_s": "steady",
    }
    if not args.shift:  # one phase: the whole run is in the first
        named = {"short_tok_s": "run", "warm_tok_s": "warm"}
    oracle = {phase: max(max(med(s, phase) for s in fixed), 1e-9) for phase in named}
    answers = (
        "at a uniform point"
        if args.stop_length_mean is None
        else f"at an exponential length of mean {args.stop_length_mean:,.0f}"
    )
    shift = "long answers after a third" if args.shift else "no shift"
    table = Table(
        title=f"simulator, KV {SEEDS_KV:,} tokens, {args.prompts} prompts, max_tokens {args.max_tokens:,}, "
        f"answers stop {answers}, {shift}; medians of {args.repeats}"
    )
    columns = [cell for phase in named.values() for cell in (f"{phase} tok/s", "vs oracle")]
    for column in ("setting", *columns, "peak queue", "retr."):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for setting in results:
        name = f"{setting} (seeds)" if setting == "150" else setting
        rates = [(f"{med(setting, p):,.0f}", f"{med(setting, p) / oracle[p]:.2f}x") for p in named]
        table.add_row(
            name,
            *(cell for pair in rates for cell in pair),
            f"{med(setting, 'peak_queue'):.0f}",
            f"{med(setting, 'retractions'):.0f}",
        )
    console.print(table)
    for setting in [s for s in results if s.startswith("adaptive")]:
        ratios = ", ".join(f"{phase} {med(setting, p) / oracle[p]:.2f}x" for p, phase in named.items())
        console.print(f"{setting} / per-phase oracle: {ratios}")


if __name__ == "__main__":
    main()
