"""kill -9 of a run that fails over between three endpoints, at a few random moments, then to the end.

The run loop's newest paths all move a prompt while it is in flight: a category's shard window
counts only the shards still sending (many more wait for their last answers at once, here on a slow
endpoint), an endpoint given up on has its waiting requests cut and asked elsewhere, and a resume
counts what the category already holds toward its ``limit`` first. Each life of the run is a real
`datagen run --no-prefect` (forked, see ``tests/forked_runs.py``) killed with SIGKILL to its process
group; one endpoint dies for good during one of those lives. However the kills and the death fall,
the same command must end the run exactly once: every prompt of the source, after dedup and the
limit, one row or one standing reject, no id twice, every shard readable, no temporary file left,
and ``datagen status`` saying the same.
"""

from __future__ import annotations

import functools
import json
import random
import time
from pathlib import Path

import pytest
from forked_runs import Zygote, alive
from pipeline_support import check_run, datagen, rows_on_disk, write_config, write_prompts

from flows.run.rows import raw_row_id
from sglang_launch.simulator import FaultConfig, SimConfig, SimulatorProcess

PROMPTS = 500
BAD_EVERY = 53
REPEATS = 40
"""Rows added among the others with the prompt of an earlier row under a new id: dedup drops each."""
LIMIT = 420
"""Records the category takes: fewer than the source holds, so the limit cuts it."""
SIM = {"time_scale": 0.5, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}


def _source(path: Path) -> tuple[set[str], set[str]]:
    """Write the prompts file; return the ids one run of it must hold: the records up to the
    ``LIMIT``-th (repeats dropped, as dedup does) and the conversion rejects read before it."""
    write_prompts(path, PROMPTS, bad_every=BAD_EVERY)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    repeat_every = PROMPTS // REPEATS
    mixed: list[dict[str, object]] = []
    for i, row in enumerate(rows):
        mixed.append(row)
        if i % repeat_every == repeat_every - 1:  # a new id, the prompt of a good row read before
            earlier = i // 2 // BAD_EVERY * BAD_EVERY
            mixed.append({**rows[earlier], "prompt_id": f"r{i:05d}"})
    path.write_text("".join(json.dumps(row) + "\n" for row in mixed), encoding="utf-8")
    records: set[str] = set()
    rejects: set[str] = set()
    for row in mixed:
        if len(records) == LIMIT:
            break
        rid = str(row["prompt_id"])
        if rid.startswith("r"):
            continue
        if int(rid[1:]) % BAD_EVERY == BAD_EVERY - 1:
            rejects.add(raw_row_id(row))
        else:
            records.add(rid)
    return records, rejects


def _config(tmp_path: Path, source: Path, urls: list[str]) -> Path:
    config = write_config(
        tmp_path / "run.toml", name="moved", output_dir=tmp_path, url=urls[0], source=source
    )
    endpoints = "".join(f'[[endpoints]]\nurl = "{url}"\nmodel = "sim-model"\n\n' for url in urls)
    text = config.read_text().replace(f'[[endpoints]]\nurl = "{urls[0]}"\nstream = true\n', endpoints)
    text = text.replace("limit = 64", "limit = 12").replace("shard_prompts = 250", "shard_prompts = 20")
    text = text.replace("max_attempts = 6", "max_attempts = 3")  # an endpoint gone is given up on in ~2 s
    text = text.replace("max_wait_s = 0.5", "max_wait_s = 0.5\nfailover_after_s = 1\noutage_patience_s = 20")
    config.write_text(text + f"limit = {LIMIT}\n")
    return config


def _holds(run_dir: Path, rows: int) -> bool:
    return rows_on_disk(run_dir) >= rows


@pytest.mark.slow
def test_kills_of_a_run_failing_over_between_three_endpoints_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills = rng.randint(3, 5)
    dies_in = rng.randrange(kills)
    source = tmp_path / "prompts.jsonl"
    records, rejects = _source(source)
    run_dir = tmp_path / "moved"
    # each life is killed a moment after the run holds a number of rows: mid-run however fast the machine
    targets = sorted(rng.sample(range(20, LIMIT * 2 // 3), kills))
    moments: list[float] = []
    progress: list[int] = []
    slow = SimConfig(**SIM, faults=FaultConfig(extra_latency_s=1.5))
    with (
        SimulatorProcess(SimConfig(**SIM)) as fast,
        SimulatorProcess(slow) as slow_sim,
        SimulatorProcess(SimConfig(**SIM)) as doomed,
    ):
        config = _config(tmp_path, source, [fast.url, slow_sim.url, doomed.url])
        args = ["run", str(config), "--no-prefect"]
        with Zygote() as zygote:
            for life in range(kills):
                moment = rng.uniform(0.0, 1.0)
                # the endpoint dies for good in one life, its requests in flight: never back in this run
                death = (rng.uniform(0.2, 1.5), doomed.kill) if life == dies_in else None
                log = tmp_path / f"life-{life}.log"
                reached = functools.partial(_holds, run_dir, targets[life])
                killed = zygote.killed_after(args, log, moment, death, once=reached)
                assert killed, f"seed {seed}: life {life} ended before its kill"
                moments.append(moment)
                progress.append(rows_on_disk(run_dir))
                partial = check_run(run_dir)
                assert partial.corrupt_files == [], f"seed {seed}, life {life}"
                assert len(partial.row_ids) == len(set(partial.row_ids)), f"seed {seed}, life {life}"
            last = datagen(*args)
            out, _ = last.communicate(timeout=120)
            (tmp_path / "last.log").write_bytes(out)
            assert last.returncode == 0, f"seed {seed}\n{out.decode()[-3000:]}"
            status_log = tmp_path / "status.json"
            status_pid = zygote.start(["status", str(run_dir), "--json"], status_log)
            while alive(status_pid):
                time.sleep(0.02)
    status = json.loads(status_log.read_text())
    final = check_run(run_dir)
    rows, standing = set(final.row_ids), final.standing_reject_ids
    finals = [rid for rid in final.reject_ids if rid not in final.retryable_ids]
    kills_at = [f"{held} rows + {m:.2f} s" for held, m in zip(targets, moments, strict=True)]
    where = f"seed {seed}; {kills} kills at {kills_at}, the endpoint died in life {dies_in}"
    assert final.corrupt_files == [] and not list((run_dir / "quarantine").rglob("*.parquet")), where
    assert not list(run_dir.rglob(".tmp-*")), where
    assert len(final.row_ids) == len(rows) and len(finals) == len(set(finals)), where  # no id twice
    assert not standing & rows, where  # a prompt is a row or a reject, never both
    assert rows == records and standing == rejects, where  # every prompt of the source
    (category,) = status["categories"]
    on_disk = (len(rows), len(standing), 0)
    assert (category["rows"], category["rejects"], category["repeated_rows"]) == on_disk, where
    assert 0 < progress[-1] < len(rows), where  # the killed lives kept rows and left work to do
    print(f"{where}; rows on disk after each kill: {progress}")
