"""`datagen run` against the REAL SGLang 0.5.23 scheduler (CPU, tiny random model, KV pool 4096 tokens).

Proves the client and store against the genuine admission, retraction, streaming format and error
bodies: every prompt ends as exactly one row or one reject, and kill -9 + rerun loses and duplicates
nothing. Also runs under a real `prefect server start` (PREFECT_API_URL) and checks what the UI sees.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from datasets import load_dataset
from engine_support import needs_sglang, tiny_sglang
from pipeline_support import (
    check_run,
    children,
    datagen,
    kill_group,
    rows_on_disk,
    wait_for_rows,
    write_config,
    write_prompts,
)

from flows.control.timeline import read_timeline
from sglang_launch.engine import LaunchedEngine
from sglang_launch.ports import free_port

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900), needs_sglang]


@pytest.fixture(scope="module")
def sglang_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = LaunchedEngine(tiny_sglang(tmp_path_factory.mktemp("sglang-logs")))
    with engine:
        engine.ensure_running()
        yield engine.url


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `prefect server start` on a free port, with its own database; stopped at the end."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port("127.0.0.1")
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_UI_ENABLED": "false",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("prefect server did not come up in 120 s")
        yield url
    finally:
        kill_group(proc)


def _config(tmp_path: Path, url: str, name: str, count: int, *, max_tokens: int) -> tuple[Path, int]:
    source = tmp_path / f"{name}.jsonl"
    good = write_prompts(source, count, bad_every=50, long_every=67)
    config = write_config(tmp_path / f"{name}.toml", name=name, output_dir=tmp_path, url=url, source=source)
    config.write_text(
        config.read_text()
        .replace("max_tokens = 64", f"max_tokens = {max_tokens}")
        .replace("limit = 64", "limit = 32")
        .replace("shard_prompts = 250", "shard_prompts = 100")
    )
    return config, good


def test_200_prompts_through_real_sglang_under_a_prefect_server(
    tmp_path: Path, sglang_url: str, prefect_api: str
) -> None:
    config, good = _config(tmp_path, sglang_url, "real200", 200, max_tokens=48)
    proc = datagen("run", str(config), env={"PREFECT_API_URL": prefect_api})
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "real200")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) + len(check.reject_ids) == 200
    too_long = {
        r: n for r, n in check.reject_reasons.items() if "longer than the model's context length" in r
    }
    assert sum(too_long.values()) == 2  # rows 66 and 133: the real server's 400, recorded, never retried
    assert check.reject_reasons["no user turn"] == 200 - good
    assert len(check.row_ids) == good - 2
    ds = load_dataset("parquet", data_dir=str(tmp_path / "real200" / "data"), split="train")
    assert set(ds["finish_reason"]) <= {"stop", "length"}
    assert all(1 <= u["completion_tokens"] <= 48 for u in ds["usage"])
    assert all(m[-1]["role"] == "assistant" for m in ds["messages"])
    # the random model sometimes ends at once (its only token the end): such a row is kept, flagged
    # empty (left out of the training split), and has no first token to time
    answered = [row for row in ds if (row["messages"][-1]["content"] or "").strip()]
    assert len(answered) > len(ds) // 2
    assert sum("empty" in row["flags"] for row in ds) == len(ds) - len(answered)
    assert all(row["ttft_s"] is not None and row["ttft_s"] > 0 for row in answered)
    assert set(ds["model"]) == {"tinyllm"}
    # what the Prefect UI shows: one completed flow run named after the run, a subflow, shard tasks
    runs = httpx.post(f"{prefect_api}/flow_runs/filter", json={}, timeout=10).json()
    by_name = {r["name"]: r for r in runs}
    assert by_name["real200"]["state_type"] == "COMPLETED"
    assert by_name["chat"]["state_type"] == "COMPLETED"
    tasks = httpx.post(f"{prefect_api}/task_runs/filter", json={}, timeout=10).json()
    assert sorted(t["name"] for t in tasks if "-shard-" in t["name"]) == ["chat-shard-0", "chat-shard-1"]
    artifacts = httpx.post(f"{prefect_api}/artifacts/filter", json={}, timeout=10).json()
    assert {a["type"] for a in artifacts} >= {"progress", "markdown"}


def test_3_kills_then_rerun_against_real_sglang(tmp_path: Path, sglang_url: str) -> None:
    """kill -9 three times at random row counts of one run, then the same command: exactly once."""
    config, good = _config(tmp_path, sglang_url, "realkill", 300, max_tokens=96)
    args = ["run", str(config), "--no-prefect"]
    run_dir = tmp_path / "realkill"
    kept: list[set[str]] = []
    for _ in range(3):
        before = rows_on_disk(run_dir)
        proc = datagen(*args)
        try:
            wait_for_rows(run_dir, before + random.randint(20, 60), proc, timeout_s=300)
        finally:
            kill_group(proc)
        partial = check_run(run_dir)
        assert partial.corrupt_files == [] and partial.duplicates == 0
        kept.append(set(partial.row_ids))
    assert kept[0] < kept[1] < kept[2] and len(kept[2]) < good - 4  # each life added rows, work was left
    last = datagen(*args)
    out, _ = last.communicate(timeout=600)
    assert last.returncode == 0, out.decode()[-4000:]
    final = check_run(run_dir)
    assert final.corrupt_files == [] and final.duplicates == 0
    assert len(final.row_ids) + len(final.reject_ids) == 300
    assert kept[2] <= set(final.row_ids)
    assert not list(run_dir.rglob(".tmp-*"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["history"]) == 4


def test_run_launches_real_sglang_and_survives_its_crash(tmp_path: Path) -> None:
    """`[server] launch = true`: the run starts SGLang, restarts it after a kill -9, and stops it."""
    server = tiny_sglang(tmp_path / "unused")
    source = tmp_path / "p.jsonl"
    write_prompts(source, 120)
    config = write_config(
        tmp_path / "run.toml", name="launched", output_dir=tmp_path, url="http://unused", source=source
    )
    env = ", ".join(f'{k} = "{v}"' for k, v in server.env.items())
    text = config.read_text().replace('[[endpoints]]\nurl = "http://unused"\nstream = true\n', "")
    text = text.replace("limit = 64", "limit = 16").replace("max_tokens = 64", "max_tokens = 96")
    text += f"""
