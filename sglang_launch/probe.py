"""Asking a server how it is: the one health poller and the one server-info reader.

The launcher waits on ``wait_healthy`` for a server it started; a run's endpoint guard asks
``is_healthy_async`` when requests fail and when it probes the endpoints given up on; the controller
reads the KV capacity through ``server_info``.
SGLang answers ``/health`` 503 while it starts; vLLM and the simulator answer it too.
Every reader of an endpoint trusts the same CAs as its requests and reaches it the same way, directly
(``endpoint_http``).
"""

from __future__ import annotations

import contextlib
import functools
import ssl
import time
from collections.abc import Callable
from typing import Any, Literal, TypedDict

import httpx

Outcome = Literal["ready", "failed", "timeout"]


@functools.cache
def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The SSL context for an endpoint: only ``ca_bundle``'s CAs when given, else the system's.

    One per bundle per process: loading a CA store costs about 0.1 s of CPU, which every client
    built with ``verify=True`` would otherwise pay again at start-up.
    """
    return ssl.create_default_context(cafile=ca_bundle)


class EndpointHttp(TypedDict):
    """An httpx client's options for reading an endpoint (``endpoint_http``)."""

    verify: ssl.SSLContext
    trust_env: bool


def endpoint_http(ca_bundle: str | None = None) -> EndpointHttp:
    """How every httpx reader of an endpoint connects (health, loads, server info, the model list):
    with ``ca_bundle``'s CAs, and directly, as the chat requests, posted on aiohttp, which leaves
    ``HTTP(S)_PROXY`` alone. httpx honours those by default: behind a proxy that cannot reach the GPU
    hosts (``NO_PROXY`` not naming them) the rows came while every health check failed, so a server's
    first blip was waited on until the run gave up on it, and the controller ran without readings."""
    return {"verify": tls_context(ca_bundle), "trust_env": False}


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def is_healthy_async(
    url: str, *, api_key: str | None = None, timeout_s: float = 5.0, ca_bundle: str | None = None
) -> bool:
    """``GET /health`` answered 200; any connection error or other status is "not healthy".

    The endpoint's key goes with it: SGLang and vLLM leave ``/health`` open and ignore it, but a
    gateway in front of them may check it on every path (LiteLLM's proxy does on ``/health``), and
    its 401 would keep an endpoint that blipped out of the run for good. Async, without a thread: a
    silent host's check lasts its whole timeout, and in ``asyncio.to_thread`` it held one of the
    default pool's few threads (min(32, cores + 4)) that the run's other blocking work shares: new
    connections' address lookups, shard writes, prompt reads. Many silent endpoints stalled all of
    it every probe round."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s, **endpoint_http(ca_bundle)) as client:
            response = await client.get(f"{url}/health", headers=auth_headers(api_key))
        return response.status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(
    url: str, alive: Callable[[], bool], *, timeout_s: float, poll_s: float, api_key: str | None = None
) -> Outcome:
    """Poll ``/health`` until it answers 200 ("ready"), the process dies ("failed") or time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=max(poll_s, 2.0), headers=auth_headers(api_key), **endpoint_http()) as client:
        while alive():
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return "ready"
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(poll_s)
    return "failed"


def server_info(url: str, api_key: str | None, ca_bundle: str | None = None) -> dict[str, Any] | None:
    """SGLang's ``/get_server_info`` (server args, ``max_total_num_tokens``...); None where not served."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        headers = auth_headers(api_key)
        info = httpx.get(
            f"{url}/get_server_info", headers=headers, timeout=10.0, **endpoint_http(ca_bundle)
        ).json()
        if isinstance(info, dict):
            return info
    return None


def kv_capacity(info: dict[str, Any] | None) -> int | None:
    """The KV pool size in tokens from a server-info document; None if it does not say."""
    return _int_field(info, "max_total_num_tokens")


def kv_page_tokens(info: dict[str, Any] | None) -> int | None:
    """The KV pool's page size in tokens (SGLang's ``page_size``: a request holds whole pages)."""
    return _int_field(info, "page_size")


def _int_field(info: dict[str, Any] | None, name: str) -> int | None:
    value = (info or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
