"""Seeded fault decisions, one draw sequence in arrival order, so failing runs can be replayed."""

from __future__ import annotations

import random

from sglang_launch.simulator.config import FaultConfig


class FaultInjector:
    """Decides, request by request, which ones fail and how.

    Both decisions draw for every request whatever the rates are, so changing one rate at run
    time does not shift which later requests the other fault hits.
    """

    def __init__(self, faults: FaultConfig, seed: int) -> None:
        self.faults = faults
        self._rng = random.Random(f"faults:{seed}")
        # Faults added later draw from their own sequence, so the 503s and cuts of a seed stay put.
        self._later = random.Random(f"faults-later:{seed}")

    def reject_with_503(self) -> bool:
        """Whether this arriving request is answered 503 "The request queue is full."."""
        return self._rng.random() < self.faults.error_503_rate

    def cut_point(self, output_tokens: int) -> int | None:
        """After how many tokens this stream is cut, or None to let it finish.

        The cut falls strictly inside the answer (at least one token sent, the last one not).
        """
        draw, position = self._rng.random(), self._rng.randint(1, max(1, output_tokens - 1))
        if output_tokens < 2 or draw >= self.faults.cut_stream_rate:
            return None
        return position

    def fail_with_500(self) -> bool:
        """Whether this arriving request is answered 500 with a body that is not JSON."""
        return self._later.random() < self.faults.error_500_rate

    def stall_point(self, output_tokens: int) -> int | None:
        """After how many tokens this stream goes silent for ``stall_s`` (0: before the first), or None."""
        draw, position = self._later.random(), self._later.randint(0, max(0, output_tokens - 1))
        return position if draw < self.faults.stall_stream_rate else None
