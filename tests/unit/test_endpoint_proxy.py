"""Every reader of an endpoint reaches it the way its chat requests do: directly, whatever proxy the
environment names.

The chat requests (the rows) are posted on aiohttp, which leaves ``HTTP_PROXY`` alone. The health
check, the load readings and the model lookup were httpx clients, which honour it: behind a corporate
proxy that cannot reach the GPU hosts (``HTTP_PROXY`` set, ``NO_PROXY`` not naming them) the rows came
while every health check failed, so the first blip of a server had the run wait for it until it gave
up (exit 3 with one endpoint), and the controller ran without load readings, warned that the server
"serves neither /metrics nor /v1/loads".
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from flows.client.endpoint import EndpointClient
from flows.client.guard import EndpointGuard
from flows.client.sampling import SamplingParams
from flows.control.signals import SignalReader
from flows.control.vram import MIB, VramReader, VramSample
from sglang_launch.probe import server_info, wait_healthy

MESSAGE = {"role": "assistant", "content": "hi"}
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
ANSWER = {"id": "1", "object": "chat.completion", "created": 0, "model": "m", "usage": USAGE}
ANSWER["choices"] = [{"index": 0, "message": MESSAGE, "finish_reason": "stop"}]
ROUTES: list[tuple[str, str, dict[str, object]]] = [
    ("POST", "/v1/chat/completions", ANSWER),
    (
        "GET",
        "/v1/models",
        {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]},
    ),
    ("GET", "/health", {}),
    ("GET", "/v1/loads", {"loads": [{"num_running_reqs": 1, "num_waiting_reqs": 0}]}),
    ("GET", "/get_server_info", {"max_total_num_tokens": 64}),
]
EXPORTER = 'DCGM_FI_DEV_FB_FREE{gpu="0"} 9000\nDCGM_FI_DEV_FB_USED{gpu="0"} 71000\n'
"""A DCGM exporter's ``/metrics``: the OOM guard's reading of a remote server's GPU."""


def _answer(body: dict[str, object]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body)

    return handler


async def _exporter(request: web.Request) -> web.Response:
    return web.Response(text=EXPORTER)


def _closed_port() -> int:
    """A port nothing listens on: the proxy that cannot reach anything."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A loopback server, with the environment naming a proxy that answers nothing."""
    app = web.Application()
    for method, path, body in ROUTES:
        app.router.add_route(method, path, _answer(body))
    app.router.add_get("/dcgm/metrics", _exporter)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy = f"http://127.0.0.1:{_closed_port()}"
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_the_chat_requests_go_directly(server: str) -> None:
    """What the other readers must match: the rows come from the server, not through the proxy."""
    client = EndpointClient(server, "m", None, stream=False)
    try:
        generation = await client.generate(
            [{"role": "user", "content": "hello"}], None, SamplingParams(max_tokens=8)
        )
    finally:
        await client.aclose()
    assert generation.message["content"] == "hi"


async def test_the_health_check_reaches_the_server_the_chat_requests_reach(server: str) -> None:
    assert await EndpointGuard(server).healthy()


async def test_the_load_readings_reach_it_too(server: str) -> None:
    reader = SignalReader(server)
    try:
        sample = await reader.read()
    finally:
        await reader.aclose()
    assert sample is not None


async def test_the_model_lookup_reaches_it_too(server: str) -> None:
    client = EndpointClient(server, None, None, stream=False)
    try:
        assert await client.detect_model() == "m"
    finally:
        await client.aclose()


async def test_the_launchers_wait_and_server_info_reach_it_too(server: str) -> None:
    """A launched server is on this machine: its start was judged never healthy through the proxy."""
    wait = asyncio.to_thread(wait_healthy, server, lambda: True, timeout_s=2.0, poll_s=0.1)
    assert await wait == "ready"
    assert await asyncio.to_thread(server_info, server, None) == {"max_total_num_tokens": 64}


async def test_the_oom_guards_dcgm_exporter_is_reached_directly_too(server: str) -> None:
    """An exporter on the GPU node, as the servers are: through a proxy set for package downloads it
    was no OOM guard (or its address sent to the proxy)."""
    reader = VramReader(f"{server}/dcgm/metrics")
    try:
        assert await reader.read() == VramSample(9000 * MIB, 80000 * MIB)
    finally:
        await reader.aclose()
