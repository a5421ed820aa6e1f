"""What `datagen run`'s terminal shows of the run's warnings: the ones a person should act on or know
are one ``warning:`` line each, as the CLI's other warnings; diagnostics stay structured log lines.

A structured log line (``... level=WARNING logger=flows.client.guard msg=...``) is written straight to
the terminal past the progress bar, whose redraws bury it, and reads like noise among the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.cli.console import setup_logging
from flows.client.guard import EndpointGuard
from flows.control.signals import SignalReader
from flows.control.vram import VramReader
from flows.orchestration.link import PrefectLink
from flows.say import SAY
from flows.store.run_store import RunStore

URL = "http://server:30000"
KEY = "sk-not-to-be-shown"


@contextlib.contextmanager
def cli_logging(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[str]]]:
    """The CLI's logging, as `datagen run` sets it up before anything is logged; the lines written to
    stderr since the last call. pytest's own handlers step aside meanwhile (with a handler on the
    root logger ``logging.basicConfig`` does nothing) and are back after, as is the environment."""
    root = logging.getLogger()
    handlers, level, environ = root.handlers[:], root.level, dict(os.environ)
    root.handlers.clear()
    try:
        setup_logging(verbose=False)
        capsys.readouterr()
        yield lambda: capsys.readouterr().err.splitlines()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        os.environ.clear()
        os.environ.update(environ)


def _answers(healthy: bool) -> Callable[[], Any]:
    async def answer() -> bool:
        return healthy

    return answer


async def test_a_server_that_answers_again_is_a_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        guard = EndpointGuard(URL, api_key=KEY)
        guard.healthy = _answers(True)  # type: ignore[method-assign]
        guard.leave_out()  # it had stopped answering
        await guard.probe()
        assert terminal() == [f"warning: {URL} answers again"]


async def test_a_request_failing_on_an_endpoint_that_serves_says_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request whose retries ran out on a busy server asks the guard, whose check passes at once:
    the endpoint was never seen down, so "answers again" was news of an outage nobody heard of."""
    with cli_logging(capsys) as terminal:
        guard = EndpointGuard(URL, api_key=KEY)
        guard.healthy = _answers(True)  # type: ignore[method-assign]
        assert await guard.recover()
        assert guard.up and guard.outages == 0
        assert terminal() == []


class _Restarts:
    """A launched server that died: the guard starts it again, in one attempt."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[object]:
        if on_start is not None:
            on_start()
        if self.fails:
            raise RuntimeError("the GPU is still held by the dead server")
        return [object()]


async def test_a_restarted_server_is_a_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        guard = EndpointGuard(URL, _Restarts(), api_key=KEY, poll_s=0)  # type: ignore[arg-type]
        guard.healthy = _answers(True)  # type: ignore[method-assign]
        assert await guard.recover()
        assert terminal() == [
            f"warning: server at {URL} restarted (1 attempt(s))",
            f"warning: {URL} answers again",
        ]


async def test_a_server_given_up_on_is_a_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The run goes on (other endpoints, or the prompts stay for the next start): the person is told."""
    with cli_logging(capsys) as terminal:
        failed = EndpointGuard(URL, _Restarts(fails=True), api_key=KEY)  # type: ignore[arg-type]
        assert not await failed.recover()
        silent = EndpointGuard(URL, api_key=KEY, patience_s=0, poll_s=0)
        silent.healthy = _answers(False)  # type: ignore[method-assign]
        assert not await silent.recover()
        assert terminal() == [
            f"warning: restarting the server at {URL} failed: the GPU is still held by the dead server",
            f"warning: {URL} has not been healthy for 0 s: giving up on it",
        ]


