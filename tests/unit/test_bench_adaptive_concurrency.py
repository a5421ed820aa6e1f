"""The adaptive-concurrency bench's reading of the server's counters over a run."""

from __future__ import annotations

from dataclasses import replace

from bench.adaptive_concurrency import counted
from flows.control.signals import ServerSample


def test_a_counter_is_counted_over_the_run_and_missing_where_the_server_has_none() -> None:
    before = ServerSample(source="sglang-loads", decode_steps=1_000.0, busy_us=5e6)
    after = replace(before, decode_steps=7_120.0, busy_us=95e6)
    assert counted(before, after, "decode_steps") == 6_120.0
    assert counted(before, after, "busy_us") == 90e6
    assert counted(None, after, "decode_steps") is None  # vLLM: no /v1/loads
    assert counted(before, replace(after, decode_steps=None), "decode_steps") is None  # SGLang < 0.5.2x
