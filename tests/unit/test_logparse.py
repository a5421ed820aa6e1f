"""SGLang log parsing: the real 0.5.23 CPU-server logs, 0.4.x-format lines, and startup failures."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from sglang_launch.logparse import (
    FAILURE_PATTERNS,
    DecodeBatch,
    Stamp,
    classify_startup_failure,
    parse_log,
    reporting_rank,
)

REAL = Path(__file__).parent.parent / "fixtures" / "sglang-0.5.23"
LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


# --- real 0.5.23 lines ------------------------------------------------------------------------
def test_real_decode_lines() -> None:
    log = parse_log((REAL / "log_decode_batch_lines.txt").read_text())
    assert len(log.decode) == 52
    first = log.decode[1]
    assert first == DecodeBatch(
        at=Stamp(line_no=2, time=datetime(2026, 11, 29, 14, 7, 9), tp_rank=None, dp_rank=None),
        running=8,
        queued=56,
        tokens=2212,
        token_usage=0.54,
        gen_throughput=28.30,
        graph=False,  # 0.5.23 on CPU says "cpu graph: False"
    )
    assert max(d.token_usage or 0 for d in log.decode) == 0.99


def test_real_prefill_lines() -> None:
    log = parse_log((REAL / "log_prefill_batch_lines.txt").read_text())
    assert len(log.prefill) == 24
    assert sum(p.new_seq for p in log.prefill) == 72
    last = log.prefill[-1]
    assert (last.new_seq, last.new_tokens, last.cached_tokens, last.token_usage) == (4, 1366, 18, 0.48)
    assert (last.running, last.queued) == (2, 0)


def test_real_retraction_lines() -> None:
    log = parse_log((REAL / "log_retraction_lines.txt").read_text())
    assert [(r.retracted, r.new_token_ratio_before, r.new_token_ratio_after) for r in log.retractions] == [
        (1, 0.2836, 0.7067),
        (1, 0.3957, 0.9253),
        (1, 0.1377, 0.9390),
    ]
    # with context: the surrounding access-log lines are not mistaken for anything
    context = parse_log((REAL / "log_retraction_with_context.txt").read_text())
    assert (len(context.retractions), len(context.decode)) == (3, 2)


def test_real_startup_capacity_and_server_args() -> None:
    log = parse_log((REAL / "server_main.log").read_text())
    (startup,) = log.startup
    assert startup.tp_rank is None
    assert (startup.avail_before_load_gib, startup.avail_after_load_gib, startup.weights_gib) == (
        21.55,
        21.54,
        0.0,
    )
    assert (startup.kv_pool_tokens, startup.kv_pool_gib, startup.avail_after_pool_gib) == (4096, 0.0, 21.53)
    assert (startup.max_total_num_tokens, startup.max_running_requests, startup.context_len) == (
        4096,
        16,
        1024,
    )
    assert (startup.chunked_prefill_size, startup.max_prefill_tokens) == (4096, 16384)
    args = log.args
    assert (args.mem_fraction_static, args.tp_size, args.dp_size, args.kv_cache_dtype) == (
        0.716,
        1,
        1,
        "auto",
    )
    assert (args.max_running_requests, args.max_total_tokens, args.chunked_prefill_size) == (16, 4096, 4096)
    assert (args.enable_hierarchical_cache, args.hicache_ratio, args.hicache_size) == (False, 2.0, 0)
    assert args.cuda_graph_max_bs is None  # 0.5.23 only has cuda_graph_max_bs_decode/_prefill
    assert log.ready and log.failure is None
    assert (len(log.decode), len(log.prefill), len(log.retractions)) == (52, 24, 3)
    assert log.http_statuses == {200: 67, 400: 5}


def test_queue_full_log_counts_the_503s() -> None:
    log = parse_log((REAL / "server_queuefull.log").read_text())
    assert log.http_statuses == {200: 11, 503: 5}
    assert log.args.max_running_requests == 2


# --- 0.4.x formats and prefixes ---------------------------------------------------------------
def test_04x_decode_line_with_tp_prefix_and_cuda_graph() -> None:
    line = (
        "[2025-03-07 21:49:33 TP0] Decode batch. #running-req: 46, #token: 411000, token usage: 0.86, "
        "cuda graph: True, gen throughput (token/s): 2210.50, #queue-req: 101,"
    )
    (d,) = parse_log(line).decode
    assert d == DecodeBatch(
        Stamp(1, datetime(2025, 3, 7, 21, 49, 33), 0, None), 46, 101, 411000, 0.86, 2210.5, True
    )


def test_oldest_04_decode_line_without_graph_or_trailing_comma() -> None:
    line = (
        "[2024-11-02 08:00:01 TP3] Decode batch. #running-req: 12, #token: 9000, token usage: 0.40, "
        "gen throughput (token/s): 800.00, #queue-req: 0"
    )
    (d,) = parse_log(line).decode
    assert (d.at.tp_rank, d.running, d.queued, d.tokens, d.graph) == (3, 12, 0, 9000, None)


def test_dp_tags_container_prefix_and_milliseconds() -> None:
    line = (
        "sglang-1  | [2025-05-01 12:00:00.123 DP1 TP8] Decode batch, #running-req: 5, #token: 100, "
        "token usage: 0.10, cuda graph: True, gen throughput (token/s): 90.00, #queue-req: 2,"
    )
    (d,) = parse_log(line).decode
    assert (d.at.time, d.at.dp_rank, d.at.tp_rank, d.running) == (datetime(2025, 5, 1, 12, 0, 0), 1, 8, 5)


def test_hybrid_swa_usage_takes_the_higher_pool() -> None:
    line = (
        "[2025-09-01 10:00:00] Decode batch, #running-req: 5, #token: 100, full token usage: 0.40, "
        "swa token usage: 0.91, cuda graph: True, gen throughput (token/s): 90.00, #queue-req: 2,"
    )
    assert parse_log(line).decode[0].token_usage == 0.91


def test_04x_mixed_prefill_and_retraction_formats() -> None:
    text = "\n".join(
        [
            "[2025-01-01 10:00:00 TP0] Prefill batch(mixed #running-req: 3). #new-seq: 2, #new-token: 900, "
            "#cached-token: 100, cache hit rate: 10.00%, token usage: 0.50, #queue-req: 7,",
            "[2025-01-01 10:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, "
            "token usage: 0.55, #running-req: 4, #queue-req: 6,",
            "[2025-01-01 10:00:02 TP0] Decode out of memory happened. #retracted_reqs: 2, "
            "#new_token_ratio: 0.3012 -> 0.5012",
            "[2024-08-01 10:00:03 TP0] decode out of memory happened, #retracted_reqs: 1, "
            "#new_token_ratio: 0.5000 -> 0.6000",
        ]
    )
    log = parse_log(text)
    assert [(p.new_seq, p.new_tokens, p.cached_tokens, p.running, p.queued) for p in log.prefill] == [
        (2, 900, 100, None, 7),
        (1, 8192, 0, 4, 6),
    ]
    assert [(r.retracted, r.new_token_ratio_after) for r in log.retractions] == [(2, 0.5012), (1, 0.6)]


def test_seeds_log_keeps_every_rank_and_the_reporting_rank_is_tp0() -> None:
    log = parse_log((LOGS / "seeds_kv_bound_tp8.log").read_text())
    assert [r.tp_rank for r in log.startup] == list(range(8))
    tp5 = log.startup[5]
    assert (tp5.init_distributed_gib, tp5.avail_before_load_gib, tp5.weights_gib) == (0.42, 95.10, 55.16)
    assert (tp5.kv_pool_tokens, tp5.kv_pool_gib) == (572812, pytest.approx(25.68))
    assert (tp5.cuda_graph_gib, tp5.avail_after_graph_gib) == (2.41, 11.46)
    assert log.startup[0].max_total_num_tokens == 572812 and log.startup[5].max_total_num_tokens is None
    assert len(log.retractions) == 8  # the same retraction, logged by each of the 8 ranks
    assert reporting_rank(log.retractions) == (None, 0)
    args = log.args  # 0.4.x ServerArgs(...) form
    assert (args.mem_fraction_static, args.tp_size, args.max_running_requests, args.cuda_graph_max_bs) == (
        0.85,
        8,
        128,
        160,
    )
    assert args.max_total_tokens is None
    assert not hasattr(args, "api_key")


# --- startup failures -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "kv_memory"),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: self.server_args.mem_fraction_static=0.85",
            "kv_memory",
        ),
        (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.8.",
            "kv_memory",
        ),
        ("max_total_num_tokens <= 0, cannot allocate the KV cache", "kv_memory"),
        (
            "ValueError: Not enough host memory available. Requesting 51.54 GB but only have 40.12 GB free.",
            "host_memory",
        ),
        (
            "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes.",
            "gpu_unbalanced",
        ),
        (
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB",
            "cuda_graph",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB.", "cuda_oom"),
        ("RuntimeError: Initialization failed. scheduler died during initialization", "scheduler_died"),
        (
            "[2025-01-01 10:00:00 TP2] Scheduler hit an exception: Traceback (most recent call last):",
            "scheduler_died",
        ),
    ],
)
def test_each_failure_text_is_recognised(text: str, kind: str) -> None:
    failure = classify_startup_failure(
        f"[2025-01-01 09:59:59] Load weight begin. avail mem=90.00 GB\n{text}\n"
    )
    assert failure is not None and failure.kind == kind


def test_root_cause_beats_the_scheduler_death_and_the_line_loses_its_prefix() -> None:
    failure = parse_log((LOGS / "seeds_nccl_not_enough_memory.log").read_text()).failure
    assert failure is not None
    assert failure.kind == "kv_memory"
    assert failure.line == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert "max_total_num_tokens <= 0" in failure.explanation
    prefixed = classify_startup_failure("[2025-01-01 10:00:00 TP3] The memory capacity is unbalanced. x")
    assert prefixed is not None and prefixed.line == "The memory capacity is unbalanced. x"


def test_scheduler_death_quotes_the_last_error() -> None:
    text = (
        "[2025-01-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled system error\n"
    )
    failure = classify_startup_failure(text)
    assert failure is not None and failure.kind == "scheduler_died"
    assert failure.explanation.endswith(
        "Last error in the log: torch.distributed.DistBackendError: NCCL error in: "
        "ProcessGroupNCCL.cpp:1970, unhandled system error"
    )


def test_no_failure_in_a_healthy_log_and_the_table_lists_every_kind_once() -> None:
    assert classify_startup_failure((REAL / "server_main.log").read_text()) is None
    kinds = [kind for kind, _, _ in FAILURE_PATTERNS]
    assert kinds == ["host_memory", "kv_memory", "gpu_unbalanced", "cuda_graph", "cuda_oom", "scheduler_died"]


@pytest.mark.parametrize(
    ("args", "gpus"),
    [
        ("'tp_size': 4, 'base_gpu_id': 4", (4, 5, 6, 7)),
        ("'tp_size': 2, 'pp_size': 2", (0, 1, 2, 3)),
        ("'tp_size': 4, 'dp_size': 4, 'enable_dp_attention': True", (0, 1, 2, 3)),  # DP attention shares them
        ("'tp_size': 2, 'dp_size': 2, 'base_gpu_id': 1, 'gpu_id_step': 2", (1, 3, 5, 7)),
        ("'tp_size': 8, 'nnodes': 2", None),  # which ranks ran on this node: not known here
        ("'model_path': '/m'", None),  # no tp_size: no placement to derive
    ],
)
def test_the_gpus_a_server_ran_on_follow_its_server_args(args: str, gpus: tuple[int, ...] | None) -> None:
    assert parse_log(f"[2026-11-29 14:06:36] server_args={{{args}}}\n").args.gpu_ids() == gpus


def test_a_real_log_places_the_server_on_gpu_0() -> None:
    log = parse_log((REAL / "server_main.log").read_text())
    assert (log.args.gpu_ids(), log.args.placement()) == ((0,), "tp_size 1 from GPU 0")
