"""One lane per endpoint, each under its law: the limiter a run uses, built from ``[concurrency]``."""

from __future__ import annotations

from flows.client.guard import Endpoint
from flows.config import ConcurrencyConfig
from flows.control.limit import FixedLimit, GuardedLimit
from flows.control.limiter import Lane, Limiter


def build_limiter(endpoints: list[Endpoint], concurrency: ConcurrencyConfig) -> Limiter[Endpoint]:
    """Lanes whose limit drops to 0 while their endpoint is down; a lane coming back wakes the waiters."""
    lanes = [Lane(e, GuardedLimit(FixedLimit(concurrency.limit), e.guard.is_up)) for e in endpoints]
    limiter = Limiter(lanes)
    for endpoint in endpoints:
        endpoint.guard.on_up = limiter.notify
    return limiter
