"""The JSON info endpoints (``/v1/models``, ``/get_server_info``, ``/v1/loads``, ``/get_model_info``).

Only the keys a client reads are filled with live values; they keep the real files' layout
(server args at the top level, the same args plus scheduler state in ``internal_states[0]``,
``version`` last). The real server_info has ~400 server args; the ones a launcher or controller
would look at are kept, the rest left out.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sglang_launch.simulator.config import SimConfig
from sglang_launch.simulator.metrics import Gauges
from sglang_launch.simulator.scheduler import Scheduler

SGLANG_VERSION = "0.5.23"
REASONING_PARSER = "deepseek-r1"  # what the reasoning knob stands for
TOOL_CALL_PARSER = "qwen"  # SGLang's normalised name of --tool-call-parser qwen25


def models_body(cfg: SimConfig, created: int) -> dict[str, Any]:
    """``GET /v1/models``: the served model with ``max_model_len``."""
    model = {
        "id": cfg.model_name,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": cfg.model_name,
        "parent": None,
        "max_model_len": cfg.context_length,
    }
    return {"object": "list", "data": [model]}


def max_req_input_len(cfg: SimConfig) -> int:
    """SGLang: ``min(context_len - 1, max_total_num_tokens - 1) - 5``."""
    return min(cfg.context_length - 1, cfg.max_total_tokens - 1) - 5


def _server_args(cfg: SimConfig) -> dict[str, Any]:
    return {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "context_length": cfg.context_length,
        "max_running_requests": cfg.max_running_requests,
        "max_queued_requests": cfg.max_queued_requests,
        "max_total_tokens": cfg.max_total_tokens,
        "chunked_prefill_size": cfg.max_prefill_tokens,
        "max_prefill_tokens": cfg.max_prefill_tokens,
        "schedule_policy": "fcfs",
        "retraction_policy": "length",
        "schedule_conservativeness": 1.0,
        "page_size": 1,
        "disable_radix_cache": False,
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "device": "cuda",
        "random_seed": cfg.seed,
        "host": cfg.host,
        "port": cfg.port,
        "served_model_name": cfg.model_name,
        "weight_version": "default",
        "reasoning_parser": REASONING_PARSER if cfg.reasoning else None,
        "tool_call_parser": TOOL_CALL_PARSER if cfg.tool_calls else None,
        "stream_interval": 1,
        "enable_metrics": True,
        "decode_log_interval": cfg.metrics_decode_interval,
        "ep_size": 1,
    }


def server_info_body(cfg: SimConfig, gauges: Gauges) -> dict[str, Any]:
    """``GET /get_server_info`` (and its alias ``/server_info``)."""
    args = _server_args(cfg)
    internal = {
        **args,
        "world_size": 1,
        "effective_max_running_requests_per_dp": cfg.max_running_requests,
        "last_gen_throughput": gauges.gen_throughput,
        "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": cfg.max_total_tokens, "graph": {}},
    }
    return {
        **args,
        "status": "ready",
        "max_total_num_tokens": cfg.max_total_tokens,
        "max_req_input_len": max_req_input_len(cfg),
        "internal_states": [internal],
        "version": SGLANG_VERSION,
    }


def model_info_body(cfg: SimConfig) -> dict[str, Any]:
    """``GET /get_model_info`` (and ``/model_info``)."""
    return {
        "model_path": cfg.model_path,
        "served_model_name": cfg.model_name,
        "tokenizer_path": cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": REASONING_PARSER if cfg.reasoning else None,
        "tool_call_parser": TOOL_CALL_PARSER if cfg.tool_calls else None,
    }


def _wall_moments(moments: list[float], time_scale: float) -> list[float] | None:
    """The decode sums with their step times in wall-clock µs, as SGLang counts them (the simulated
    seconds run ``time_scale`` times as fast); None before the first decode step, as in SGLang."""
    if not moments[0]:
        return None
    us = time_scale * 1e6
    steps, batch, seconds, squares, products, tokens = moments
    return [steps, batch, seconds * us, squares, products * us, tokens]


def loads_body(cfg: SimConfig, scheduler: Scheduler, gauges: Gauges, now: float) -> dict[str, Any]:
    """``GET /v1/loads``: read live from the scheduler, fresher than ``/metrics`` as in SGLang.

    ``gen_throughput`` is the last published one; the prefix cache is not modelled (hit rate 0). The
    busy counters are the simulated step times in wall-clock µs, so their share of wall time is the
    share the server spent computing.
    """
    used = scheduler.used_tokens
    waiting_tokens = scheduler.waiting_tokens()
    load = {
        "timestamp": now,
        "dp_rank": 0,
        "num_running_reqs": len(scheduler.running),
        "num_waiting_reqs": len(scheduler.waiting),
        "num_waiting_uncached_tokens": waiting_tokens,
        "num_used_tokens": used,
        "num_total_tokens": used + waiting_tokens,
        "num_active_tokens": used + waiting_tokens,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": cfg.max_total_tokens,
        "max_running_requests": cfg.max_running_requests,
        "token_usage": round(scheduler.token_usage, 4),
        "gen_throughput": round(gauges.gen_throughput, 2),
        "cache_hit_rate": 0.0,
        "utilization": 0.0,
        "total_prefill_uncached_tokens": scheduler.counters.prefill_tokens,
        "total_prefill_busy_us": round(scheduler.counters.prefill_busy_s * cfg.time_scale * 1e6),
        "decode_moments": _wall_moments(scheduler.counters.decode_moments, cfg.time_scale),
        "memory": {
            "weight_gb": 0.0,
            "kv_cache_gb": 0.0,
            "graph_gb": 0.0,
            "token_capacity": cfg.max_total_tokens,
        },
        "disaggregation": {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        },
        "queues": {
            "waiting": len(scheduler.waiting),
            "grammar": 0,
            "paused": 0,
            "retracted": 0,
            "prealloc_ready": 0,
        },
    }
    return {
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [load],
    }
