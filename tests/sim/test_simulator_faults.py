"""Fault injection and restarts: injected 503s, cut streams, latency, downtime, and their admin knobs."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_launch.simulator.config import FaultConfig, SimConfig
from sglang_launch.simulator.engine import Engine, Outcome
from sglang_launch.simulator.faults import FaultInjector
from sglang_launch.simulator.protocol import ChatRequest, size_request
from sglang_launch.simulator.scheduler import QueueFullError

if TYPE_CHECKING:
    from conftest import Captured, StartSim

CHAT = "/v1/chat/completions"


def body(max_tokens: int = 40, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Tell me a story."}]
    return {"model": "tinyllm", "messages": messages, "max_tokens": max_tokens, **fields}


async def read_stream(
    client: httpx.AsyncClient, payload: dict[str, Any]
) -> tuple[list[str], Exception | None]:
    """The SSE lines received, and the error that ended the stream early (None if it ended cleanly)."""
    lines: list[str] = []
    try:
        async with client.stream("POST", CHAT, json=payload) as response:
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
    except httpx.TransportError as exc:
        return lines, exc
    return lines, None


def test_fault_decisions_are_seeded_and_follow_the_rates() -> None:
    faults = FaultConfig(error_503_rate=0.25, cut_stream_rate=0.5)
    first, second = FaultInjector(faults, seed=3), FaultInjector(faults, seed=3)
    decisions = [(first.reject_with_503(), first.cut_point(100)) for _ in range(400)]
    assert decisions == [(second.reject_with_503(), second.cut_point(100)) for _ in range(400)]
    assert 70 <= sum(rejected for rejected, _ in decisions) <= 130
    cuts = [cut for _, cut in decisions if cut is not None]
    assert 160 <= len(cuts) <= 240 and all(1 <= cut <= 99 for cut in cuts)
    assert FaultInjector(FaultConfig(cut_stream_rate=1.0), seed=0).cut_point(1) is None  # nothing to cut


async def test_cut_streams_end_without_done(start_sim: StartSim) -> None:
    sim = start_sim(faults={"cut_stream_rate": 1.0})
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        lines, error = await read_stream(client, body(stream=True))
        whole = await client.post(CHAT, json=body())  # non-streaming answers are not cut
        stats = (await client.get("/sim/stats")).json()
    assert isinstance(error, httpx.RemoteProtocolError)
    assert lines and "data: [DONE]" not in lines and '"finish_reason":"length"' not in "".join(lines)
    assert whole.status_code == 200
    assert (stats["streams_cut"], stats["requests_completed"], stats["aborted_requests"]) == (1, 1, 1)


async def test_fault_knobs_change_at_run_time(start_sim: StartSim, captured: Captured) -> None:
    sim = start_sim()
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        assert (await client.post(CHAT, json=body(4))).status_code == 200
        knobs = (await client.post("/sim/faults", json={"error_503_rate": 1.0})).json()
        assert knobs == {
            "error_503_rate": 1.0,
            "cut_stream_rate": 0.0,
            "extra_latency_s": 0.0,
            "restart_downtime_s": 2.0,
            "error_500_rate": 0.0,
            "stall_stream_rate": 0.0,
            "stall_s": 60.0,
            "first_token_delay_s": 0.0,
            "crash_on_text": None,
        }
        refused = await client.post(CHAT, json=body(4))
        assert refused.status_code == 503 and refused.content == captured.bytes("chat_queue_full_503.json")
        assert (await client.get("/sim/faults")).json()["error_503_rate"] == 1.0
        assert (await client.post("/sim/faults", json={"error_503_rate": 2.0})).status_code == 400
        assert (await client.post("/sim/faults", json={"no_such_knob": 1})).status_code == 400
        assert (await client.post("/sim/faults", json={"error_503_rate": 0.0})).status_code == 200
        assert (await client.post(CHAT, json=body(4))).status_code == 200
        stats = (await client.get("/sim/stats")).json()
    assert (stats["injected_503"], stats["requests_completed"]) == (1, 2)


async def test_extra_latency_delays_every_answer(start_sim: StartSim) -> None:
    sim = start_sim(faults={"extra_latency_s": 0.3})
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        started = time.monotonic()
        assert (await client.post(CHAT, json=body(2))).status_code == 200
    assert time.monotonic() - started >= 0.3


async def test_injected_500s_have_a_body_that_is_not_json(start_sim: StartSim) -> None:
    sim = start_sim(faults={"error_500_rate": 1.0})
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        failed = [await client.post(CHAT, json=body(2, stream=stream)) for stream in (False, True)]
        stats = (await client.get("/sim/stats")).json()
    assert [r.status_code for r in failed] == [500, 500]
    assert {r.text for r in failed} == {"Internal Server Error"}
    assert failed[0].headers["content-type"].startswith("text/plain")
    assert (stats["injected_500"], stats["requests_received"]) == (2, 0)


async def test_a_stalled_stream_sends_nothing_until_the_client_gives_up(start_sim: StartSim) -> None:
    sim = start_sim(faults={"stall_stream_rate": 1.0, "stall_s": 30.0})
    timeout = httpx.Timeout(10, read=0.5)
    async with httpx.AsyncClient(base_url=sim.url, timeout=timeout) as client:
        started = time.monotonic()
        lines, error = await read_stream(client, body(40, stream=True))
        waited = time.monotonic() - started
        whole = await client.post(CHAT, json=body(4))  # non-streaming answers do not stall
        await asyncio.sleep(0.2)
        stats = (await client.get("/sim/stats")).json()
    assert isinstance(error, httpx.ReadTimeout) and waited < 5
    assert "data: [DONE]" not in lines
    assert whole.status_code == 200
    assert stats["streams_stalled"] == 1


async def test_first_token_delay_holds_every_stream_after_its_headers(start_sim: StartSim) -> None:
    sim = start_sim(faults={"first_token_delay_s": 0.4})
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        started = time.monotonic()
        async with client.stream("POST", CHAT, json=body(4, stream=True)) as response:
            headers_s = time.monotonic() - started
            lines = response.aiter_lines()
            first = await anext(lines)
            first_s = time.monotonic() - started
            rest = [line async for line in lines]
    assert response.status_code == 200 and headers_s < 0.3 and first_s >= 0.4
    assert first.startswith("data: ") and "data: [DONE]" in rest


async def test_restart_cuts_everything_goes_down_then_comes_back_reset(start_sim: StartSim) -> None:
    sim = start_sim(time_scale=0.2)  # answers of 400 tokens take ~2 s
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        assert (await client.post(CHAT, json=body(2))).status_code == 200
        stream = asyncio.create_task(read_stream(client, body(400, stream=True)))
        whole = asyncio.create_task(client.post(CHAT, json=body(400)))
        await asyncio.sleep(0.3)
        restart = await client.post("/sim/restart", json={"downtime_s": 0.5})
        lines, error = await stream
        with pytest.raises(httpx.RemoteProtocolError):
            await whole
        down = [(await client.get(path)).status_code for path in ("/health", "/metrics", "/v1/models")]
        refused = await client.post(CHAT, json=body(2))
        await asyncio.sleep(0.6)
        back = (await client.get("/health")).status_code
        stats = (await client.get("/sim/stats")).json()
        metrics = (await client.get("/metrics")).text
    assert restart.json() == {"restarting": True, "downtime_s": 0.5}
    assert lines and "data: [DONE]" not in lines and isinstance(error, httpx.RemoteProtocolError)
    assert down == [503, 503, 503] and refused.status_code == 503 and back == 200
    assert (stats["restarts"], stats["requests_received"], stats["generated_tokens"]) == (1, 0, 0)
    counted = {f.name: f.samples for f in text_string_to_metric_families(metrics)}["sglang:num_requests"]
    assert counted == []  # counters start again from nothing


async def test_startup_delay_keeps_health_at_503(start_sim: StartSim) -> None:
    sim = start_sim(startup_delay_s=0.4)
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        assert (await client.get("/health")).status_code == 503
        assert (await client.post(CHAT, json=body(2))).status_code == 503
        await asyncio.sleep(0.5)
        assert (await client.get("/health")).status_code == 200
        assert (await client.post(CHAT, json=body(2))).status_code == 200


async def test_engine_restart_drops_tickets_and_resets_state() -> None:
    engine = Engine(SimConfig(max_total_tokens=4096, context_length=1024))
    sized = size_request(ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=10), 1024)
    tickets = [engine.submit(sized, streaming=True), engine.submit(sized, streaming=False)]
    assert engine.scheduler.step() is not None  # both admitted
    engine.restart(downtime_s=30)
    assert [t.outcome for t in tickets] == [Outcome.DROPPED, Outcome.DROPPED]
    assert all(t.changed.is_set() for t in tickets)
    assert engine.scheduler.idle and engine.scheduler.counters.prefill_steps == 0
    assert engine.stats.requests_received == 0 and engine.restarts == 1 and not engine.tickets
    assert engine.unavailable_reason() == "restarting"


async def test_engine_counts_queue_full_refusals() -> None:
    engine = Engine(SimConfig(max_total_tokens=4096, context_length=1024, max_queued_requests=1))
    sized = size_request(ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=10), 1024)
    engine.submit(sized, streaming=False)
    with pytest.raises(QueueFullError):
        engine.submit(sized, streaming=False)
    assert (engine.stats.requests_received, engine.stats.rejected_queue_full) == (2, 1)


async def test_answer_knobs_change_at_run_time(start_sim: StartSim) -> None:
    """Longer answers mid-run (the controller benchmark's phase shift): every answer now runs to max."""
    sim = start_sim()
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        knobs = (await client.post("/sim/answers", json={"stop_probability": 0.0})).json()
        assert knobs["stop_probability"] == 0.0 and "seed" not in knobs
        answers = [(await client.post(CHAT, json=body(30, seed=i))).json() for i in range(5)]
        assert all(a["usage"]["completion_tokens"] == 30 for a in answers)
        assert (await client.post("/sim/answers", json={"seed": 3})).status_code == 400
        assert (await client.post("/sim/answers", json={"stop_probability": 2})).status_code == 400
        assert (await client.get("/sim/answers")).json()["stop_probability"] == 0.0


def test_a_prompt_with_the_crash_text_brings_the_simulator_process_down() -> None:
    """``crash_on_text``: the request is never answered, its connection drops and the process exits
    as one aborted does (134), as a server at a kernel fault on one input; other prompts are answered."""
    from sglang_launch.simulator import SimulatorProcess

    config = SimConfig(time_scale=0.02, log_level="warning", faults=FaultConfig(crash_on_text="KILLER"))
    with SimulatorProcess(config) as sim:

        def ask(text: str) -> httpx.Response:
            body = {"model": "sim-model", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
            return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10)

        assert ask("hello").status_code == 200
        with pytest.raises(httpx.TransportError):
            ask("a KILLER prompt")
        proc = sim._proc
        assert proc is not None and proc.wait(timeout=10) == 134
