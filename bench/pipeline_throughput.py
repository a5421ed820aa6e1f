"""Throughput of the pipeline against the simulator, beside a SpecForge-style baseline in the same run.

    uv run python -m bench.pipeline_throughput [--prompts 2000] [--concurrency 64] [--max-tokens 256]

Both sides send the same prompts to the same simulated GPU server (116k-token KV pool, time scale
1/50) at the same fixed concurrency. The baseline mimics SpecForge's `regenerate_train_data.py`: a new
OpenAI client per request, no streaming, results appended to a JSONL file. The pipeline pays for
what the baseline skips (streaming with TTFT, fsynced parquet shards, resume bookkeeping); the table
shows what that costs, as ratios to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import openai
from rich.console import Console
from rich.table import Table

from flows.config import parse_config
from flows.runner import execute
from prompts.readers import iter_rows
from prompts.synthetic import write_synthetic_prompts
from sglang_launch.simulator import SimConfig, SimulatorProcess

console = Console(width=120)


async def baseline(url: str, source: Path, out: Path, concurrency: int, max_tokens: int) -> tuple[int, int]:
    """SpecForge-style: a client per request, non-streaming, JSONL appends. Returns (rows, tokens)."""
    gate = asyncio.Semaphore(concurrency)
    rows = tokens = 0

    async def one(row: dict) -> None:
        nonlocal rows, tokens
        async with gate:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY")
            try:
                answer = await client.chat.completions.create(
                    model="sim-model", messages=row["messages"], max_tokens=max_tokens, temperature=0.7
                )
            finally:
                await client.close()
            with out.open("a", encoding="utf-8") as handle:
                handle.write(
                    json.dumps({"id": row["prompt_id"], "content": answer.choices[0].message.content}) + "\n"
                )
            rows += 1
            tokens += answer.usage.completion_tokens if answer.usage else 0

    await asyncio.gather(*(one(row) for _, row in iter_rows(str(source))))
    return rows, tokens


async def pipeline(url: str, source: Path, out: Path, concurrency: int, max_tokens: int) -> tuple[int, int]:
    cfg = parse_config(
        {
            "run": {"name": "bench", "output_dir": str(out)},
            "endpoints": [{"url": url}],
            "concurrency": {"limit": concurrency},
            "generation": {"max_tokens": max_tokens},
            "categories": [{"name": "bench", "source": str(source), "format": "messages"}],
        }
    )
    status = await execute(cfg, use_prefect=False)
    return status.rows, sum(c.completion_tokens for c in status.categories)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    results: dict[str, tuple[int, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "prompts.jsonl"
        write_synthetic_prompts(source, args.prompts, max_words=200)
        sim_cfg = SimConfig(
            time_scale=0.02, stream_interval_s=0.02, log_level="warning", stop_probability=0.5
        )
        for name, runner in (("baseline (SpecForge-style)", baseline), ("eagle-datagen pipeline", pipeline)):
            with SimulatorProcess(sim_cfg) as sim:
                started = time.monotonic()
                rows, tokens = asyncio.run(
                    runner(sim.url, source, Path(tmp) / name.split()[0], args.concurrency, args.max_tokens)
                )
                results[name] = (rows, tokens, time.monotonic() - started)
    base_rate = results["baseline (SpecForge-style)"][1] / results["baseline (SpecForge-style)"][2]
    table = Table(
        title=f"{args.prompts} prompts, concurrency {args.concurrency}, max_tokens {args.max_tokens}"
    )
    for column in ("client", "rows", "output tokens", "seconds", "rows/s", "tok/s", "tok/s vs baseline"):
        table.add_column(column, justify="left" if column == "client" else "right")
    for name, (rows, tokens, seconds) in results.items():
        rate = tokens / seconds
        table.add_row(
            name,
            str(rows),
            f"{tokens:,}",
            f"{seconds:.1f}",
            f"{rows / seconds:.1f}",
            f"{rate:,.0f}",
            f"{rate / base_rate:.2f}x",
        )
    console.print(table)
    console.print(
        "reproduce: uv run python -m bench.pipeline_throughput "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())
    )


if __name__ == "__main__":
    main()
