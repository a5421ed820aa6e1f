"""kill -9 of the orchestrator at 20 random moments of ONE run, then the same command to the end.

Each life of the run is a real `datagen run` process (forked from a pre-imported parent, so the
20 lives do not spend minutes importing), killed with SIGKILL to its whole process group at a
moment drawn uniformly from its first few seconds: taking the lock, opening the store, reading the
done-set, streaming, writing or renaming a shard. The run must still end exactly once: every
prompt one row or one reject, no id twice, every shard readable, no temporary file left behind.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from forked_runs import Zygote
from pipeline_support import check_run, datagen, rows_on_disk, write_config, write_prompts

from sglang_launch.simulator import SimConfig, SimulatorProcess

KILLS = 20
PROMPTS = 2500
WINDOW_S = 3.0
SIM = {"time_scale": 0.5, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}


@pytest.mark.slow
def test_20_kills_of_one_run_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    source = tmp_path / "prompts.jsonl"
    good = write_prompts(source, PROMPTS, bad_every=97)
    run_dir = tmp_path / "killed"
    moments: list[float] = []
    progress: list[int] = []
    started = time.monotonic()
    with SimulatorProcess(SimConfig(**SIM)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="killed", output_dir=tmp_path, url=sim.url, source=source
        )
        args = ["run", str(config), "--no-prefect"]
        with Zygote() as zygote:
            for life in range(KILLS):
                moment = rng.uniform(0.0, WINDOW_S)
                killed = zygote.killed_after(args, tmp_path / f"life-{life:02d}.log", moment)
                assert killed, f"seed {seed}: life {life} ended before its kill"
                moments.append(moment)
                progress.append(rows_on_disk(run_dir))
                partial = check_run(run_dir)
                assert partial.corrupt_files == [] and partial.duplicates == 0, f"seed {seed}, life {life}"
        killed_s = time.monotonic() - started
        last = datagen(*args)
        out, _ = last.communicate(timeout=300)
    assert last.returncode == 0, out.decode()[-3000:]
    final = check_run(run_dir)
    assert final.corrupt_files == [], f"seed {seed}"
    assert final.duplicates == 0, f"seed {seed}"
    assert set(final.row_ids) == {f"p{i:05d}" for i in range(PROMPTS) if i % 97 != 96}, f"seed {seed}"
    assert len(final.reject_ids) == PROMPTS - good
    assert not list(run_dir.rglob(".tmp-*"))
    assert 0 < progress[-1] < len(final.row_ids)  # the killed lives kept rows, and left work to do
    print(
        f"seed {seed}; 20 lives in {killed_s:.0f} s, then the last run;"
        f" kill moments (s): {[round(m, 2) for m in moments]}; rows on disk after each: {progress}"
    )
