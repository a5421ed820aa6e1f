"""`diagnose`: verdicts with their numbers, on real CPU-server logs, on a log written in the seeds'
numbers, and on small synthetic logs for each bound; plus the command's output and exit codes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import gpu as cli
from sglang_launch.diagnose import VERDICT_MEANINGS, Diagnosis, diagnose
from sglang_launch.gpu import GpuInfo, GpuProcess, GpuSnapshot, GpuUnavailableError
from sglang_launch.gpu_csv import parse_gpu_csv
from sglang_launch.logparse import parse_log
from sglang_launch.memory_math import GIB

REAL = Path(__file__).parent.parent / "fixtures" / "sglang-0.5.23"
LOGS = Path(__file__).parent.parent / "fixtures" / "logs"
runner = CliRunner()


def seeds_gpus() -> GpuSnapshot:
    return parse_gpu_csv((LOGS / "seeds_nvidia_smi.csv").read_text(), source="nvidia-smi csv")


def run(text: str, gpus: GpuSnapshot | None = None, **options: object) -> Diagnosis:
    return diagnose(parse_log(text), gpus, **options)  # type: ignore[arg-type]


POOL = 100_000
START = datetime(2026, 1, 1, 10, 1, 10)


def decode_line(at: datetime, running: int, queued: int, usage: float) -> str:
    """One 0.5.x "Decode batch" line of a ``POOL``-token server."""
    return (
        f"[{at:%Y-%m-%d %H:%M:%S}] Decode batch, #running-req: {running}, #token: {round(usage * POOL)}, "
        f"token usage: {usage:.2f}, cuda graph: True, gen throughput (token/s): 1500.00, #queue-req: {queued}"
    )


def prefill_line(at: datetime, tokens: int = 2000) -> str:
    """One 0.5.x "Prefill batch" line admitting one request."""
    return (
        f"[{at:%Y-%m-%d %H:%M:%S}] Prefill batch, #new-seq: 1, #new-token: {tokens}, #cached-token: 0, "
        "token usage: 0.50, #running-req: 1, #queue-req: 1, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 1000.00"
    )


def startup(cap: int = 64, chunk: int = 8192) -> list[str]:
    """The server_args and capacity lines a whole log begins with."""
    return [
        "[2026-01-01 10:00:00] server_args={'mem_fraction_static': 0.88, 'tp_size': 1, "
        f"'max_running_requests': {cap}, 'chunked_prefill_size': {chunk}, 'kv_cache_dtype': 'auto'}}",
        f"[2026-01-01 10:00:01] max_total_num_tokens={POOL}, chunked_prefill_size={chunk}, "
        f"max_prefill_tokens=16384, max_running_requests={cap}, context_len=32768, available_gpu_mem=9.00 GB",
        "[2026-01-01 10:00:02] The server is fired up and ready to roll!",
    ]


def synthetic(
    rows: list[tuple[int, int, float]],
    *,
    cap: int = 64,
    chunk: int = 8192,
    prefill_tokens: int = 2000,
    retractions: int = 0,
    admitted: int = 10,
    step_s: int = 1,
) -> str:
    """A 0.5.x log: startup capacity, admissions, then one decode line per (running, queued, usage)
    row, ``step_s`` seconds apart."""
    lines = startup(cap, chunk)
    for i in range(admitted):
        lines.append(prefill_line(datetime(2026, 1, 1, 10, 0, 3), prefill_tokens))
        if i < retractions:
            lines.append(
                "[2026-01-01 10:00:03] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
                "#new_tokens_gained: 300, #new_token_ratio: 0.3000 -> 0.8000"
            )
    lines += [decode_line(START + timedelta(seconds=i * step_s), *row) for i, row in enumerate(rows)]
    return "\n".join(lines) + "\n"


# --- the seeds: a KV-bound server, two days of doing this by hand -----------------------------
def test_seeds_log_is_kv_bound_with_the_seeds_numbers() -> None:
    result = run((LOGS / "seeds_kv_bound_tp8.log").read_text(), seeds_gpus(), concurrency=150)
    assert result.verdict == "kv_bound"
    assert result.headline == "KV-bound: 46-56 running of 150 sent, 100 queued, token usage 0.85-0.96"
    assert result.exit_code == 1
    assert result.advice[0] == (
        "--mem-fraction-static 0.85 -> 0.88 adds ~2.9 GiB of KV per GPU, ~63,638 tokens (~6 more running "
        "requests at ~10,267 tokens each); margin ~2.2 GiB free per GPU (5.1 GiB free now - 2.9 GiB). 0.90 "
        "would add ~4.8 GiB but leave ~317 MiB: too little for activation peaks and CUDA graphs (expect CUDA "
        "out of memory). If 0.88 fails at startup (CUDA graph capture), lower --cuda-graph-max-bs."
    )
    safe, too_far = result.headroom
    assert (safe.current, safe.proposed, too_far.proposed) == (0.85, 0.88, 0.90)
    assert safe.basis_bytes == round(95.10 * GIB)  # SGLang's "Load weight begin. avail mem"
    assert result.memory.bytes_per_token == 48_137  # 25.68 GiB / 572,812 tokens, as logged (2 decimals)
    assert "retractions: 1 (1 request evicted and recomputed)" in result.evidence
    assert any(
        a.startswith("--kv-cache-dtype fp8_e4m3") and "572,812 -> ~1,145,624" in a for a in result.advice
    )
    assert any(a.startswith("The client keeps 150 requests in flight but ~50 run") for a in result.advice)
    assert any("hierarchical cache" in a and "not the number of requests" in a for a in result.advice)


def test_without_a_gpu_snapshot_the_advice_says_what_is_missing() -> None:
    result = run((LOGS / "seeds_kv_bound_tp8.log").read_text())
    assert result.headline == (
        "KV-bound: 46-56 running of ~158 in flight (running + queued, peak), 100 queued, "
        "token usage 0.85-0.96"
    )
    assert result.headroom == ()
    assert result.advice[0] == (
        "Give the KV cache more memory (--mem-fraction-static); to compute how much, this needs GPU free "
        "memory (pass --gpu-csv, or run on the GPU host)."
    )


def test_no_room_left_to_raise_the_fraction() -> None:
    tight = GpuSnapshot(
        gpus=(GpuInfo(0, "", 100 * GIB, 99 * GIB, GIB),), source="test", has_process_info=False
    )
    result = run((LOGS / "seeds_kv_bound_tp8.log").read_text(), tight)
    assert result.advice[0].startswith(
        "No room to raise --mem-fraction-static 0.85: only 1.0 GiB free per GPU, "
        "and 2.0 GiB should stay free."
    )


# --- real CPU SGLang logs ---------------------------------------------------------------------
def test_real_main_log_is_kv_bound() -> None:
    result = run((REAL / "server_main.log").read_text())
    assert result.verdict == "kv_bound"
    assert result.headline == (
        "KV-bound: 8-10 running of ~64 in flight (running + queued, peak), 30 queued, token usage 0.53-0.96"
    )  # the 7 lines after the last admission (6 running falling to 2, none queued) are the drain
    assert "7 decode lines after the last admission are the end-of-run drain, not counted" in result.evidence
    assert result.load is not None
    assert (result.load.retractions, result.load.admitted, result.load.running_cap) == (3, 72, 16)
    assert "--max-total-tokens 4,096 caps the KV pool" in result.advice[1]
    assert "generation requests answered (HTTP status x count): 200 x 67, 400 x 5" in result.evidence


def test_real_queue_full_log_is_running_cap_bound_and_mentions_the_503s() -> None:
    result = run((REAL / "server_queuefull.log").read_text())
    assert result.verdict == "running_cap_bound"
    assert result.headline == (
        "Running-cap-bound: 1-2 running = --max-running-requests 2, 0 queued, only token usage 0.03-0.41"
    )
    assert result.advice[0] == (
        "Raise --max-running-requests 2 -> ~4: at 2 running the KV pool is only 41% used, "
        "so ~4 fit before it reaches 85%."
    )
    assert result.advice[-1].startswith("5 requests got HTTP 503 (request queue full, --max-queued-requests)")


def test_a_log_without_load_is_idle() -> None:
    result = run((REAL / "log_startup_kv_capacity.txt").read_text())
    assert (result.verdict, result.exit_code, result.load) == ("idle", 1, None)
    assert (
        result.evidence[0]
        == "startup: 4,096 tokens KV pool, max_running_requests 16, context_len 1,024, server ready"
    )


# --- each bound on a synthetic log ------------------------------------------------------------
def test_retraction_bound() -> None:
    result = run(synthetic([(30, 20, 0.97)] * 10, admitted=20, retractions=5))
    assert result.verdict == "retraction_bound"
    assert result.headline.startswith(
        "Retraction-bound: 5 retractions evicted 5 running requests (of 20 admitted)"
    )
    assert "--schedule-conservativeness (1 -> 1.3)" in result.advice[0]


def test_a_few_retractions_do_not_make_it_retraction_bound() -> None:
    assert run(synthetic([(30, 20, 0.97)] * 10, admitted=100, retractions=3)).verdict == "kv_bound"


def test_prefill_bound() -> None:
    result = run(synthetic([(10, 30, 0.40)] * 10, prefill_tokens=8192))
    assert result.verdict == "prefill_bound"
    assert result.headline == (
        "Prefill-bound: prefill batches are full chunks (median 8,192 of 8,192 tokens), 30 queued, "
        "token usage 0.40, 10 running"
    )
    assert result.advice[0].startswith("Raise --chunked-prefill-size 8192 -> 16384")


def test_reservation_bound() -> None:
    result = run(synthetic([(10, 30, 0.40)] * 10, prefill_tokens=900))
    assert result.verdict == "reservation_bound"
    assert result.headline.startswith("Admission-bound: 30 queued while token usage 0.40 and 10 running")
    assert result.advice[0].startswith("Send realistic max_tokens per category")


def test_starved_server_and_a_client_that_does_not_deliver() -> None:
    starved = synthetic([(8, 0, 0.20)] * 10, step_s=10)  # 90 s of decode lines
    result = run(starved, concurrency=150)
    assert result.verdict == "starved"
    assert (
        result.headline
        == "Starved: 8 running of 150 sent, 0 queued, token usage 0.20: the server waits for work"
    )
    assert result.advice[0].startswith("The client says 150 in flight but the server saw at most 8")
    plain = run(starved)
    assert plain.advice[0].startswith("Raise the client's concurrency")
    assert "~32 more requests of ~2,500 tokens fit" in plain.advice[0]


def tail(text: str, stamp: str) -> str:
    """``text`` from its first line stamped ``stamp`` on: the end of a log, as a person copies it."""
    return text[text.index(f"[{stamp}]") :]


def test_a_four_second_tail_is_too_short_to_call_the_server_starved() -> None:
    """The last seconds of the queue-full run: 2 running = its cap, the queue emptying as the run ended
    (and 503s): it said "Starved ... raise the client's concurrency"."""
    result = run(tail((REAL / "server_queuefull.log").read_text(), "2026-11-29 14:09:45"))
    assert (result.verdict, result.exit_code) == ("too_short", 1)
    assert result.headline == "Too short a log to tell (3 s of decode lines); run it on a longer tail"
    assert result.advice[0].startswith("Run it on a longer tail: at least 60 s of decode lines")
    assert not any("concurrency:" in a for a in result.advice)


def test_a_few_decode_lines_are_too_few_however_far_apart() -> None:
    result = run(synthetic([(8, 0, 0.20)] * 5, step_s=30))
    assert result.verdict == "too_short"
    assert result.headline.startswith("Too short a log to tell (5 decode lines over 2 min 0 s)")


def test_the_drain_at_the_end_of_a_run_is_not_starvation() -> None:
    """--last-minutes on a finished run: 40 s at the cap with a short queue, then 80 s of the last
    requests finishing. Over all lines the median fell below the cap and it said "Starved"."""
    at = [START + timedelta(seconds=2 * i) for i in range(60)]
    steady = [line for t in at[:20] for line in (decode_line(t, 16, 3, 0.50), prefill_line(t))]
    drain = [decode_line(t, 16 - i * 16 // 40, 0, 0.40) for i, t in enumerate(at[20:])]
    result = run("\n".join([*startup(cap=16), *steady, *drain]) + "\n")
    assert result.verdict == "running_cap_bound"
    assert result.load is not None and (result.load.lines, result.load.drain_lines) == (20, 40)
    assert "40 decode lines after the last admission are the end-of-run drain, not counted" in " ".join(
        result.evidence
    )


def decode_lines_only(text: str) -> str:
    """``text`` as ``grep "Decode batch"`` leaves it: how people shrink a long server log."""
    return "\n".join(line for line in text.splitlines() if "Decode batch" in line) + "\n"


def test_a_log_filtered_to_decode_lines_still_leaves_the_drain_out() -> None:
    """The drain was told from the decode lines after the last admission (prefill line): a log
    filtered down to its decode lines has none, so the drain counted again and a server with requests
    waiting was called starved. Its own decode lines show the drain: running falling, nothing queued;
    judged without it, the log says what its busy part says."""
    at = [START + timedelta(seconds=2 * i) for i in range(60)]
    steady = [line for t in at[:20] for line in (decode_line(t, 16, 3, 0.50), prefill_line(t))]
    drain = [decode_line(t, 16 - i * 16 // 40, 0, 0.40) for i, t in enumerate(at[20:])]
    result = run(decode_lines_only("\n".join([*startup(cap=16), *steady, *drain])))
    busy_part = run(decode_lines_only("\n".join([*startup(cap=16), *steady])))
    assert result.verdict == busy_part.verdict != "starved", result.headline
    assert result.load is not None and (result.load.lines, result.load.drain_lines) == (23, 37)
    assert (result.load.running.median, result.load.queued.median) == (16, 3)
    evidence = " ".join(result.evidence)
    assert "37 decode lines at the end of the log, running falling with nothing queued, are the " in evidence
    assert "no Prefill batch lines in the log" in evidence


def test_the_real_log_filtered_to_decode_lines_leaves_its_falling_end_out() -> None:
    """The real CPU server's log, decode lines only: its last lines (6 running falling to 2, none
    queued) are its drain; the first three (still 6) may be a server kept at 6, so they count."""
    whole = run((REAL / "server_main.log").read_text())
    decode_only = run(decode_lines_only((REAL / "server_main.log").read_text()))
    assert whole.load is not None and decode_only.load is not None
    assert whole.load.lines + whole.load.drain_lines == decode_only.load.lines + decode_only.load.drain_lines
    assert decode_only.load.drain_lines == 4 and decode_only.load.running.low == 6
    assert decode_only.verdict == whole.verdict == "kv_bound"
    assert not any("no Prefill batch lines" in line for line in whole.evidence)


def test_a_decode_only_log_at_a_steady_count_has_no_drain() -> None:
    """Without admissions in the log, a flat running count with nothing queued (a client keeping
    exactly that many in flight) is no drain, nor a count that rises again at the end."""
    flat = decode_lines_only(synthetic([(8, 0, 0.20)] * 10, step_s=10))
    assert (load := run(flat).load) is not None and load.drain_lines == 0
    rising = decode_lines_only(synthetic([(8, 0, 0.20)] * 8 + [(6, 0, 0.20), (7, 0, 0.20)], step_s=10))
    assert (load := run(rising).load) is not None and load.drain_lines == 0


def test_a_log_of_nothing_but_the_drain_is_too_short_to_tell() -> None:
    at = [START + timedelta(seconds=2 * i) for i in range(60)]
    drain = [decode_line(t, 60 - i, 0, 0.40) for i, t in enumerate(at)]
    result = run("\n".join([*startup(), prefill_line(START), *drain]) + "\n")
    assert result.verdict == "too_short"
    assert result.headline == "Too short a log to tell (only the end-of-run drain); run it on a longer tail"


def test_a_starved_verdict_without_the_running_cap_says_the_cap_may_bind() -> None:
    """A tail without the startup lines does not show --max-running-requests: a server flat at its cap
    looks the same as one the client under-feeds."""
    decode_only = "\n".join(
        line for line in synthetic([(8, 0, 0.20)] * 10, step_s=10).splitlines() if "Decode" in line
    )
    result = run(decode_only)
    assert result.verdict == "starved"
    assert "does not show --max-running-requests" in result.advice[0]
    assert "if it is 8" in result.advice[0]


def test_healthy_server_with_a_short_ready_queue() -> None:
    result = run(synthetic([(50, 3, 0.92)] * 10))
    assert (result.verdict, result.exit_code, result.advice) == ("healthy", 0, ())
    assert (
        result.headline
        == "Healthy: 50 running of ~53 in flight (running + queued, peak), 3 queued, token usage 0.92"
    )


def test_saturated_server_is_healthy_but_the_long_queue_only_adds_latency() -> None:
    result = run(synthetic([(64, 40, 0.93)] * 10, cap=64))
    assert (result.verdict, result.exit_code) == ("healthy", 0)
    assert result.advice == (
        "The client keeps 104 requests in flight but ~64 run: a client limit of ~77 gives the same "
        "throughput with shorter waits (the server queue only adds latency).",
    )


def test_only_the_lowest_rank_is_read_when_several_ranks_log_batches() -> None:
    text = synthetic([(10, 30, 0.95)] * 5)
    other = "[2026-01-01 10:02:00 DP1 TP8] Decode batch, #running-req: 99, token usage: 0.10, #queue-req: 0\n"
    result = run(text.replace("] Decode", " DP0 TP0] Decode") + other)
    assert result.load is not None
    assert (result.load.running.high, result.load.reporter) == (10, "DP0 TP0 (of 2 reporting ranks)")


# --- failures ---------------------------------------------------------------------------------
def test_seeds_nccl_session_explains_max_total_num_tokens_below_zero() -> None:
    idle = parse_gpu_csv((LOGS / "seeds_nvidia_smi_idle.csv").read_text())
    result = run((LOGS / "seeds_nccl_not_enough_memory.log").read_text(), idle)
    assert (result.verdict, result.exit_code) == ("failure", 1)
    assert result.failure is not None and result.failure.kind == "kv_memory"
    assert result.headline == (
        "Failed at startup (kv_memory): RuntimeError: Not enough memory. "
        "Please try to increase --mem-fraction-static."
    )
    assert result.advice[0].startswith(
        "Loading took 79.3 GiB on TP3 but the weights are 55.16 GiB: 24.1 GiB more was allocated meanwhile"
    )
    assert "CUDA/NCCL initialisation had already taken 2.96 GiB before loading" in result.advice[0]
    assert "must be above 1 - 13.29/92.56 = 0.856 (it was 0.85)" in result.advice[1]
    assert result.advice[2].startswith("No GPU memory was left for the KV cache (max_total_num_tokens <= 0)")
    assert "TP0-TP7: taken by CUDA/NCCL init 3.0 GiB, free before loading 92.6 GiB" in " ".join(
        result.evidence
    )


def test_failure_with_a_stale_process_says_to_free_the_gpus_first() -> None:
    stale = GpuProcess(4242, "python3", "python3 -m sglang.launch_server", 70 * GIB)
    gpus = GpuSnapshot(
        gpus=(
            GpuInfo(0, "H100", 80 * GIB, 71 * GIB, 9 * GIB, (stale,)),
            GpuInfo(1, "H100", 80 * GIB, GIB // 2, 80 * GIB - GIB // 2),
        ),
        source="nvml",
    )
    result = run((LOGS / "seeds_nccl_not_enough_memory.log").read_text(), gpus)
    assert result.advice[0].startswith(
        "First free the GPUs: PID 4242 holds 70.0 GiB on GPU 0: python3 -m sglang.launch_server; "
        "free memory is unbalanced: GPU 0 has 9.0 GiB free, GPU 1 79.5 GiB"
    )
    assert result.advice[0].endswith("SGLang refuses to start (newer versions: warns) below 90%.")


def test_hierarchical_cache_host_memory_per_rank() -> None:
    result = run((LOGS / "seeds_hicache_host_memory.log").read_text())
    assert result.failure is not None and result.failure.kind == "host_memory"
    assert result.advice[0].startswith("--hicache-size 48 GB on each of 8 GPU ranks = 384 GB of host RAM")


# --- the command ------------------------------------------------------------------------------
@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> GpuSnapshot:
        raise GpuUnavailableError("cannot read NVIDIA GPUs through NVML: NVML Shared Library Not Found")

    monkeypatch.setattr(cli, "read_gpus", unavailable)


def test_diagnose_command_text(no_nvml: None) -> None:
    args = ["diagnose", str(LOGS / "seeds_kv_bound_tp8.log"), "--gpu-csv", str(LOGS / "seeds_nvidia_smi.csv")]
    result = runner.invoke(cli.app, [*args, "--concurrency", "150"], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "KV-bound: 46-56 running of 150 sent, 100 queued, token usage 0.85-0.96"
    assert lines[1].startswith("Requests wait in the server's queue because the KV cache")
    assert lines[2] == "Evidence:"
    assert "  1. --mem-fraction-static 0.85 -> 0.88 adds ~2.9 GiB of KV per GPU" in result.output
    assert "sk-seed-secret-do-not-print" not in result.output


def test_diagnose_command_json_and_no_gpu(no_nvml: None) -> None:
    result = runner.invoke(cli.app, ["diagnose", str(REAL / "server_main.log"), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["verdict"] == "kv_bound"
    assert doc["load"]["running"] == {"low": 8, "median": 8, "high": 10}
    assert "GPUs: no snapshot (no NVML here and no --gpu-csv)" in doc["evidence"]


def test_diagnose_command_options_override_the_log(no_nvml: None) -> None:
    args = [
        "diagnose",
        str(REAL / "server_main.log"),
        "--mem-fraction",
        "0.8",
        "--bytes-per-token",
        "512",
        "--json",
    ]
    doc = json.loads(runner.invoke(cli.app, args).output)
    assert doc["memory"]["fraction"] == 0.8 and doc["memory"]["bytes_per_token"] == 512


def test_diagnose_command_healthy_exit_code_and_missing_file(no_nvml: None, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(synthetic([(50, 3, 0.92)] * 10))
    assert runner.invoke(cli.app, ["diagnose", str(log)]).exit_code == 0
    missing = runner.invoke(cli.app, ["diagnose", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2
    assert "cannot read" in missing.output and "Traceback" not in missing.output


def test_last_minutes_judges_only_the_end_of_a_long_log() -> None:
    early = synthetic([(8, 0, 0.20)] * 10)  # 10:01:10-10:01:19: starved
    late = "".join(
        f"[2026-01-01 11:00:{i:02d}] Decode batch, #running-req: 30, #token: 97000, token usage: 0.97, "
        "cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 40\n"
        for i in range(10)
    )
    whole = run(early + late)
    assert whole.load is not None and whole.load.lines == 20
    result = run(early + late, last_minutes=5)
    assert result.verdict == "kv_bound"
    assert result.load is not None and result.load.lines == 10


def test_every_verdict_has_a_plain_words_meaning() -> None:
    verdicts = {"kv_bound", "retraction_bound", "running_cap_bound", "prefill_bound", "reservation_bound"}
    assert set(VERDICT_MEANINGS) == verdicts | {"starved", "healthy", "failure", "idle", "too_short"}


def test_a_model_that_leaves_no_room_gets_no_fraction_above_the_cap() -> None:
    """The weights took 77 of 79 GiB: the advice read 'e.g. 1.00 gives ~2.0 GiB of KV', a fraction
    SGLang refuses and one that leaves nothing for activations."""
    log = (
        "[2026-11-29 10:00:00 TP0] Load weight begin. avail mem=79.00 GB\n"
        "[2026-11-29 10:01:00 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=2.00 GB, mem usage=77.00 GB.\n"
        "[2026-11-29 10:01:01 TP0] RuntimeError: Not enough memory. Please try to increase "
        "--mem-fraction-static. Current value: mem_fraction_static=0.88\n"
    )
    result = diagnose(parse_log(log))
    text = " ".join(result.advice)
    assert result.verdict == "failure"
    assert "e.g. 1." not in text and "does not fit these GPUs" in text


def test_a_failure_of_an_earlier_start_is_not_the_server_of_now() -> None:
    """A log over restarts (docker logs): day 1's OOM was read as the verdict of a server serving
    today, even with --last-minutes."""
    now = (LOGS / "seeds_kv_bound_tp8.log").read_text()
    old = (
        "[2025-06-01 00:00:00] server_args=ServerArgs(mem_fraction_static=0.95)\n"
        "[2025-06-01 00:00:09 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    assert diagnose(parse_log(old + now)).verdict == "kv_bound"
    assert diagnose(parse_log(old + now), last_minutes=30).verdict == "kv_bound"
    assert diagnose(parse_log(now + old)).verdict == "failure"  # the last start failed: that is now


def test_an_oom_while_the_weights_load_is_not_told_to_lower_the_fraction() -> None:
    """The launch ladder knew it; `datagen diagnose` of the same log advised a lower fraction."""
    log = (
        "[2026-11-29 10:00:00] server_args=ServerArgs(mem_fraction_static=0.88)\n"
        "[2026-11-29 10:00:05 TP0] Load weight begin. avail mem=79.00 GB\n"
        "[2026-11-29 10:00:40 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    result = diagnose(parse_log(log))
    assert result.verdict == "failure" and "(weights_oom)" in result.headline
    assert "no --mem-fraction-static helps" in " ".join(result.advice)


# --- which GPUs are the server's ------------------------------------------------------------------
def _node(*free_gib: float, busy: int | None = None) -> GpuSnapshot:
    """An 8-GPU node of 80 GiB cards; ``busy``: a GPU another job holds (its process listed)."""
    other = GpuProcess(777, "python", "python train.py", 70 * GIB)
    return GpuSnapshot(
        gpus=tuple(
            GpuInfo(i, "H100", 80 * GIB, round((80 - f) * GIB), round(f * GIB), (other,) if i == busy else ())
            for i, f in enumerate(free_gib)
        ),
        source="nvml",
    )


def test_a_placement_the_log_cannot_tell_from_a_renumbering_judges_every_gpu_and_says_how_to_narrow() -> None:
    """tp 4 from GPU 0 may be nvidia-smi's 4-7 under CUDA_VISIBLE_DEVICES=4,5,6,7: judged on 0-3 (here
    another server's, 10 GiB free) the advice would raise the fraction of a server with 1 GiB left."""
    log = synthetic([(50, 100, 0.95)] * 5).replace("'tp_size': 1", "'tp_size': 4")
    result = run(log, _node(10, 10, 10, 10, 1, 1, 1, 1))
    assert result.memory.free_bytes == 1 * GIB
    assert (
        "GPUs judged: all 8 (the server's server_args place it on its GPUs 0,1,2,3, counted in a "
        "CUDA_VISIBLE_DEVICES the log does not show: pass --gpus with nvidia-smi's numbers of its GPUs "
        "to judge only those)"
    ) in result.evidence


