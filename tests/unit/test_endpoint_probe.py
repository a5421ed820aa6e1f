"""The probe loop that puts endpoints given up on back in service (``EndpointPool.probe_loop``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from flows.client.guard import Endpoint, EndpointGuard
from flows.config import RunConfig
from flows.run import endpoints
from flows.run.endpoints import EndpointPool

SILENT_S = 5.0
"""A host that drops packets: its health check ends at the probe's timeout (``is_healthy``'s 5 s)."""


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
