"""TLS endpoints: a private CA named by ``ca_bundle`` is trusted; a certificate that does not verify
stops the endpoint at once (one attempt, one clear line), because no retry can make it trusted.

The server is a loopback aiohttp app with a certificate from trustme's throwaway CA.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from flows.client.endpoint import EndpointClient, RetryPolicy
from flows.client.errors import FatalEndpointError
from flows.client.guard import EndpointGuard
from flows.client.sampling import SamplingParams
from flows.config import ConfigError, parse_config
from flows.control.vram import MIB, VramSample
from flows.control.wiring import Control
from flows.run.endpoints import EndpointPool

ANSWER = {
    "id": "1",
    "object": "chat.completion",
    "created": 0,
    "model": "tls-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Server:
    """The HTTPS server's address and how many requests reached its handlers."""

    def __init__(self) -> None:
        self.url = ""
        self.requests = 0

    async def chat(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.json_response(ANSWER)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def exporter(self, request: web.Request) -> web.Response:
        """A DCGM exporter's metrics: free and used MiB of GPU 0."""
        return web.Response(text='DCGM_FI_DEV_FB_FREE{gpu="0"} 9000\nDCGM_FI_DEV_FB_USED{gpu="0"} 71000\n')


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def server(ca: trustme.CA) -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", state.chat)
    app.router.add_get("/health", state.health)
    app.router.add_get("/metrics", state.exporter)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"https://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


def _pem(ca: trustme.CA, tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    ca.cert_pem.write_to_path(str(path))
    return str(path)


async def _ask(server: Server, ca_bundle: str | None) -> str | None:
    # Many attempts allowed with no wait: a certificate failure must still take exactly one.
    retry = RetryPolicy(max_attempts=5, initial_wait_s=0.0)
    client = EndpointClient(server.url, "tls-model", None, stream=False, ca_bundle=ca_bundle, retry=retry)
    try:
        messages = [{"role": "user", "content": "hello"}]
        generation = await client.generate(messages, None, SamplingParams(max_tokens=8))
    finally:
        await client.aclose()
    return generation.message["content"]


async def test_the_ca_named_by_ca_bundle_is_trusted(server: Server, ca: trustme.CA, tmp_path: Path) -> None:
    assert await _ask(server, _pem(ca, tmp_path, "ca.pem")) == "hi"
    assert server.requests == 1


async def test_without_the_ca_the_endpoint_fails_at_once_and_is_not_retried(server: Server) -> None:
    with pytest.raises(FatalEndpointError) as caught:
        await _ask(server, None)
    assert caught.value.attempts == 1
    assert "certificate verif" in str(caught.value) and "ca_bundle" in str(caught.value)
    assert "\n" not in caught.value.reason
    assert server.requests == 0


async def test_a_wrong_ca_fails_at_once_and_is_not_retried(server: Server, tmp_path: Path) -> None:
    with pytest.raises(FatalEndpointError) as caught:
        await _ask(server, _pem(trustme.CA(), tmp_path, "other-ca.pem"))
    assert caught.value.attempts == 1
    assert "ca_bundle" in caught.value.reason
    assert server.requests == 0


async def test_the_health_check_trusts_the_same_ca(server: Server, ca: trustme.CA, tmp_path: Path) -> None:
    """The guard that waits for a silent server must not read a private CA as an outage."""
    assert await EndpointGuard(server.url, ca_bundle=_pem(ca, tmp_path, "ca.pem")).healthy()
    assert not await EndpointGuard(server.url).healthy()


async def test_the_oom_guards_dcgm_exporter_is_read_trusting_the_endpoints_ca(
    server: Server, ca: trustme.CA, tmp_path: Path
) -> None:
    """An exporter on the GPU node behind the same private CA as its server (here, the server itself):
    read with the system's CAs, it was one warning and no OOM guard."""
    endpoint = {"url": server.url, "model": "tls-model", "ca_bundle": _pem(ca, tmp_path, "ca.pem")}
    config = parse_config(
        _config({**endpoint, "vram": f"{server.url}/metrics"})
        | {"run": {"name": "r", "output_dir": str(tmp_path)}}
    )
    pool = EndpointPool(config)
    await pool.open()
    control = Control(pool.endpoints, config.concurrency, tmp_path)
    try:
        [controller] = control.controllers
        assert controller.vram is not None
        assert await controller.vram.read() == VramSample(9000 * MIB, 80000 * MIB)
    finally:
        await control.aclose()
        await pool.aclose()


def _config(endpoint: dict[str, object]) -> dict[str, object]:
    return {
        "run": {"name": "r"},
        "endpoints": [endpoint],
        "categories": [{"name": "c", "source": "p.jsonl", "format": "messages"}],
    }


def test_a_missing_ca_bundle_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config({"url": "https://gpu:30000", "ca_bundle": str(tmp_path / "nope.pem")}))
    assert "ca_bundle" in str(caught.value) and "nope.pem" in str(caught.value)


def test_a_relative_ca_bundle_is_relative_to_the_config_file(ca: trustme.CA, tmp_path: Path) -> None:
    _pem(ca, tmp_path, "ca.pem")
    config = parse_config(_config({"url": "https://gpu:30000", "ca_bundle": "ca.pem"}), base=tmp_path)
    assert config.endpoints[0].ca_bundle == str((tmp_path / "ca.pem").resolve())
