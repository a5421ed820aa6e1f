"""What the token budget's projection costs the client's core, by the number of requests in flight.

While the budget binds, a lane projects what its requests in flight will hold (``Lane.outlook``) at
every release, not only once a second: a request that ends frees room the next tick would grant too
late (``Lane.redo_credit``). So its cost is paid per completed request, on the core that sends the
requests, and it grows with the requests in flight: a GPU server runs hundreds to a thousand at
once, where the CPU engines of the other benches run 64.

Each child process builds one lane with two categories (answers of up to 256 and 2,048 tokens, 200
answers learned each), admits N requests of spread prompts and ages, and times the projection (CPU
time, the median of batches). ``--tree NAME=PATH`` runs the same in another source tree (a
worktree of another commit) as the baseline: settings interleave and repeat, the child pinned to
core 1 with a nice-19 spinner there. "core share" is what the projections take of one core when
each request holds its slot ``--life-s`` seconds (releases per second = in flight / life).

Run: ``uv run python -m bench.outlook_cost [--in-flight 64,256,1024] [--tree base=PATH]``; results
go in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.spinner import busy_core

HERE = Path(__file__).resolve().parents[1]

CHILD = """
import random, statistics, sys, time
from flows.control.demand import CategoryDemand
from flows.control.limiter import Lane
from flows.run.pump import Demand

class Unlimited:
    limit = 1_000_000

count, batches = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(0)
categories = [CategoryDemand(max_tokens=256), CategoryDemand(max_tokens=2048)]
for category in categories:
    for _ in range(200):
        category.learn(1000, 250, rng.randint(10, category.max_tokens))
lane = Lane("endpoint", Unlimited())
for _ in range(200):
    lane.finished(5.0, 120)
now = 1000.0
for i in range(count):
    lane.admit(Demand(categories[i % 2], rng.randint(200, 4000)), now - rng.random() * 20)
lane.clock.observe(now, 25.0 * count, count, 25.0, None)
lane.outlook(now)
times = []
for _ in range(batches):
    start = time.process_time()
    for _ in range(20):
        lane.outlook(now)
    times.append((time.process_time() - start) / 20)
print(statistics.median(times))
"""


def one(tree: Path, count: int, batches: int) -> float:
    """Seconds of CPU per projection at ``count`` in flight, in a child run from ``tree``."""
    result = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", CHILD, str(count), str(batches)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", default="64,256,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=15, help="batches of 20 projections per child")
    parser.add_argument("--life-s", type=float, default=20.0, help="how long a request holds its slot")
    parser.add_argument("--tree", default=None, metavar="NAME=PATH", help="a baseline source tree")
    args = parser.parse_args()
    counts = [int(c) for c in args.in_flight.split(",")]
    trees = {"this tree": HERE}
    if args.tree:
        name, _, path = args.tree.partition("=")
        trees = {name: Path(path).resolve(), **trees}
    console = Console()
    seconds: dict[tuple[str, int], list[float]] = {(t, c): [] for t in trees for c in counts}
    with busy_core(1):
        for repeat in range(args.repeats):
            order = list(trees.items())
            order = order[repeat % len(order) :] + order[: repeat % len(order)]
            for count in counts:
                for name, tree in order:
                    seconds[name, count].append(one(tree, count, args.batches))
            console.print(f"repeat {repeat + 1} of {args.repeats} done")
    baseline = next(iter(trees))
    table = Table(
        title=f"the budget's projection, medians of {args.repeats}, a request's life {args.life_s:g} s"
    )
    for column in ("in flight", "tree", "ms per projection", f"× {baseline}", "core share"):
        table.add_column(column, justify="left" if column == "tree" else "right")
    for count in counts:
        base = statistics.median(seconds[baseline, count])
        for name in trees:
            each = statistics.median(seconds[name, count])
            share = each * count / args.life_s
            table.add_row(f"{count:,}", name, f"{each * 1e3:.2f}", f"{each / base:.2f}x", f"{share:.1%}")
    console.print(table)
    if len(trees) > 1:
        last = counts[-1]
        ratio = statistics.median(seconds["this tree", last]) / statistics.median(seconds[baseline, last])
        print(f"this tree / {baseline} at {last:,} in flight: {ratio:.2f}x CPU per projection")


if __name__ == "__main__":
    main()
