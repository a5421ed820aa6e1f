"""``/metrics``: SGLang's names, types and labels, its refresh schedule, and the retraction counter."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_launch.simulator.metrics import GaugeBoard
from sglang_launch.simulator.scheduler import Scheduler, SchedulerParams, SimRequest

if TYPE_CHECKING:
    from conftest import Captured, StartSim

# What a controller reads (DESIGN.md), all expected with the real labels.
CONTROLLER_GAUGES = [
    "sglang:token_usage",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:max_total_num_tokens",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
]
RETRACTED = "sglang:num_retracted_requests"  # the parser drops the counter's "_total"


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def shape(family: Any) -> tuple[str, set[tuple[str, frozenset[str]]]]:
    """A family's type and, per sample name, its label names."""
    return family.type, {(s.name, frozenset(s.labels)) for s in family.samples}


def value(family: Any) -> float:
    (sample,) = family.samples
    return float(sample.value)


async def test_every_family_has_the_real_name_type_and_labels(
    start_sim: StartSim, captured: Captured
) -> None:
    sim = start_sim()
    async with httpx.AsyncClient(base_url=sim.url) as client:
        body = {"model": "tinyllm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        await client.post("/v1/chat/completions", json=body)
        await client.post("/v1/chat/completions", json={**body, "stream": True})
        response = await client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    ours = families(response.text)
    real = families(captured.text("metrics_after_retraction.prom"))
    assert set(CONTROLLER_GAUGES) <= set(ours)
    for name, family in ours.items():
        assert name in real, name
        ours_type, ours_samples = shape(family)
        real_type, real_samples = shape(real[name])
        assert ours_type == real_type, name
        # label sets agree (a pid label's value differs, its name does not)
        assert {labels for _, labels in ours_samples} <= {labels for _, labels in real_samples}, name
    token_usage = ours["sglang:token_usage"].samples[0].labels
    assert token_usage == {
        "engine_type": "unified",
        "model_name": "tinyllm",
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    assert value(ours["sglang:max_total_num_tokens"]) == 4096
    assert {s.labels["is_streaming"]: s.value for s in ours["sglang:num_requests"].samples} == {
        "false": 1,
        "true": 1,
    }


def test_idle_metrics_carry_no_retraction_counter(captured: Captured) -> None:
    assert RETRACTED not in families(captured.text("metrics_idle.prom"))  # what the real server does


async def test_retraction_counter_absent_until_the_first_retraction(start_sim: StartSim) -> None:
    # every answer runs to max_tokens, slowly enough that all 8 overlap: 8 x 120 tokens cannot fit in 300
    sim = start_sim(
        max_total_tokens=300,
        context_length=300,
        init_new_token_ratio=0.05,
        time_scale=0.01,
        stop_probability=0.0,
    )
    async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
        before = families((await client.get("/metrics")).text)
        bodies = [
            {
                "model": "tinyllm",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 120,
            }
            for i in range(8)
        ]
        answers = await asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies))
        after = families((await client.get("/metrics")).text)
        stats = (await client.get("/sim/stats")).json()
    assert all(a.status_code == 200 for a in answers)
    assert RETRACTED not in before and "sglang:num_retracted_input_tokens" not in before
    assert stats["retractions"] >= 1
    assert value(after[RETRACTED]) == stats["retracted_requests"]
    assert value(after["sglang:num_retracted_output_tokens"]) == stats["retracted_output_tokens"]


def test_gauges_refresh_on_prefill_and_every_n_decode_steps() -> None:
    s = Scheduler(SchedulerParams(max_total_tokens=1000, max_running_requests=8))
    board = GaugeBoard(decode_interval=3, time_scale=0.5, init_new_token_ratio=0.7)
    s.submit(SimRequest("A", 100, 10, 10))
    s.submit(SimRequest("B", 100, 10, 10))
    refreshed = []
    for _ in range(7):
        result = s.step()
        assert result is not None
        refreshed.append(board.observe(result, s))
        if len(refreshed) == 4:
            after_three_decodes = board.gauges
    # one prefill, then decode steps 1..6: refreshes at the prefill and at decode steps 3 and 6
    assert refreshed == [True, False, False, True, False, False, True]
    assert (after_three_decodes.num_running_reqs, after_three_decodes.num_used_tokens) == (2, 208)
    assert after_three_decodes.token_usage == 0.21  # rounded like SGLang's
    # 8 tokens in 1 prefill + 3 decode steps of simulated time, times time_scale 0.5
    p = s.params
    elapsed = (
        p.prefill_seconds(200)
        + p.decode_seconds(2, 202)
        + p.decode_seconds(2, 204)
        + p.decode_seconds(2, 206)
    ) * 0.5
    assert after_three_decodes.gen_throughput == pytest.approx(8 / elapsed)
    assert board.gauges.num_used_tokens == 214
    while s.step() is not None:
        pass
    board.publish(s, with_throughput=False)  # what the engine does when it goes idle
    assert (board.gauges.num_running_reqs, board.gauges.num_used_tokens, board.gauges.gen_throughput) == (
        0,
        0,
        0.0,
    )
