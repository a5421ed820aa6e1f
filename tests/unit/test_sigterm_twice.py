"""A second SIGTERM while the run flushes after the first lets the flush, report and stop finish."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from flows.cli.main import _stoppable, _Terminated


async def test_a_second_sigterm_during_the_final_flush_does_not_cut_it_short() -> None:
    steps: list[str] = []

    async def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the first: stop the run
            await asyncio.sleep(10)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the second, while flushing
            await asyncio.sleep(0.2)  # the flush, the report, the server's stop
            steps.append("flushed")

    with pytest.raises(_Terminated):
        await _stoppable(run)
    assert steps == ["flushed"]
