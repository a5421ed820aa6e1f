"""One lane per endpoint, each under its law: the limiter and controllers a run uses, from ``[concurrency]``.

Fixed: every lane's limit is the configured number, lowered to ``min_limit`` by its ``OomHold`` while its
GPUs' free memory is under the floor (where it has a reading of it). Adaptive: every lane gets its own
``AdaptiveLimit`` and an ``EndpointController`` that feeds it (free memory included); the categories'
demand model is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flows.client.guard import Endpoint
from flows.config import ConcurrencyConfig, on_this_machine
from flows.control.adaptive import AdaptiveLimit, LawSettings
from flows.control.controller import EndpointController
from flows.control.demand import CategoryDemand, DemandModel
from flows.control.limit import FixedLimit, GuardedLimit, HeldLimit, Limit
from flows.control.limiter import Lane, Limiter
from flows.control.oom_hold import OomHold
from flows.control.timeline import DecisionTally, Timeline
from flows.control.vram import VramReader
from sglang_launch.gpu import GpuUnavailableError, read_memory
from sglang_launch.placement import Placement

TIMELINE_WRITE_S = 30.0


def min_free_vram_bytes(concurrency: ConcurrencyConfig) -> int:
    return int(concurrency.min_free_vram_gib * 2**30)


def law_settings(concurrency: ConcurrencyConfig) -> LawSettings:
    return LawSettings(
        target_kv=concurrency.target_kv_usage,
        min_free_vram_bytes=min_free_vram_bytes(concurrency),
        min_limit=concurrency.min_limit,
        max_limit=concurrency.max_limit,
        initial_limit=min(max(concurrency.initial_limit, concurrency.min_limit), concurrency.max_limit),
        pace_factor=concurrency.pace_factor if concurrency.pace_admissions else None,
    )


@functools.cache
def nvml_works() -> bool:
    try:
        read_memory()
    except GpuUnavailableError:
        return False
    return True


def vram_reader(
    setting: str,
    url: str,
    gpus: frozenset[int] | None = None,
    ca_bundle: str | None = None,
    placement: Callable[[], Placement] | None = None,
) -> VramReader | None:
    """``auto``: NVML for a server on this machine with an NVIDIA GPU, else no OOM guard (quietly).
    It reads ``gpus`` (the endpoint's, where the config names them), else the GPUs of the server
    listening on ``url``'s port, else those of its ``placement`` (``VramReader``: through DCGM for a
    server the run launched only), not the node's. ``gpus`` named ask for a guard: NVML then even
    where it does not work here, so that the reader says there is none. A DCGM exporter is read
    trusting ``ca_bundle`` (the endpoint's) where given."""
    if setting == "off":
        return None
    if setting == "auto":
        local = on_this_machine(url) and (gpus is not None or nvml_works())
        return VramReader("nvml", server_url=url, gpus=gpus, placement=placement) if local else None
    return VramReader(setting, server_url=url, gpus=gpus, ca_bundle=ca_bundle, placement=placement)


class Control:
    """The limiter; for an adaptive run the controllers and timeline, for a fixed one the OOM holds;
    ``run`` is their loop."""

    def __init__(self, endpoints: list[Endpoint], concurrency: ConcurrencyConfig, run_dir: Path) -> None:
        self.concurrency = concurrency
        self.demand = DemandModel() if concurrency.adaptive else None
        self.timeline = Timeline(run_dir)
        laws: list[Limit] = [self._law(concurrency) for _ in endpoints]
        readers = [
            vram_reader(
                concurrency.vram_for(e.vram), e.client.endpoint, e.gpus, e.client.ca_bundle, e.placement
            )
            for e in endpoints
        ]
        self.holds: list[OomHold] = []
        # lanes close while their endpoint is down; one coming back wakes the waiters
        self.limiter = Limiter(
            [
                Lane(e, GuardedLimit(self._held(law, e, vram), e.guard.is_up))
                for e, law, vram in zip(endpoints, laws, readers, strict=True)
            ]
        )
        for endpoint in endpoints:
            endpoint.guard.on_up = self.limiter.notify
        self.controllers = [
            EndpointController(lane, law, self.limiter, self.timeline, poll_s=concurrency.poll_s, vram=vram)
            for lane, law, vram in zip(self.limiter.lanes, laws, readers, strict=True)
            if isinstance(law, AdaptiveLimit)
        ]

    @staticmethod
    def _law(concurrency: ConcurrencyConfig) -> Limit:
        if concurrency.adaptive:
            return AdaptiveLimit(law_settings(concurrency))
        return FixedLimit(concurrency.ceiling)

    def _held(self, law: Limit, endpoint: Endpoint, vram: VramReader | None) -> Limit:
        """A fixed limit under its ``OomHold`` where the endpoint's free GPU memory can be read; an
        adaptive law reads it through its controller."""
        if isinstance(law, AdaptiveLimit) or vram is None:
            return law
        hold = OomHold(
            endpoint.client.endpoint,
            vram,
            min_free_vram_bytes(self.concurrency),
            self.concurrency.min_limit,
            poll_s=self.concurrency.poll_s,
            healthy=endpoint.guard.serves,
        )
        self.holds.append(hold)
        return HeldLimit(law, hold)

    def demand_for(
        self, category: str, max_tokens: int, earlier: Sequence[int] = ()
    ) -> CategoryDemand | None:
        """The category's demand model (an adaptive run's), seeded with the run's ``earlier`` answers."""
        return self.demand.category(category, max_tokens, earlier) if self.demand is not None else None

    async def run(self) -> None:
        """The controllers' and OOM holds' loops, and the timeline written every half minute."""
        if not self.controllers and not self.holds:
            return
        tasks = [asyncio.create_task(c.run()) for c in self.controllers]
        tasks += [asyncio.create_task(hold.run(self.limiter.notify)) for hold in self.holds]
        try:
            while True:
                await asyncio.sleep(TIMELINE_WRITE_S)
                await asyncio.to_thread(self.timeline.write)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def aclose(self) -> None:
        """Write the timeline's last rows; close the signal readers."""
        await asyncio.to_thread(self.timeline.write)
        for controller in self.controllers:
            await controller.aclose()
        for hold in self.holds:
            await hold.aclose()

    def summary(self) -> dict[str, Any]:
        """For the run report: the mode, and per endpoint what the law did and what polling cost."""
        if not self.concurrency.adaptive:
            held = [{"endpoint": h.url, "oom_holds": h.holds, "held_to": h.floor} for h in self.holds]
            return {"mode": "fixed", "limit": self.concurrency.limit, "endpoints": held}
        endpoints = []
        for controller in self.controllers:
            tally = self.timeline.tallies.get(controller.url, DecisionTally())
            reads = controller.reader.reads
            endpoints.append(
                {
                    "endpoint": controller.url,
                    "final_limit": controller.law.limit,
                    "min_limit": tally.min_limit if tally.min_limit is not None else controller.law.limit,
                    "max_limit": tally.max_limit if tally.max_limit is not None else controller.law.limit,
                    "decisions": tally.decisions,
                    "changes": tally.changes,
                    "back_offs": tally.back_offs,
                    "retractions": tally.retractions,
                    "max_queued": tally.max_queued,
                    "signal_reads": reads,
                    "signal_read_ms": round(1000 * controller.reader.read_seconds / max(reads, 1), 2),
                    "server_busy": controller.busy.overall(),
                    "failed_ticks": controller.failed_ticks,
                }
            )
        return {"mode": "adaptive", "endpoints": endpoints}

    def endpoints_view(self) -> list[dict[str, Any]]:
        """Per endpoint, for the live line and the Prefect artifact: limit, in flight, KV usage, queue,
        and the server's busy share where it counts one."""
        view = []
        controllers = {id(c.lane): c for c in self.controllers}
        for lane in self.limiter.lanes:
            controller = controllers.get(id(lane))
            sample = controller.last_sample if controller else None
            view.append(
                {
                    "endpoint": lane.endpoint.client.endpoint,
                    "limit": lane.limit.limit,
                    "in_flight": lane.in_flight,
                    "kv_usage": sample.kv_usage if sample else None,
                    "queued": sample.queued if sample else None,
                    "busy": controller.busy.recent if controller else None,
                    "reason": controller.last.reason if controller and controller.last else None,
                }
            )
        return view