def test_only_the_servers_gpus_are_judged_where_sglangs_own_flags_placed_it() -> None:
    """tp 4 from --base-gpu-id 4: GPU 0 filled by another job, and idle GPUs 1-3, say nothing about
    this server."""
    log = synthetic([(50, 100, 0.95)] * 5).replace("'tp_size': 1", "'tp_size': 4, 'base_gpu_id': 4")
    result = run(log, _node(1, 79, 79, 79, 10, 10, 10, 10, busy=0))
    assert result.memory.free_bytes == 10 * GIB
    assert result.advice[0].startswith("--mem-fraction-static 0.88 -> ")
    assert "GPUs judged: 4,5,6,7 (the server's: tp_size 4 from GPU 4 in its server_args)" in result.evidence
    assert not [f for f in result.gpu_findings if f.kind in ("unbalanced", "process")]


def test_the_gpus_follow_base_gpu_id_step_and_data_parallel_replicas() -> None:
    args = "'tp_size': 2, 'dp_size': 2, 'base_gpu_id': 1, 'gpu_id_step': 2"
    log = synthetic([(50, 100, 0.95)] * 5).replace("'tp_size': 1", args)
    free = [1.0] * 8
    for gpu in (1, 3, 5, 7):
        free[gpu] = 12.0
    result = run(log, _node(*free))
    assert result.memory.free_bytes == 12 * GIB
    assert any(line.startswith("GPUs judged: 1,3,5,7 ") for line in result.evidence)


