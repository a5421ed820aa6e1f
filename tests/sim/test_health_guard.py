from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from flows.client.guard import EndpointGuard
from flows.config import RunConfig
from flows.run.endpoints import EndpointPool
from sglang_launch.simulator import SimConfig, simulator_in_thread


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeEngine:
    """Starts 'the server' (a simulator) on the first ensure_running call."""

    def __init__(self) -> None:
        self.calls = 0

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[str]:
        self.calls += 1
        if self.calls > 1:
            return []
        if on_start is not None:
            on_start()
        return ["restarted"]


async def test_guard_sees_a_healthy_simulator_at_once() -> None:
    with simulator_in_thread(SimConfig(max_total_tokens=4096, context_length=1024)) as sim:
        guard = EndpointGuard(sim.url, patience_s=5, poll_s=0.05)
        assert await guard.recover() is True
        assert guard.recoveries == 1


async def test_guard_gives_up_after_its_patience_on_a_dead_endpoint() -> None:
    guard = EndpointGuard(f"http://127.0.0.1:{_closed_port()}", patience_s=0.3, poll_s=0.05)
    assert await guard.recover() is False


async def test_guard_restarts_a_launched_engine_once_for_all_waiters() -> None:
    import asyncio

    engine = FakeEngine()
    with simulator_in_thread(SimConfig(max_total_tokens=4096, context_length=1024)) as sim:
        guard = EndpointGuard(sim.url, engine, patience_s=5, poll_s=0.05)  # type: ignore[arg-type]
        results = await asyncio.gather(*(guard.recover() for _ in range(20)))
    assert results == [True] * 20
    assert engine.calls == 1 and guard.restarts == 1


async def test_a_guard_given_up_on_answers_its_waiting_requests_from_one_check_a_poll() -> None:
    """Requests still on an endpoint given up on each ask it before moving elsewhere: one health
    check answers all that ask within a poll (each waited for its own before, one after another)."""
    import asyncio

    guard = EndpointGuard(f"http://127.0.0.1:{_closed_port()}", patience_s=0, poll_s=5)
    checks = 0
    healthy = guard.healthy

    async def counted() -> bool:
        nonlocal checks
        checks += 1
        return await healthy()

    guard.healthy = counted  # type: ignore[method-assign]
    assert await guard.recover() is False and guard.gone
    checks = 0
    results = await asyncio.gather(*(guard.recover() for _ in range(50)))
    assert results == [False] * 50 and checks == 1


