"""The controller's loop around the law: a tick that raises must not leave its lane frozen."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import flows.control.controller as controller_module
from flows.client.guard import Endpoint
from flows.control.adaptive import AdaptiveLimit, LawSettings
from flows.control.controller import EndpointController
from flows.control.limiter import Lane, Limiter
from flows.control.signals import ServerSample
from flows.control.timeline import Timeline


async def test_a_failing_tick_unpaces_the_lane_warns_once_and_the_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(controller_module, "server_info", lambda *args: None)
    client = SimpleNamespace(endpoint="http://127.0.0.1:9", api_key=None, ca_bundle=None)
    endpoint = Endpoint(client, SimpleNamespace(up=True))  # type: ignore[arg-type]
    law = AdaptiveLimit(LawSettings(initial_limit=8))
    lane: Lane[Endpoint] = Lane(endpoint, law)
    limiter = Limiter([lane])
    controller = EndpointController(lane, law, limiter, Timeline(tmp_path), poll_s=0.01)
    # the last decision paced the lane at zero with its credit spent (a cohort at the budget)
    lane.pacer.set(0.0, 1.0, time.monotonic())
    lane.set_credit(0)
    reads = 0

    async def read() -> ServerSample | None:
        nonlocal reads
        reads += 1
        if reads <= 5:
            raise TypeError("int() argument must be a string or a number, not 'NoneType'")
        return None

    controller.reader.read = read  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger=controller_module.__name__)
    task = asyncio.create_task(controller.run())
    try:
        admitted = await asyncio.wait_for(limiter.acquire(), 2)  # the stalled lane admits again
        assert admitted is lane
        while reads < 8:
            await asyncio.sleep(0.01)
        assert not task.done()  # the loop survived its failures
        assert controller.failed_ticks == 5 and controller.last is not None  # then decided again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await controller.aclose()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "controller failed (TypeError" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None
    assert any("works again (5 failed ticks)" in r.getMessage() for r in caplog.records)