def test_a_log_that_does_not_say_which_gpus_judges_them_all_and_says_so() -> None:
    log = "\n".join(
        line for line in synthetic([(50, 100, 0.95)] * 5).splitlines() if "server_args" not in line
    )
    result = run(log, _node(10, 10, 10, 10, 79, 79, 79, 1, busy=7), mem_fraction=0.88)
    assert result.memory.free_bytes == 1 * GIB
    assert any(
        line.startswith("GPUs judged: all 8 (the log does not say which the server uses")
        for line in result.evidence
    )


def test_the_gpus_a_server_still_serving_here_computes_on_are_judged_before_its_logs_placement() -> None:
    """tp 4 under CUDA_VISIBLE_DEVICES=4,5,6,7 logs GPUs 0-3; found by its port, its processes are on
    4-7 (1 GiB free), not on 0-3 (another server's, 10 GiB free)."""
    log = synthetic([(50, 100, 0.95)] * 5).replace("'tp_size': 1", "'tp_size': 4")
    how = "those of the processes under the listener on port 30000"
    result = run(log, _node(10, 10, 10, 10, 1, 1, 1, 1), serving=(frozenset({4, 5, 6, 7}), how))
    assert result.memory.free_bytes == 1 * GIB
    assert f"GPUs judged: 4,5,6,7 (the server's: {how}, on this machine)" in result.evidence


