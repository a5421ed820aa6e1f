"""What ``datagen preflight`` and ``datagen diagnose`` share: where judgements switch, the exit
codes, and how sizes are worded, so both commands judge and speak the same way. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_launch.memory_math import GIB, gib

# Exit codes shared by both commands (documented in the CLI help).
EXIT_OK, EXIT_FINDINGS, EXIT_NO_INPUT = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where judgements switch; defaults follow SGLang's own checks where it has one."""

    high_usage: float = 0.85  # 95th-percentile token usage at/above this: the pool fills up
    near_cap: float = 0.9  # median running / --max-running-requests at/above this: the cap binds
    short_queue: float = 0.1  # a queue up to max(2, 10% of running) is the healthy "ready" queue
    retraction_share: float = 0.10  # retracted / admitted requests at/above this: retraction-bound
    min_retractions: int = 3
    prefill_saturation: float = 0.9  # median prefill tokens / chunk size at/above this: prefill-bound
    # An empty queue is only evidence of a starved server over a stretch of sending: a few seconds of
    # decode lines (one per 40 decode steps) can be a pause between bursts or the run's last requests.
    min_decode_s: float = 60.0
    min_decode_lines: int = 10
    min_margin_bytes: int = 2 * GIB  # free memory to keep per GPU (activation peaks, CUDA graphs)
    balance: float = 0.9  # SGLang's TP check: refuse when min free < 0.9 x a rank's free
    unattributed_bytes: int = GIB  # memory used with no process listed, worth a mention


# The default for every ``thresholds=`` parameter: one frozen instance, built at import.
DEFAULT_THRESHOLDS = Thresholds()


def size(n_bytes: float) -> str:
    """Human size: MiB below 1 GiB (the seeds' "~200 MiB" margin), else GiB with one decimal."""
    return f"{n_bytes / (1 << 20):,.0f} MiB" if abs(n_bytes) < GIB else f"{gib(n_bytes):.1f} GiB"


def gpu_list(indices: Sequence[int]) -> str:
    """GPU indices as both commands print them: ``0,1,2,3``."""
    return ",".join(str(i) for i in indices)