async def test_a_server_that_stops_answering_is_a_warning_line_once_when_the_wait_begins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, "answers again" (or "giving up") was the first a person heard of an outage: minutes of
    an endpoint doing nothing with no line on the terminal."""
    with cli_logging(capsys) as terminal:
        answers = iter([False, False, False, True])
        guard = EndpointGuard(URL, api_key=KEY, patience_s=60, poll_s=0)

        async def healthy() -> bool:
            return next(answers)

        guard.healthy = healthy  # type: ignore[method-assign]
        assert await guard.recover()
        assert terminal() == [
            f"warning: {URL} does not answer its health check: its requests wait up to 60 s for it",
            f"warning: {URL} answers again",
        ]


def _reader(answer: Callable[[httpx.Request], httpx.Response]) -> SignalReader:
    reader = SignalReader(URL, api_key=KEY)
    reader._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return reader


async def test_a_server_without_metrics_is_one_warning_line_that_says_how_to_enable_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cli_logging(capsys) as terminal:
        reader = _reader(lambda request: httpx.Response(404))
        try:
            assert await reader.read() is None and await reader.read() is None
        finally:
            await reader.aclose()
        [line] = terminal()
        assert (
            line.startswith(f"warning: {URL} serves neither /metrics nor /v1/loads")
            and "--enable-metrics" in line
        )


async def test_a_server_whose_metrics_stop_is_one_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        down = False

        def answer(request: httpx.Request) -> httpx.Response:
            if down:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(200, json={"loads": [{"num_running_reqs": 1}]})

        reader = _reader(answer)
        try:
            await reader.read()
            down = True
            assert await reader.read() is None and await reader.read() is None
        finally:
            await reader.aclose()
        [line] = terminal()
        assert line.startswith(f"warning: {URL} stopped answering /metrics and /v1/loads (a restart?)")


async def test_no_oom_guard_is_one_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        exporter = "http://node-b:9400/metrics"
        reader = VramReader(exporter, server_url=URL)
        assert reader._http is not None
        await reader._http.aclose()
        reader._http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
        try:
            assert await reader.read() is None and await reader.read() is None
        finally:
            await reader.aclose()
        [line] = terminal()
        assert line.startswith(
            f"warning: free GPU memory cannot be read from {exporter} ("
        ) and line.endswith("no OOM guard")


async def test_a_named_gpu_without_a_series_is_one_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        exporter = "http://node-b:9400/metrics"
        series = 'DCGM_FI_DEV_FB_FREE{gpu="0"} 1200\nDCGM_FI_DEV_FB_USED{gpu="0"} 100\n'
        reader = VramReader(exporter, server_url=URL, gpus=frozenset({7}))
        assert reader._http is not None
        await reader._http.aclose()
        reader._http = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, text=series))
        )
        try:
            assert await reader.read() is None and await reader.read() is None
        finally:
            await reader.aclose()
        [line] = terminal()
        assert line.startswith(f"warning: {exporter} has no DCGM_FI_DEV_FB_FREE series for GPU 7")


def test_the_prefect_api_going_away_is_a_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    with cli_logging(capsys) as terminal:
        PrefectLink("http://127.0.0.1:4200/api").lost("no answer to /health")
        [line] = terminal()
        assert line.startswith("warning: the Prefect API (http://127.0.0.1:4200/api) is not answering")


def test_an_unreadable_shard_moved_aside_is_a_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its prompts are asked again: a person resuming a run should know why a finished one is redone."""
    store = RunStore(tmp_path / "run")
    shard = Path(store.data_dir("c")) / "part-0000000000001-1-00001.parquet"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"not parquet")
    with cli_logging(capsys) as terminal:
        store.category_state("c")
        [line] = terminal()
    assert line.startswith(
        f"warning: unreadable shard {shard} moved to {tmp_path / 'run' / 'quarantine' / 'c'} ("
    )
    assert line.endswith("): a start asks its prompts again")


def test_a_diagnostic_stays_one_log_line_and_text_is_shown_as_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A traceback for a bug report is no `warning:` line; a message's brackets and % are its own."""
    with cli_logging(capsys) as terminal:
        logging.getLogger("flows.control.controller").warning("%s: [bold]50%% failed[/]", URL)
        [line] = terminal()
        assert line.endswith(f"level=WARNING logger=flows.control.controller msg={URL}: [bold]50% failed[/]")


def test_a_warning_line_shows_its_text_as_it_is_emoji_codes_included(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A prompt id from a dataset (``gsm8k:100:7``) is named in a warning: rich read ``:100:`` as an
    emoji code and printed ``gsm8k💯7``, an id found in no table."""
    with cli_logging(capsys) as terminal:
        logging.getLogger("flows.run.pump").warning(
            "category math: prompt %s was in flight at 3 server outages [x] :warning:",
            "gsm8k:100:7",
            extra=SAY,
        )
        assert terminal() == [
            "warning: category math: prompt gsm8k:100:7 was in flight at 3 server outages [x] :warning:"
        ]
