"""The probe loop that puts endpoints given up on back in service (``EndpointPool.probe_loop``)."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from flows.client.guard import Endpoint, EndpointGuard
from flows.config import RunConfig
from flows.run import endpoints
from flows.run.endpoints import EndpointPool

SILENT_S = 5.0
"""A host that drops packets: its health check ends at the probe's timeout (``is_healthy_async``'s 5 s)."""


def _given_up(url: str, answers: bool) -> EndpointGuard:
    guard = EndpointGuard(url, patience_s=0)

    async def healthy() -> bool:
        if not answers:
            await asyncio.sleep(SILENT_S)
        return answers

    guard.healthy = healthy  # type: ignore[method-assign]
    guard.up = False
    guard._give_up()
    return guard


async def test_a_returning_endpoint_is_noticed_within_a_probe_however_many_hosts_are_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked one after another, four silent hosts listed first held the fifth's return ~20 s."""
    monkeypatch.setattr(endpoints, "PROBE_S", 0.05)
    config = RunConfig.model_validate(
        {
            "run": {"name": "probe"},
            "endpoints": [{"url": f"http://10.0.0.{i}:30000"} for i in range(5)],
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    pool = EndpointPool(config)
    guards = [_given_up(e.url, answers=i == 4) for i, e in enumerate(config.endpoints)]
    pool.endpoints = [Endpoint(client=None, guard=guard) for guard in guards]  # type: ignore[arg-type]
    started = time.monotonic()
    loop = asyncio.create_task(pool.probe_loop())
    try:
        async with asyncio.timeout(2.0):
            while not guards[4].up:
                await asyncio.sleep(0.01)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    assert time.monotonic() - started < 1.0
    assert [guard.up for guard in guards] == [False, False, False, False, True]


async def test_probes_of_silent_endpoints_leave_the_shared_thread_pool_to_the_rest_of_the_run() -> None:
    """asyncio's default thread pool (``min(32, cores + 4)`` threads) also looks up the address of
    each new connection to an endpoint that answers, writes the shards and reads the prompts. A
    health check held one of its threads for its whole 5 s timeout: with as many endpoints silent as
    the pool has threads, each probe round stalled all of that work for 5 s."""
    pool_threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default on Python 3.11
    with socket.create_server(("127.0.0.1", 0), backlog=128) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        guards = [EndpointGuard(f"http://127.0.0.1:{port}", patience_s=0) for _ in range(pool_threads + 2)]
        for guard in guards:
            guard.up = False
            guard._give_up()
        probes = asyncio.gather(*(guard.probe() for guard in guards))
        try:
            await asyncio.sleep(0.3)  # every probe is waiting for its silent host
            began = time.monotonic()
            await asyncio.get_running_loop().getaddrinfo("localhost", port)  # a new connection's lookup
            await asyncio.to_thread(time.sleep, 0)  # a shard write
            waited = time.monotonic() - began
        finally:
            probes.cancel()
            await asyncio.gather(probes, return_exceptions=True)
    assert waited < 1.0, f"work on the shared pool waited {waited:.1f} s behind the probes"
    assert not any(guard.up for guard in guards)
