"""Keeping a week-long run alive through server deaths: wait for the server, or restart it.

A request whose retries are exhausted while the server is down should not become a reject: the
prompt is fine, the server is not. The guard answers "is the endpoint serving again?" once for all
the requests that noticed (single flight), restarting the server when this run launched it, and
gives up only after ``patience_s`` of continuous outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx

from flows.client import EndpointClient
from sglang_launch.engine import Engine

log = logging.getLogger(__name__)


class EndpointGuard:
    """Health of one endpoint, and the way back to healthy."""

    def __init__(
        self,
        url: str,
        engine: Engine | None = None,
        *,
        patience_s: float = 1800.0,
        poll_s: float = 2.0,
        fresh_s: float = 1.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.engine = engine
        self.patience_s = patience_s
        self.poll_s = poll_s
        self.fresh_s = fresh_s
        self.recoveries = 0
        self.restarts = 0
        self._last_ok = 0.0
        self._lock = asyncio.Lock()

    async def healthy(self) -> bool:
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                return (await client.get(f"{self.url}/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def recover(self) -> bool:
        """True once the endpoint serves again; False after ``patience_s`` without it."""
        async with self._lock:
            if time.monotonic() - self._last_ok < self.fresh_s:
                return True
            deadline = time.monotonic() + self.patience_s
            while True:
                if self.engine is not None:
                    try:
                        attempts = await asyncio.to_thread(self.engine.ensure_running)
                    except Exception as error:  # a start that failed for good: say so, keep the rows
                        log.error("restarting the server at %s failed: %s", self.url, error)
                        return False
                    if attempts:
                        self.restarts += 1
                        log.warning("server at %s restarted (%d attempt(s))", self.url, len(attempts))
                if await self.healthy():
                    self._last_ok = time.monotonic()
                    self.recoveries += 1
                    return True
                if time.monotonic() >= deadline:
                    log.error(
                        "%s has not been healthy for %.0f s: giving up on it", self.url, self.patience_s
                    )
                    return False
                await asyncio.sleep(self.poll_s)


@dataclass(frozen=True)
class Endpoint:
    """What a limiter lane holds: the client to send with and the guard to recover with."""

    client: EndpointClient
    guard: EndpointGuard
