"""Free GPU memory: the controller's out-of-memory guard and restart detector (not its KV signal).

SGLang preallocates its KV pool, so free memory says nothing about KV use; it says whether something
else is eating the headroom SGLang's activations need (then fewer requests in flight), and a jump up
means the server let go of its pool (it died or restarts). Read through NVML for GPUs on this
machine, or from a DCGM exporter's ``DCGM_FI_DEV_FB_FREE`` for a remote server. The tightest GPU
counts: one GPU out of memory stops a tensor-parallel server.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sglang_launch.gpu import GpuUnavailableError, read_memory

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass(frozen=True)
class VramSample:
    """The GPU with the least free memory: its free and total bytes."""

    free_bytes: int
    total_bytes: int


def tightest(readings: list[tuple[int, int]]) -> VramSample | None:
    """(free, total) per GPU -> the one with the least free memory."""
    if not readings:
        return None
    free, total = min(readings)
    return VramSample(free, total)


def parse_dcgm(text: str) -> VramSample | None:
    """A DCGM exporter's metrics (framebuffer sizes in MiB, one series per ``gpu`` label).

    A value that is no size (NaN, ±Inf, below zero) leaves its series out: an infinite one raised at
    every tick, a negative one read as the tightest GPU."""
    free: dict[str, float] = {}
    used: dict[str, float] = {}
    reserved: dict[str, float] = {}
    wanted = {"DCGM_FI_DEV_FB_FREE": free, "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_RESERVED": reserved}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value) and sample.value >= 0:
                wanted[sample.name][sample.labels.get("gpu", "0")] = sample.value
    totals = {gpu: f + used.get(gpu, 0.0) + reserved.get(gpu, 0.0) for gpu, f in free.items()}
    readings = [(int(f * MIB), int(totals[gpu] * MIB)) for gpu, f in free.items()]
    return tightest(readings)


class VramReader:
    """``nvml`` (GPUs on this machine) or a DCGM exporter URL; a source that fails warns once, reads None."""

    def __init__(self, source: str, *, timeout_s: float = 2.0) -> None:
        self.source = source
        self._http = httpx.AsyncClient(timeout=timeout_s) if source != "nvml" else None
        self._warned = False
        self._nvml: asyncio.Future[list[tuple[int, int]]] | None = None
        """The NVML reading under way: one at a time (see ``_read_nvml``)."""

    async def read(self) -> VramSample | None:
        try:
            if self._http is None:
                return tightest(await self._read_nvml())
            response = await self._http.get(self.source)
            response.raise_for_status()
            return parse_dcgm(response.text)
        except (GpuUnavailableError, httpx.HTTPError, ValueError) as error:
            if not self._warned:
                self._warned = True
                log.warning("free GPU memory cannot be read from %s (%s): no OOM guard", self.source, error)
            return None

    async def _read_nvml(self) -> list[tuple[int, int]]:
        """NVML's reading in a worker thread, never two at once. A call that hangs cannot be
        cancelled (its thread stays blocked): started again at every tick the controller gave up
        waiting, the hung calls would take every thread of the loop's executor, shard writes
        included. So a caller that gave up leaves the reading under way, and the next one waits
        for that same reading."""
        if self._nvml is None or self._nvml.done():
            self._nvml = asyncio.ensure_future(asyncio.to_thread(read_memory))
        return await asyncio.shield(self._nvml)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
