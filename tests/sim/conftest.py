"""Fixtures for the simulator tests: the real server's captured responses, and simulators to query.

Helpers are handed out as fixtures (``captured``) rather than imported, so the test modules do not
depend on which ``conftest`` module Python happens to have cached.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_launch.simulator import SimConfig, ThreadedSimulator, simulator_in_thread

# The configuration the fixtures were captured with (MAIN in their INDEX.md), sped up.
CAPTURE_LIKE: dict[str, Any] = {
    "model_name": "tinyllm",
    "max_total_tokens": 4096,
    "max_running_requests": 16,
    "context_length": 1024,
    "time_scale": 0.01,
    "stream_interval_s": 0.01,
}


class Captured:
    """Exact responses of the real SGLang 0.5.23 (tests/fixtures/sglang-0.5.23), and ways to compare."""

    root = Path(__file__).parent.parent / "fixtures" / "sglang-0.5.23"

    def bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def json(self, name: str) -> Any:
        return json.loads(self.bytes(name))

    def text(self, name: str) -> str:
        return self.bytes(name).decode("utf-8")

    @staticmethod
    def sse_events(raw: bytes) -> list[str]:
        """The ``data:`` payloads of an SSE body, in order."""
        blocks = raw.decode("utf-8").split("\n\n")
        return [block.removeprefix("data: ") for block in blocks if block.startswith("data: ")]

    @staticmethod
    def key_tree(obj: Any) -> Any:
        """A JSON value's structure: dict keys in order, recursively; leaf values erased."""
        if isinstance(obj, dict):
            return [(k, Captured.key_tree(v)) for k, v in obj.items()]
        if isinstance(obj, list):
            return [Captured.key_tree(v) for v in obj]
        return None


@pytest.fixture
def captured() -> Captured:
    return Captured()


StartSim = Callable[..., ThreadedSimulator]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start threaded simulators with ``CAPTURE_LIKE`` plus overrides; all stopped at teardown."""
    with contextlib.ExitStack() as stack:

        def start(**overrides: Any) -> ThreadedSimulator:
            return stack.enter_context(simulator_in_thread(SimConfig(**{**CAPTURE_LIKE, **overrides})))

        yield start


@pytest.fixture
def sim(start_sim: StartSim) -> ThreadedSimulator:
    """A simulator configured like the capture server."""
    return start_sim()