[server]
launch = true
python = "{server.python}"
model_path = "{server.model_path}"
served_model_name = "tinyllm"
context_length = 1024
max_total_tokens = 4096
max_running_requests = 16
startup_timeout_s = 180
env = {{ {env} }}
extra_args = {json.dumps(server.extra_args)}
"""
    config.write_text(text)
    proc = datagen("run", str(config), "--no-prefect")
    try:
        wait_for_rows(tmp_path / "launched", 20, proc, timeout_s=300)
        (sglang,) = children(proc.pid, b"sglang.launch_server")
        os.killpg(sglang, signal.SIGKILL)  # the server and its scheduler die mid-run
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "launched")
    assert len(check.row_ids) == 120 and check.reject_ids == [] and check.duplicates == 0
    logs = sorted((tmp_path / "launched" / "server-logs").iterdir())
    assert len(logs) == 2  # the first start and the restart, in the run directory
    summary = json.loads((tmp_path / "launched" / "summary.json").read_text())
    assert summary["server_restarts"] == 1
    port = logs[0].name.split("-")[1]  # sglang-PORT-TIME-attemptN.log
    assert _serving_on(port) == []  # the run stopped the server it launched


def _serving_on(port: str) -> list[int]:
    """Live processes whose command line binds ``port``."""
    needle = f"--port\x00{port}\x00".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if needle in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_adaptive_run_against_real_sglang_finds_its_limit_without_flooding(
    tmp_path: Path, sglang_url: str
) -> None:
    """No `[concurrency]` number: the controller reads SGLang's real /metrics and never floods its queue."""
    config, good = _config(tmp_path, sglang_url, "realadaptive", 240, max_tokens=128)
    config.write_text(config.read_text().replace("[concurrency]\nlimit = 32\n", ""))
    proc = datagen("run", str(config), "--no-prefect")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode()[-4000:]
    check = check_run(tmp_path / "realadaptive")
    assert check.corrupt_files == [] and check.duplicates == 0
    assert len(check.row_ids) + len(check.reject_ids) == 240  # nothing lost
    assert check.reject_reasons["no user turn"] == 240 - good
    # the rest are the real server's 400s for prompt + max_tokens over the context, never retried
    assert all("context length" in r for r in check.reject_reasons if r != "no user turn")
    timeline = read_timeline(tmp_path / "realadaptive")
    assert len(timeline) >= 5
    # the counters from /metrics, the load from /v1/loads (fresher), in every reading
    assert {row["source"] for row in timeline} == {"sglang-metrics+loads"}
    assert {row["capacity_tokens"] for row in timeline} == {4096}
    assert max(row["limit"] for row in timeline) > 8  # grew from its cautious start
    # 16 may run at once: the queue stays a short ready queue, never the hundreds a fixed 256 would leave
    assert max(row["queued"] or 0 for row in timeline) <= 24, [row["queued"] for row in timeline]
    # SGLang's own busy counter (/v1/loads) made the report's "server busy"
    (endpoint,) = json.loads((tmp_path / "realadaptive" / "summary.json").read_text())["concurrency"][
        "endpoints"
    ]
    assert endpoint["signal_reads"] >= 5 and 0 < endpoint["server_busy"] <= 1, endpoint
