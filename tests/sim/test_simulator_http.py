"""The HTTP surface against the real server's captures: status codes, headers, body layouts, SSE."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from flows.control.signals import parse_loads
from sglang_launch.simulator import ThreadedSimulator

if TYPE_CHECKING:
    from conftest import Captured, StartSim

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello in one word."}]


def chat(sim: ThreadedSimulator, **fields: Any) -> httpx.Response:
    return httpx.post(sim.url + CHAT, json={"model": "tinyllm", "messages": HELLO, **fields}, timeout=10)


def without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def test_health_is_200_with_an_empty_body(sim: ThreadedSimulator) -> None:
    response = httpx.get(sim.url + "/health")
    assert (response.status_code, response.content, response.headers["content-length"]) == (200, b"", "0")
    assert httpx.get(sim.url + "/health_generate").status_code == 200


def test_v1_models_matches_the_real_body(sim: ThreadedSimulator, captured: Captured) -> None:
    response = httpx.get(sim.url + "/v1/models")
    assert response.headers["content-type"] == "application/json"
    ours, real = response.json(), captured.json("v1_models.json")
    assert without(ours["data"][0], "created") == without(real["data"][0], "created")
    assert captured.key_tree(ours) == captured.key_tree(real)


def test_v1_loads_has_the_real_layout_and_live_values(sim: ThreadedSimulator, captured: Captured) -> None:
    ours = httpx.get(sim.url + "/v1/loads").json()
    load = ours["loads"][0]
    # nothing decoded yet, so no decode sums (SGLang's null); a real server has its warm-up's six steps
    assert (load["decode_moments"], load["total_prefill_busy_us"]) == (None, 0)
    warmed = {**ours, "loads": [{**load, "decode_moments": [0.0] * 6}]}
    assert captured.key_tree(warmed) == captured.key_tree(captured.json("v1_loads_idle.json"))
    assert (load["max_total_num_tokens"], load["max_running_requests"], load["num_running_reqs"]) == (
        4096,
        16,
        0,
    )
    assert ours["version"] == "0.5.23"


def test_v1_loads_counts_busy_time_in_wall_clock_microseconds(start_sim: StartSim) -> None:
    sim = start_sim(time_scale=0.5)
    httpx.post(
        sim.url + "/v1/chat/completions",
        json={"model": "tinyllm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=30,
    ).raise_for_status()
    load = httpx.get(sim.url + "/v1/loads").json()["loads"][0]
    counters = httpx.get(sim.url + "/sim/stats").json()
    steps, batch, step_us = load["decode_moments"][:3]
    assert steps == counters["decode_steps"] > 0 and batch == steps  # one request, one token a step
    assert step_us == pytest.approx(counters["decode_moments"][2] * 0.5 * 1e6)  # simulated s x time scale
    assert load["total_prefill_busy_us"] == round(counters["prefill_busy_s"] * 0.5 * 1e6)
    sample = parse_loads(httpx.get(sim.url + "/v1/loads").json())
    assert sample is not None and sample.busy_us == pytest.approx(step_us + load["total_prefill_busy_us"])


def test_server_info_keeps_the_real_key_layout(sim: ThreadedSimulator, captured: Captured) -> None:
    real = captured.json("get_server_info.json")
    for route in ("/get_server_info", "/server_info"):
        ours = httpx.get(sim.url + route).json()
        # Every key we serve is a real key, in the real order.
        assert [k for k in real if k in ours] == list(ours)
        internal, real_internal = ours["internal_states"][0], real["internal_states"][0]
        assert [k for k in real_internal if k in internal] == list(internal)
        assert {k: ours[k] for k in ("max_total_num_tokens", "max_running_requests", "context_length")} == {
            "max_total_num_tokens": 4096,
            "max_running_requests": 16,
            "context_length": 1024,
        }
        assert (ours["served_model_name"], ours["version"], ours["max_req_input_len"]) == (
            "tinyllm",
            "0.5.23",
            1018,
        )
        assert (ours["status"], internal["last_gen_throughput"]) == ("ready", 0.0)


def test_model_info_keys_are_real_keys(sim: ThreadedSimulator, captured: Captured) -> None:
    real = captured.json("get_model_info.json")
    for route in ("/get_model_info", "/model_info"):
        ours = httpx.get(sim.url + route).json()
        assert [k for k in real if k in ours] == list(ours)
        assert ours["served_model_name"] == "tinyllm"


def test_non_streaming_answer_has_the_real_layout(sim: ThreadedSimulator, captured: Captured) -> None:
    response = chat(sim, max_tokens=32)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    ours, real = response.json(), captured.json("chat_nonstream.json")
    assert captured.key_tree(ours) == captured.key_tree(real)
    assert len(ours["id"]) == 32 and ours["model"] == "tinyllm" and ours["object"] == "chat.completion"
    choice = ours["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"], choice["message"]["reasoning_content"]) == (
        "length",
        None,
        None,
    )
    assert ours["usage"] == {
        "prompt_tokens": 13,
        "total_tokens": 45,
        "completion_tokens": 32,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert ours["metadata"]["weight_versions"][0]["end"] == 32


def test_stream_has_the_real_chunk_sequence(sim: ThreadedSimulator, captured: Captured) -> None:
    body = {"model": "tinyllm", "messages": HELLO, "max_tokens": 16, "stream": True}
    with httpx.stream(
        "POST", sim.url + CHAT, json={**body, "stream_options": {"include_usage": True}}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        raw = response.read()
    events, real = captured.sse_events(raw), captured.sse_events(captured.bytes("chat_stream.sse"))
    assert events[-1] == real[-1] == "[DONE]"
    ours_chunks, real_chunks = [json.loads(e) for e in events[:-1]], [json.loads(e) for e in real[:-1]]
    # role chunk, content chunk(s), finish chunk, usage chunk: each shaped like the real one
    assert captured.key_tree(ours_chunks[0]) == captured.key_tree(real_chunks[0])
    assert all(captured.key_tree(c) == captured.key_tree(real_chunks[1]) for c in ours_chunks[1:-2])
    assert captured.key_tree(ours_chunks[-2]) == captured.key_tree(real_chunks[-2])
    assert captured.key_tree(ours_chunks[-1]) == captured.key_tree(real_chunks[-1])
    assert ours_chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert ours_chunks[-1]["usage"]["completion_tokens"] == 16 and ours_chunks[-1]["choices"] == []
    assert len({c["id"] for c in ours_chunks}) == 1
    # The streamed text is the same as the non-streamed answer to the same request.
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in ours_chunks[:-1])
    assert streamed == chat(sim, max_tokens=16).json()["choices"][0]["message"]["content"]


def test_stream_without_include_usage_ends_with_finish_then_done(
    sim: ThreadedSimulator, captured: Captured
) -> None:
    body = {"model": "tinyllm", "messages": HELLO, "max_tokens": 4, "stream": True}
    events = captured.sse_events(httpx.post(sim.url + CHAT, json=body).content)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_too_long_prompt_is_400_json_even_when_streaming(sim: ThreadedSimulator, captured: Captured) -> None:
    long_messages = [{"role": "user", "content": "x" * 4 * (2410 - 7)}]
    for stream in (False, True):
        response = httpx.post(
            sim.url + CHAT, json={"model": "tinyllm", "messages": long_messages, "stream": stream}
        )
        assert response.status_code == 400 and response.headers["content-type"] == "application/json"
        assert response.content == captured.bytes(
            "chat_too_long_stream.sse" if stream else "chat_too_long.json"
        )


def test_invalid_and_malformed_bodies_are_400(sim: ThreadedSimulator, captured: Captured) -> None:
    invalid = chat(sim, messages="this should be a list", max_tokens="sixteen")
    assert invalid.status_code == 400
    assert (
        invalid.json()["message"].split("\n\n")[0]
        == captured.json("chat_invalid_schema.json")["message"].split("\n\n")[0]
    )
    malformed = httpx.post(
        sim.url + CHAT, content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400 and "json_invalid" in malformed.json()["message"]


def test_injected_503_bodies_match_the_real_queue_full_answers(
    start_sim: StartSim, captured: Captured
) -> None:
    sim = start_sim(faults={"error_503_rate": 1.0})
    refused = chat(sim, max_tokens=8)
    assert refused.status_code == 503 and refused.content == captured.bytes("chat_queue_full_503.json")
    stream = chat(sim, max_tokens=8, stream=True, stream_options={"include_usage": True})
    assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream; charset=utf-8"
    ours, real = (
        captured.sse_events(stream.content),
        captured.sse_events(captured.bytes("chat_queue_full_503_stream.sse")),
    )
    assert ours[0] == real[0]  # the error event, byte for byte
    assert without(json.loads(ours[1]), "id", "created") == without(json.loads(real[1]), "id", "created")
    assert ours[2] == real[2] == "[DONE]" and len(ours) == 3


async def test_a_full_queue_answers_503_to_new_arrivals(start_sim: StartSim, captured: Captured) -> None:
    sim = start_sim(max_running_requests=1, max_queued_requests=1, time_scale=0.5)
    body = {"model": "tinyllm", "messages": HELLO, "max_tokens": 200}
    async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
        running = asyncio.create_task(client.post(CHAT, json=body))
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(client.post(CHAT, json=body))
        await asyncio.sleep(0.1)
        refused = await client.post(CHAT, json=body)
        streamed = await client.post(CHAT, json={**body, "stream": True})
        loads = (await client.get("/v1/loads")).json()["loads"][0]
        running.cancel()
        queued.cancel()
    assert refused.status_code == 503 and refused.content == captured.bytes("chat_queue_full_503.json")
    assert streamed.status_code == 200 and captured.sse_events(streamed.content)[0].startswith('{"error": {')
    assert (loads["num_running_reqs"], loads["num_waiting_reqs"]) == (1, 1)


def test_unknown_routes_are_404(sim: ThreadedSimulator) -> None:
    assert httpx.get(sim.url + "/get_load").status_code == 404


def test_a_keyed_simulator_leaves_health_open_as_sglang_does(start_sim: StartSim) -> None:
    """SGLang's --api-key middleware lets /health and /metrics through without the key (probes and
    scrapers) and answers 401 elsewhere; ``key_on_health`` is a gateway that checks it on /health too."""
    key = {"Authorization": "Bearer sim-key"}
    sglang = start_sim(api_key="sim-key")
    assert [httpx.get(sglang.url + path).status_code for path in ("/health", "/metrics", "/v1/models")] == [
        200,
        200,
        401,
    ]
    assert httpx.get(sglang.url + "/v1/models", headers=key).status_code == 200
    gateway = start_sim(api_key="sim-key", key_on_health=True)
    assert httpx.get(gateway.url + "/health").status_code == 401
    assert httpx.get(gateway.url + "/health", headers=key).status_code == 200