async def test_a_request_cut_by_the_guard_giving_up_as_the_run_stops_is_still_cancelled() -> None:
    """The guard turns its own cut into a retryable failure, never a stop's cancel: the run stopping
    at that moment must not have its request asked again elsewhere."""
    import asyncio

    import pytest

    guard = EndpointGuard(f"http://127.0.0.1:{_closed_port()}", patience_s=0, poll_s=0.01)

    async def unhealthy() -> bool:  # answers without yielding: the give-up lands before the stop's cancel
        return False

    guard.healthy = unhealthy  # type: ignore[method-assign]
    request = asyncio.create_task(guard.serve(asyncio.sleep(3600)))
    await asyncio.sleep(0)
    request.cancel()  # the run stops
    assert await guard.recover() is False  # and the guard gives up meanwhile: it cuts the request too
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_an_endpoint_given_up_on_behind_a_keyed_gateway_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gateway that checks the key on /health too (LiteLLM's proxy) answered the key-less probe
    401 for ever: an endpoint that blipped was never put back in service. SGLang itself, which leaves
    /health open, ignores the key and comes back as before."""
    monkeypatch.setenv("GUARD_TEST_KEY", "sim-key")
    for key_on_health in (True, False):
        sim_config = SimConfig(
            max_total_tokens=4096, context_length=1024, api_key="sim-key", key_on_health=key_on_health
        )
        with simulator_in_thread(sim_config) as sim:
            config = RunConfig.model_validate(
                {
                    "run": {"name": "guard-key"},
                    "endpoints": [{"url": sim.url, "model": "default", "api_key_env": "GUARD_TEST_KEY"}],
                    "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
                }
            )
            pool = EndpointPool(config)
            await pool.open()
            try:
                guard = pool.endpoints[0].guard
                guard.up = False
                guard._give_up()
                await guard.probe()
                assert guard.up and not guard.gone, f"key_on_health={key_on_health}"
            finally:
                await pool.aclose()


async def test_the_guard_counts_an_outage_once_a_wait_and_never_for_a_server_that_serves() -> None:
    """The pump tells a prompt's failures apart by this count: one that moved while the prompt was in
    flight is the server's (down, restarted, given up on), one that did not is the prompt's."""
    import asyncio

    serving = [True]
    guard = EndpointGuard("http://127.0.0.1:1", patience_s=0.05, poll_s=0.01)

    async def healthy() -> bool:
        return serving[0]

    guard.healthy = healthy  # type: ignore[method-assign]
    assert await guard.recover() is True and guard.outages == 0  # a failure on a healthy server

    serving[0] = False
    asyncio.get_running_loop().call_later(0.03, serving.__setitem__, 0, True)  # back after polls
    assert await guard.recover(patience_s=5) is True and guard.outages == 1  # one wait, many checks

    serving[0] = False
    assert await guard.recover() is False and guard.gone and guard.outages == 2  # given up on
    assert await guard.recover() is False and guard.outages == 2  # asked again: the same outage

    engine = FakeEngine()  # restarted once for all its waiters, healthy at the first check after
    restarted = EndpointGuard("http://127.0.0.1:1", engine, poll_s=0.01)  # type: ignore[arg-type]
    restarted.healthy = lambda: asyncio.sleep(0, True)  # type: ignore[method-assign]
    assert await asyncio.gather(*(restarted.recover() for _ in range(5))) == [True] * 5
    assert restarted.restarts == 1 and restarted.outages == 1


async def test_controllers_see_the_endpoint_down_only_once_seen_down_its_lane_closes_at_each_check() -> None:
    """``is_up`` closes the lane while a request's failure is checked; ``serves``, the health its
    controllers read (the adaptive law, a fixed lane's OOM hold), is False only from a failed check or
    a give-up to the next check that passes. A request failing on a server that serves, only busy,
    has its check pass: read as down, then up, it was a restart to them."""
    import asyncio

    serving = [True]
    seen: list[tuple[bool, bool]] = []  # (is_up, serves) as each health check begins
    guard = EndpointGuard("http://127.0.0.1:1", patience_s=0.05, poll_s=0.01)

    async def healthy() -> bool:
        seen.append((guard.is_up(), guard.serves()))
        return serving[0]

    guard.healthy = healthy  # type: ignore[method-assign]
    assert await guard.recover() is True  # a busy server's 503: the lane closed, the endpoint not down
    assert seen == [(False, True)] and guard.is_up() and guard.serves()

    seen.clear()
    serving[0] = False
    asyncio.get_running_loop().call_later(0.03, serving.__setitem__, 0, True)
    assert await guard.recover(patience_s=5) is True  # down from its first failed check to the pass
    assert seen[0] == (False, True) and set(seen[1:]) == {(False, False)} and len(seen) > 2
    assert guard.is_up() and guard.serves()

    serving[0] = False
    assert await guard.recover() is False and guard.gone and not guard.serves()  # given up on
    serving[0] = True
    await guard.probe()
    assert guard.is_up() and guard.serves()
    guard.leave_out()  # out of service from the start: down
    assert not guard.is_up() and not guard.serves()


async def test_requests_on_a_dead_launched_server_are_cut_as_its_restart_begins() -> None:
    """The requests still on a server found dead wait for its restart with the rest, not in their own
    retries: sent to the new process while it started, a prompt that brings the server down killed
    it within its start and the run stopped. The cut request fails as retryable, saying why, while
    the start is still under way."""
    import asyncio
    import threading

    from flows.client.errors import TransientRequestError

    started, go_on = threading.Event(), threading.Event()

    class SlowStart:
        def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[str]:
            if on_start is not None:
                on_start()
            started.set()
            go_on.wait(10)  # a start takes minutes
            return ["restarted"]

    guard = EndpointGuard(f"http://127.0.0.1:{_closed_port()}", SlowStart(), patience_s=5, poll_s=0.01)  # type: ignore[arg-type]
    guard.healthy = lambda: asyncio.sleep(0, go_on.is_set())  # type: ignore[method-assign]
    request = asyncio.create_task(guard.serve(asyncio.sleep(3600)))  # retrying against the dead server
    await asyncio.sleep(0)
    recovering = asyncio.create_task(guard.recover())  # another request failed: the restart begins
    await asyncio.to_thread(started.wait, 10)
    with pytest.raises(TransientRequestError, match="was restarting before it answered"):
        await asyncio.wait_for(request, 5)
    assert not recovering.done()  # cut while the start was under way
    go_on.set()
    assert await recovering is True and guard.restarts == 1 and guard.outages == 1
