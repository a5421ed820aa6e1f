"""The controller's loop around the law: a tick that raises must not leave its lane frozen."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import flows.control.controller as controller_module
import flows.control.vram as vram_module
from flows.client.guard import Endpoint, EndpointGuard
from flows.control.adaptive import AdaptiveLimit, LawSettings
from flows.control.controller import EndpointController
from flows.control.limiter import Lane, Limiter
from flows.control.signals import ServerSample
from flows.control.timeline import Timeline
from flows.control.vram import VramReader


def _paced_at_zero(
    tmp_path: Path, guard: EndpointGuard | None = None, **options: Any
) -> tuple[Lane[Endpoint], Limiter[Endpoint], EndpointController]:
    """A lane, its limiter and its controller, the last decision having paced the lane at zero with
    its credit spent (a cohort at the budget): only a new tick lets it admit again."""
    client = SimpleNamespace(endpoint="http://127.0.0.1:9", api_key=None, ca_bundle=None)
    endpoint = Endpoint(client, guard or EndpointGuard(client.endpoint))  # type: ignore[arg-type]
    law = AdaptiveLimit(LawSettings(initial_limit=8))
    lane: Lane[Endpoint] = Lane(endpoint, law)
    limiter = Limiter([lane])
    controller = EndpointController(lane, law, limiter, Timeline(tmp_path), poll_s=0.01, **options)
    lane.pacer.set(0.0, 1.0, time.monotonic())
    lane.set_credit(0)
    return lane, limiter, controller


async def test_a_failing_tick_unpaces_the_lane_warns_once_and_the_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(controller_module, "server_info", lambda *args: None)
    lane, limiter, controller = _paced_at_zero(tmp_path)
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


async def test_a_reading_that_hangs_fails_its_tick_so_a_lane_paced_at_zero_admits_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU memory reading that never returns (NVML on a GPU fallen off the bus) held the
    controller's loop forever: no tick failed, so a lane the last decision paced at zero admitted
    nothing for the rest of the run."""
    monkeypatch.setattr(controller_module, "server_info", lambda *args: None)
    nvml_calls = 0
    unstuck = threading.Event()

    def stuck_nvml(gpus: object) -> list[tuple[int, int]]:
        nonlocal nvml_calls
        nvml_calls += 1
        unstuck.wait(10)  # a call that does not return while the test runs
        return [(1 << 30, 1 << 34)]

    monkeypatch.setattr(vram_module, "read_memory", stuck_nvml)
    lane, limiter, controller = _paced_at_zero(tmp_path, vram=VramReader("nvml"), read_deadline_s=0.05)

    async def read() -> ServerSample | None:
        return None

    controller.reader.read = read  # type: ignore[method-assign]
    task = asyncio.create_task(controller.run())
    try:
        admitted = await asyncio.wait_for(limiter.acquire(), 2)
        assert admitted is lane
        while controller.failed_ticks < 3:
            await asyncio.sleep(0.01)
        assert nvml_calls == 1  # not a new thread per tick while the first is stuck
    finally:
        unstuck.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await controller.aclose()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not read within" in warnings[0].getMessage()


async def test_a_restart_the_law_detects_has_the_oom_guard_find_the_servers_gpus_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's GPUs are found once, at the first reading, not at every tick; a restart (its
    memory let go) has them found again: its processes are new."""
    looked_up: list[int] = []
    free = {0: 10 << 30}

    def server_gpus(port: int, proc_root: Path) -> tuple[frozenset[int], str]:
        looked_up.append(port)
        return frozenset(free), "its own"

    monkeypatch.setattr(vram_module, "server_gpus", server_gpus)
    monkeypatch.setattr(vram_module, "read_memory", lambda gpus: [(free[i], 80 << 30) for i in sorted(gpus)])
    reader = VramReader("nvml", server_url="http://127.0.0.1:9")
    _, _, controller = _paced_at_zero(tmp_path, vram=reader)
    for at in range(3):
        assert not controller.tick(at, None, await reader.read()).restarted
    assert looked_up == [9]
    free[0] = 79 << 30  # the server let go of its pool
    assert controller.tick(3, None, await reader.read()).restarted
    assert not controller.tick(4, None, await reader.read()).restarted
    assert looked_up == [9, 9]
    await controller.aclose()


class BlockingRestart:
    """The engine of a launched server that died once ``dead`` is set: its restart blocks (minutes
    for a large model) until ``started`` is set."""

    def __init__(self) -> None:
        self.dead = False
        self.restarting, self.started = threading.Event(), threading.Event()

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[str]:
        if not self.dead:
            return []
        if on_start is not None:
            on_start()
        self.restarting.set()
        self.started.wait(5)
        self.dead = False
        return ["restarted"]


async def test_a_requests_passing_health_check_is_no_restart_to_the_law_and_a_real_restart_is_one(
    tmp_path: Path,
) -> None:
    """Every request failing on its endpoint (a busy server's 503, a cut stream) has the guard check
    its health, its lane closed meanwhile. A tick within that check read the endpoint down, the next
    one up: "restart detected", the limit back at its cautious start and growth held for a request's
    life, on a server that never stopped. A server restarted is down to the law for the whole restart
    and the check after it, and detected once."""
    engine = BlockingRestart()
    guard = EndpointGuard("http://127.0.0.1:9", engine, poll_s=0.01)  # type: ignore[arg-type]
    checking, answer = asyncio.Event(), asyncio.Event()

    async def healthy() -> bool:
        checking.set()
        await answer.wait()
        return True

    guard.healthy = healthy  # type: ignore[method-assign]
    _, _, controller = _paced_at_zero(tmp_path, guard)
    busy = [controller.tick(0, None)]
    failed = asyncio.create_task(guard.recover())  # a request's failure on a server that serves
    await checking.wait()
    assert not guard.is_up()  # its lane takes no new request while the check runs
    busy.append(controller.tick(1, None))
    answer.set()
    assert await failed
    busy += [controller.tick(at, None) for at in (2, 3)]
    assert not any(d.restarted or "endpoint down" in d.reason for d in busy), [d.reason for d in busy]

    engine.dead = True
    checking.clear()
    answer.clear()
    restarted = asyncio.create_task(guard.recover())
    assert await asyncio.to_thread(engine.restarting.wait, 5)
    down = [controller.tick(at, None) for at in (4, 5)]  # the restart under way
    engine.started.set()
    await checking.wait()  # restarted, its health check not answered yet
    down.append(controller.tick(6, None))
    answer.set()
    assert await restarted
    back = [controller.tick(at, None) for at in (7, 8, 9)]
    assert all(d.reason == "hold: endpoint down" for d in down), [d.reason for d in down]
    assert [d.restarted for d in back] == [True, False, False]
    assert back[0].reason.endswith("restart detected: cautious start")
    await controller.aclose()
