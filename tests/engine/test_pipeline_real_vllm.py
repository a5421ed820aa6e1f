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
    assert all(ttft is not None and ttft > 0 for ttft in ds["ttft_s"])
