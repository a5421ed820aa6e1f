"""`datagen run` against the REAL vLLM 0.32 CPU server: the same client, another engine's shapes.

vLLM names things differently (its 400 for a long prompt, its SSE chunks, `reasoning` instead of
`reasoning_content` in newer versions); the pipeline must still end every prompt exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import load_dataset
from engine_support import needs_vllm, vllm_server
from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.control.timeline import read_timeline

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600), needs_vllm]


def test_100_prompts_through_real_vllm(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    good = write_prompts(source, 100, bad_every=50, long_every=40)
    with vllm_server(tmp_path / "vllm.log") as url:
        config = write_config(tmp_path / "run.toml", name="vllm", output_dir=tmp_path, url=url, source=source)
        config.write_text(
            config.read_text()
            .replace("limit = 64", "limit = 24")
            .replace("max_tokens = 64", "max_tokens = 48")
        )
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "vllm")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) + len(check.reject_ids) == 100
    too_long = sum(n for r, n in check.reject_reasons.items() if "maximum context length is 1024" in r)
    assert too_long == 2  # rows 39 and 79: vLLM's 400, recorded with its message, never retried
    assert check.reject_reasons["no user turn"] == 100 - good
    ds = load_dataset("parquet", data_dir=str(tmp_path / "vllm" / "data"), split="train")
    assert len(ds) == good - 2
    assert set(ds["model"]) == {"tinyllm"}
    assert set(ds["finish_reason"]) <= {"stop", "length"}
    assert all(1 <= u["completion_tokens"] <= 48 for u in ds["usage"])
    # a first token wherever the answer has one: the random model sometimes ends at once (its only
    # token the end), and an empty answer has no first token to time
    answered = [row for row in ds if row["messages"][-1]["content"]]
    assert len(answered) > len(ds) // 2
    assert all(row["ttft_s"] is not None and row["ttft_s"] > 0 for row in answered)


def test_an_adaptive_run_against_real_vllm_reads_its_pool_and_loses_nothing(tmp_path: Path) -> None:
    """No `[concurrency]` number on vLLM: the controller reads the pool's size and block from vLLM's
    real `cache_config_info`, grows from its cautious start, keeps the queue short, loses nothing."""
    source = tmp_path / "prompts.jsonl"
    good = write_prompts(source, 240, bad_every=60)
    with vllm_server(tmp_path / "vllm.log") as url:
        config = write_config(
            tmp_path / "run.toml", name="vadaptive", output_dir=tmp_path, url=url, source=source
        )
        config.write_text(
            config.read_text().replace("[concurrency]\nlimit = 64\n", "[concurrency]\npoll_s = 0.5\n")
        )
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "vadaptive")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) == good and len(check.reject_ids) == 240 - good
    timeline = read_timeline(tmp_path / "vadaptive")
    assert len(timeline) >= 5
    assert {row["source"] for row in timeline} == {"vllm-metrics"}
    assert {row["capacity_tokens"] for row in timeline} == {4096}
    assert {row["block_tokens"] for row in timeline} == {128}
    assert max(row["limit"] for row in timeline) > 8  # grew from its cautious start
    # 16 may run at once: the queue stays a short ready queue
    assert max(row["queued"] or 0 for row in timeline) <= 24, [row["queued"] for row in timeline]