def test_where_the_server_is_not_found_by_its_port_every_gpu_is_judged_and_the_evidence_says_why() -> None:
    log = synthetic([(50, 100, 0.95)] * 5).replace("'tp_size': 1", "'tp_size': 4")
    why = "no process seen serving port 30000 on this machine"
    result = run(log, _node(10, 10, 10, 10, 1, 1, 1, 1), serving=(None, why))
    assert result.memory.free_bytes == 1 * GIB
    assert any(
        line.endswith(f"to judge only those; not found by its port: {why})") for line in result.evidence
    )


def test_diagnose_command_looks_for_the_logs_server_only_in_live_nvml_without_gpus_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked: list[int | None] = []

    def logged_server_gpus(args: object, snapshot: GpuSnapshot) -> tuple[frozenset[int], str]:
        looked.append(getattr(args, "port", None))
        return frozenset({4, 5}), "those of the processes under the listener on port 30000"

    monkeypatch.setattr(cli, "read_gpus", lambda: seeds_gpus())
    monkeypatch.setattr(cli, "logged_server_gpus", logged_server_gpus)
    log = str(LOGS / "seeds_kv_bound_tp8.log")
    found = json.loads(runner.invoke(cli.app, ["diagnose", log, "--json"]).output)["evidence"]
    assert any(line.startswith("GPUs judged: 4,5 (the server's: those of the processes") for line in found)
    assert len(looked) == 1
    given = json.loads(runner.invoke(cli.app, ["diagnose", log, "--gpus", "6,7", "--json"]).output)[
        "evidence"
    ]
    assert "GPUs judged: 6,7 (given with --gpus)" in given
    csv = ["--gpu-csv", str(LOGS / "seeds_nvidia_smi.csv")]
    runner.invoke(cli.app, ["diagnose", log, *csv, "--json"])  # a CSV may come from another machine
    assert len(looked) == 1


def test_diagnose_command_judges_the_gpus_given(no_nvml: None) -> None:
    args = ["diagnose", str(LOGS / "seeds_kv_bound_tp8.log"), "--gpu-csv", str(LOGS / "seeds_nvidia_smi.csv")]
    result = runner.invoke(cli.app, [*args, "--gpus", "4,5", "--json"])
    assert "GPUs judged: 4,5 (given with --gpus)" in json.loads(result.output)["evidence"]
