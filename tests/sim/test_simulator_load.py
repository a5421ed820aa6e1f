"""200 concurrent streams on a small KV pool: queueing, a full pool, retractions, all answers complete."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_launch.simulator import SimConfig, SimulatorProcess

REQUESTS = 200
MAX_TOKENS = 256
POOL = 4096

pytestmark = pytest.mark.timeout(60)


def gauges(text: str) -> dict[str, float]:
    return {
        f.name: f.samples[0].value
        for f in text_string_to_metric_families(text)
        if f.type == "gauge" and f.samples
    }


async def stream_one(client: httpx.AsyncClient, i: int) -> list[Any]:
    """One streamed chat (prompt of 60-260 tokens); returns its parsed events, "[DONE]" kept as is."""
    content = f"request {i}: " + "def f(x): return x + 1\n" * random.Random(i).randint(8, 40)
    body = {
        "model": "tinyllm",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[Any] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_two_hundred_streams_queue_fill_the_pool_retract_and_all_complete() -> None:
    cfg = SimConfig(
        model_name="tinyllm",
        max_total_tokens=POOL,
        max_running_requests=16,
        context_length=1024,
        time_scale=0.03,
        log_level="warning",
    )
    with SimulatorProcess(cfg) as sim:
        limits = httpx.Limits(max_connections=REQUESTS + 10)
        async with httpx.AsyncClient(base_url=sim.url, timeout=60, limits=limits) as client:
            before = {f.name for f in text_string_to_metric_families((await client.get("/metrics")).text)}
            load = asyncio.gather(*(stream_one(client, i) for i in range(REQUESTS)))
            seen: list[dict[str, float]] = []
            while not load.done():
                await asyncio.sleep(0.25)  # a controller-like 4 Hz poll
                seen.append(gauges((await client.get("/metrics")).text))
            answers = await load
            after = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
            stats = (await client.get("/sim/stats")).json()

    # every stream finished properly
    assert all(events[-1] == "[DONE]" for events in answers)
    finishes = [events[-3]["choices"][0]["finish_reason"] for events in answers]
    usages = [events[-2]["usage"] for events in answers]
    assert set(finishes) <= {"length", "stop"} and finishes.count("length") > REQUESTS * 0.8
    assert all(
        u["completion_tokens"] == MAX_TOKENS for u, f in zip(usages, finishes, strict=True) if f == "length"
    )
    assert stats["requests_completed"] == REQUESTS
    assert stats["generated_tokens"] == sum(
        u["completion_tokens"] for u in usages
    )  # retracted tokens are kept
    # the server queued, ran at the running cap's edge and filled its KV pool
    assert stats["peak_queued"] > 100 and max(g["sglang:num_queue_reqs"] for g in seen) > 0
    assert 8 <= stats["peak_running"] <= 16
    assert stats["peak_used_tokens"] >= 0.97 * POOL
    assert max(g["sglang:token_usage"] for g in seen) >= 0.7
    # and retracted, which the counter shows only from then on
    assert stats["retractions"] >= 1
    assert "sglang:num_retracted_requests" not in before
    assert after["sglang:num_retracted_requests"].samples[0].value == stats["retracted_requests"]
