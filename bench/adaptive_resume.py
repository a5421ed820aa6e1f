"""How fast an adaptive run's resume fills the server, against another source tree's, on the simulator.

    git worktree add --detach /tmp/before <commit>
    uv run python -m bench.adaptive_resume --settings resume,resume:before --tree before=/tmp/before

The simulated server has the seeds' KV pool (116,171 tokens); answers stop at a uniform point below
their cap of 4,096 (about 2,000 tokens on average). One run answers the first ``--first`` prompts; a
copy of its directory is then resumed by each setting with the source grown to ``--prompts``, each on
a fresh server, interleaved and repeated (medians shown). Until a start knows how long its answers
run, the law counts every request at its cap: the table shows the server's output tok/s over the
first 3, 6 and 12 s after the resume's first token (60, 120 and 240 simulated seconds at the default
time scale), and over the whole resume. The client runs pinned to core 1 with a nice-19 spinner there
in every setting alike. A setting is ``resume`` (this tree) or ``resume:NAME`` (``--tree NAME=PATH``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.adaptive_concurrency import add_tree_option, run_name, source_trees, split_tree, write_config
from bench.adaptive_sim import MAX_TOKENS, SEEDS_KV, run_datagen, seeds_server
from bench.spinner import busy_core
from prompts.synthetic import write_synthetic_prompts
from sglang_launch.simulator import SimConfig, SimulatorProcess

console = Console(width=140)
WINDOWS_S = (3.0, 6.0, 12.0)
"""Wall seconds after the resume's first token over which the early throughput is read."""


@dataclass
class ResumeOutcome:
    early_tok_s: dict[float, float]
    """Output tok/s over each of ``WINDOWS_S`` after the first token."""
    tok_s: float
    retractions: int


def resume(sim_cfg: SimConfig, base: Path, run_dir: Path, source: Path, tree: Path | None) -> ResumeOutcome:
    """A copy of ``base`` resumed from ``tree`` on a fresh server, its generated tokens read every 0.25 s."""
    shutil.copytree(base, run_dir)
    samples: list[tuple[float, int]] = []
    with SimulatorProcess(sim_cfg) as sim:
        config = run_dir.with_suffix(".toml")
        write_config(config, sim.url, run_dir, [("mix", source, MAX_TOKENS)], "adaptive", poll_s=0.25)
        stop = threading.Event()

        def sample() -> None:
            started = time.monotonic()
            while not stop.wait(0.25):
                samples.append((time.monotonic() - started, sim.stats()["generated_tokens"]))

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        try:
            run_datagen(config, tree)
        finally:
            stop.set()
            sampler.join()
        took = time.monotonic() - started
        stats = sim.stats()
    first = next((at for at, tokens in samples if tokens > 0), 0.0)

    def over(window: float) -> float:
        within = [tokens for at, tokens in samples if at - first <= window]
        return (within[-1] if within else 0) / window

    return ResumeOutcome(
        {w: over(w) for w in WINDOWS_S}, stats["generated_tokens"] / took, stats["retracted_requests"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", default="resume")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--first", type=int, default=300, help="prompts answered before the resume")
    parser.add_argument("--prompts", type=int, default=700, help="prompts in the source at the resume")
    parser.add_argument("--time-scale", type=float, default=0.05)
    add_tree_option(parser)
    args = parser.parse_args()
    settings = args.settings.split(",")
    trees = source_trees(parser, args.tree, settings)
    sim_cfg = seeds_server(args.time_scale)
    results: dict[str, list[ResumeOutcome]] = {s: [] for s in settings}
    with busy_core(1), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        every, source, base = tmp / "every.jsonl", tmp / "prompts.jsonl", tmp / "base"
        write_synthetic_prompts(every, args.prompts, max_words=200)
        source.write_text("".join(every.read_text().splitlines(keepends=True)[: args.first]))
        with SimulatorProcess(sim_cfg) as sim:
            write_config(
                tmp / "base.toml", sim.url, base, [("mix", source, MAX_TOKENS)], "adaptive", poll_s=0.25
            )
            run_datagen(tmp / "base.toml", None)
        shutil.copy(every, source)  # the same source, grown: each resume asks the new prompts
        for repeat in range(args.repeats):
            order = settings if repeat % 2 == 0 else settings[::-1]
            for setting in order:
                _, name = split_tree(setting)
                run_dir = tmp / f"{run_name(setting)}-{repeat}"
                outcome = resume(sim_cfg, base, run_dir, source, trees[name] if name else None)
                results[setting].append(outcome)
                console.print(
                    f"{setting} #{repeat + 1}: first 3 s {outcome.early_tok_s[3.0]:,.0f} tok/s, "
                    f"whole {outcome.tok_s:,.0f} tok/s, {outcome.retractions} retractions"
                )
    table = Table(
        title=f"resume of {args.first} answered to {args.prompts} prompts, simulator KV {SEEDS_KV:,}"
    )
    table.add_column("setting")
    for window in WINDOWS_S:
        table.add_column(f"first {window:g} s tok/s", justify="right")
    table.add_column("whole tok/s", justify="right")
    table.add_column("retractions", justify="right")
    base_setting = settings[-1]

    def median(setting: str, window: float | None) -> float:
        runs = results[setting]
        return statistics.median(r.tok_s if window is None else r.early_tok_s[window] for r in runs)

    for setting in settings:
        cells = [
            f"{median(setting, w):,.0f} ({median(setting, w) / max(median(base_setting, w), 1e-9):.2f}x)"
            for w in (*WINDOWS_S, None)
        ]
        table.add_row(setting, *cells, "/".join(str(r.retractions) for r in results[setting]))
    console.print(table)
    first_window = WINDOWS_S[0]
    console.print(
        f"{settings[0]} against {base_setting}: first {first_window:g} s "
        f"{median(settings[0], first_window) / max(median(base_setting, first_window), 1e-9):.2f}x, "
        f"whole resume {median(settings[0], None) / median(base_setting, None):.2f}x"
    )


if __name__ == "__main__":
    main()
