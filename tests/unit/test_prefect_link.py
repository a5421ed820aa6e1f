"""Prefect as a window, never a dependency: a slow first start, a down or vanished API."""

from __future__ import annotations

import asyncio
import socket

import pytest

from flows.orchestration import link as prefect_link
from flows.orchestration.link import (
    STARTUP_TIMEOUT_ENV,
    PrefectLink,
    PrefectUnavailable,
    api_answers,
    orchestrated,
    prefect_env_defaults,
    start_ephemeral,
    track,
)
from flows.orchestration.temporary_server import server_log
from flows.orchestration.zombies import HEARTBEAT_ENV


class FakeServer:
    """Prefect's SubprocessASGIServer surface: fails its first ``failures`` starts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.starts = 0
        self.stops = 0
        self.port: int | None = 8123

    def start(self, timeout: int | None = None) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise RuntimeError(
                "Timed out while attempting to connect to ephemeral Prefect API server. "
                "stdout: lots of migration output stderr: more"
            )

    def stop(self) -> None:
        self.stops += 1


def test_a_failed_first_start_is_retried_on_a_new_server() -> None:
    servers: list[FakeServer] = []

    def new_server() -> FakeServer:
        servers.append(FakeServer(failures=1 if not servers else 0))
        return servers[-1]

    start_ephemeral(new_server)
    assert [(s.starts, s.stops) for s in servers] == [(1, 1), (1, 0)]


def test_the_retried_server_is_the_one_prefects_client_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect keeps one server per port and its stop forgets the one stopped: the retry started that
    forgotten one, and the run's link (``SubprocessASGIServer()``) was a new, never started one."""
    from prefect.server.api.server import SubprocessASGIServer

    from flows.orchestration.temporary_server import TemporaryServer

    started: list[object] = []

    def start(self: TemporaryServer, timeout: int | None = None) -> None:
        if not started:
            started.append(None)
            raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")
        self.port, self.running = 8123, True
        started.append(self)

    monkeypatch.setattr(TemporaryServer, "start", start)
    monkeypatch.setattr(TemporaryServer, "stop", SubprocessASGIServer.stop)
    monkeypatch.setattr(SubprocessASGIServer, "_instances", {})
    start_ephemeral()
    assert SubprocessASGIServer() is started[-1] and SubprocessASGIServer().api_url.endswith(":8123/api")


def test_a_server_that_never_starts_is_one_line_saying_how_to_run_without() -> None:
    server = FakeServer(failures=5)
    with pytest.raises(PrefectUnavailable) as caught:
        start_ephemeral(lambda: server)
    message = str(caught.value)
    assert server.starts == 2 and server.stops == 2
    assert "Timed out while attempting to connect" in message
    assert "--no-prefect" in message and "PREFECT_API_URL" in message and STARTUP_TIMEOUT_ENV in message
    assert "migration output" not in message and "\n" not in message
    assert f"its output: {server_log()}" in message  # what the server said is there, not on the terminal


def test_the_startup_timeout_and_heartbeat_are_set_unless_the_user_chose_them() -> None:
    env: dict[str, str] = {}
    prefect_env_defaults(env)
    assert int(env[STARTUP_TIMEOUT_ENV]) > 20  # Prefect's own default
    assert env[HEARTBEAT_ENV] == "30"  # a dead run found in 90 s (Prefect's default beat is 180 s)
    mine = {STARTUP_TIMEOUT_ENV: "7", HEARTBEAT_ENV: "60"}
    prefect_env_defaults(mine)
    assert mine == {STARTUP_TIMEOUT_ENV: "7", HEARTBEAT_ENV: "60"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_closed_port_does_not_answer() -> None:
    assert not await api_answers(f"http://127.0.0.1:{_closed_port()}/api")


class Said(list[str]):
    def __call__(self, text: str) -> None:
        self.append(text)


def _link() -> tuple[PrefectLink, Said]:
    said = Said()
    return PrefectLink("http://127.0.0.1:1/api", say=said), said


class Calls:
    def __init__(self) -> None:
        self.body = 0
        self.plain = 0

    async def work(self) -> None:
        self.body += 1

    async def without(self) -> None:
        self.plain += 1


async def test_prefect_failing_before_the_body_runs_it_without_prefect_and_says_so_once() -> None:
    link, said = _link()
    calls = Calls()

    async def broken(unit: str) -> None:
        raise ConnectionError("All connection attempts failed")

    await orchestrated(link, broken, calls.without)
    await orchestrated(link, broken, calls.without)  # the link is down now: Prefect is not tried
    assert (calls.body, calls.plain) == (0, 2)
    assert link.down and len(said) == 1 and "not being updated" in said[0]


async def test_prefect_failing_after_the_body_finished_does_not_run_it_again() -> None:
    link, said = _link()
    calls = Calls()

    async def fails_at_the_end(unit: str) -> None:
        await track(unit, calls.work())
        raise ConnectionError("cannot set the final state")

    await orchestrated(link, fails_at_the_end, calls.without)
    assert (calls.body, calls.plain) == (1, 0)
    assert len(said) == 1


async def test_the_bodys_own_error_is_raised_as_is_and_prefect_is_not_blamed() -> None:
    link, said = _link()
    calls = Calls()

    async def body_fails() -> None:
        raise KeyError("the body's own problem")

    async def reraises_something_else(unit: str) -> None:
        try:
            await track(unit, body_fails())
        except KeyError:
            raise ConnectionError("and then the API failed too") from None

    with pytest.raises(KeyError, match="the body's own problem"):
        await orchestrated(link, reraises_something_else, calls.without)
    assert calls.plain == 0 and said == [] and not link.down


async def test_once_the_body_is_done_a_hanging_prefect_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefect_link, "FINISH_GRACE_S", 0.0)
    link, _ = _link()
    calls = Calls()
    recorded = asyncio.Event()

    async def hangs_after(unit: str) -> None:
        await track(unit, calls.work())
        link.lost("no answer to /health")
        try:
            await asyncio.Event().wait()  # Prefect's client retrying a dead API
        except asyncio.CancelledError:
            recorded.set()
            await asyncio.Event().wait()  # ... and its crash handler retrying again

    await asyncio.wait_for(orchestrated(link, hangs_after, calls.without), timeout=30)
    assert recorded.is_set() and (calls.body, calls.plain) == (1, 0)


async def test_the_watcher_says_once_when_the_api_goes_and_notices_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefect_link, "WATCH_EVERY_S", 0.0)
    link, said = _link()
    answers = iter([True, False, False, False, False, True])
    seen: list[bool] = []

    async def probe(url: str) -> bool:
        try:
            answer = next(answers)
        except StopIteration:
            raise asyncio.CancelledError from None
        seen.append(link.down)
        return answer

    with pytest.raises(asyncio.CancelledError):
        await link.watch(probe)
    assert seen == [False, False, False, True, True, True]  # down after two misses in a row
    assert len(said) == 1 and not link.down  # said once; back up at the last probe
