"""An SGLang-0.5.23-compatible server that simulates the scheduler and KV cache without a GPU.

It answers the OpenAI chat API, ``/metrics``, ``/v1/loads`` and the info routes with the real
server's shapes, and schedules like SGLang (admission by reserved KV, retraction when the pool
runs out, stale gauges), so clients and the concurrency controller can be tested on it.
Entry points: ``serve(cfg)``, ``SimulatorProcess`` and ``simulator_in_thread``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sglang_launch.simulator.config import FaultConfig, SimConfig
from sglang_launch.simulator.server import create_app, serve

if TYPE_CHECKING:
    from sglang_launch.simulator.process import (
        SimulatorError,
        SimulatorProcess,
        ThreadedSimulator,
        simulator_in_thread,
    )

_PROCESS_NAMES = frozenset({"SimulatorError", "SimulatorProcess", "ThreadedSimulator", "simulator_in_thread"})


def __getattr__(name: str) -> Any:
    """Import the process helpers (and httpx) on first use: the served child never needs them."""
    if name in _PROCESS_NAMES:
        return getattr(importlib.import_module("sglang_launch.simulator.process"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FaultConfig",
    "SimConfig",
    "SimulatorError",
    "SimulatorProcess",
    "ThreadedSimulator",
    "create_app",
    "serve",
    "simulator_in_thread",
]
