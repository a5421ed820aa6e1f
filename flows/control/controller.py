"""One endpoint's controller: reads its signals about once a second, feeds its law, logs the decision.

The law (``adaptive.py``) is pure; this is the I/O around it. The client's own counts (in flight,
completions per second, the outlook of what is in flight) come from the endpoint's limiter
lane; the server's from ``SignalReader``; the KV capacity once from ``/get_server_info``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from flows.client.guard import Endpoint
from flows.control.adaptive import AdaptiveLimit, Decision, Observation
from flows.control.busy import BusyMeter
from flows.control.limiter import Lane, Limiter
from flows.control.signals import ServerSample, SignalReader, with_pool
from flows.control.timeline import Timeline
from flows.control.vram import VramReader, VramSample
from sglang_launch.probe import kv_capacity, kv_page_tokens, server_info

log = logging.getLogger(__name__)

RATE_ALPHA = 0.3
"""Smoothing of completions per second across ticks (one tick is one poll)."""
READ_DEADLINE_S = 10.0
"""A tick's readings (the server's load, free GPU memory) that take longer fail the tick: each
source has its own 2 s timeouts, and SGLang is read twice (``/metrics``, ``/v1/loads``)."""


class EndpointController:
    def __init__(
        self,
        lane: Lane[Endpoint],
        law: AdaptiveLimit,
        limiter: Limiter[Endpoint],
        timeline: Timeline,
        *,
        poll_s: float = 1.0,
        vram: VramReader | None = None,
        read_deadline_s: float = READ_DEADLINE_S,
    ) -> None:
        client = lane.endpoint.client
        self.lane = lane
        self.law = law
        self.limiter = limiter
        self.timeline = timeline
        self.poll_s = poll_s
        self.reader = SignalReader(client.endpoint, client.api_key, ca_bundle=client.ca_bundle)
        self.vram = vram
        self.read_deadline_s = read_deadline_s
        self.capacity: int | None = None
        self.page: int | None = None
        self.last: Decision | None = None
        self.last_sample: ServerSample | None = None
        self.busy = BusyMeter()
        """The server's busy share (SGLang's own counter): for the live views and the report."""
        self._rate = 0.0
        self.failed_ticks = 0
        """Ticks that raised (``_tick_failed``): in the run's summary, since each is a second unsteered."""
        self._failing = False

    @property
    def url(self) -> str:
        return self.reader.url

    async def run(self) -> None:
        client = self.lane.endpoint.client
        info = await asyncio.to_thread(server_info, client.endpoint, client.api_key, client.ca_bundle)
        self.capacity, self.page = kv_capacity(info), kv_page_tokens(info)
        started = time.monotonic()
        last_at, last_completed = started, self.lane.completed
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                sample, memory = await self._read()
                now = time.monotonic()
                if sample is not None and sample.busy_us is not None:
                    self.busy.add(now, sample.busy_us)
                done = self.lane.completed
                rate = (done - last_completed) / max(now - last_at, 1e-6)
                self._rate += RATE_ALPHA * (rate - self._rate)
                last_at, last_completed = now, done
                self.tick(now - started, sample, memory)
            except Exception as error:
                self._tick_failed(error)
            else:
                self._tick_worked()
            # waiters see the new limit, credit and pace now, not at the next release (with nothing
            # in flight there is none: a pace raised from zero woke nobody)
            await self.limiter.notify()

    async def _read(self) -> tuple[ServerSample | None, VramSample | None]:
        """The server's load and the GPUs' free memory, or ``TimeoutError`` after ``read_deadline_s``.

        A reading that never returned (NVML on a GPU fallen off the bus) held the loop: no tick
        failed, and a lane the last decision paced at zero admitted nothing for the rest of the run.
        """
        try:
            async with asyncio.timeout(self.read_deadline_s):
                sample = with_pool(await self.reader.read(), self.capacity, self.page)
                memory = await self.vram.read() if self.vram is not None else None
        except TimeoutError:
            raise TimeoutError(
                f"the server's load or the GPUs' free memory was not read within {self.read_deadline_s:g} s"
            ) from None
        return sample, memory

    def _tick_failed(self, error: Exception) -> None:
        """A tick that raised (a server's answer no reader foresaw, a bug): the lane runs on as a
        fixed limit would, at the last limit with no pace and no token credit, until a tick works.

        Left as the last decision set them, a lane paced at zero (a cohort at the budget) admitted
        nothing ever again: the controller's task had died, and only its next tick would have
        changed the pace. The first failure is a warning with its traceback (for the user to
        report); later spells are logged at INFO.
        """
        self.failed_ticks += 1
        self.lane.pacer.set(None, 1.0, time.monotonic())
        self.lane.set_credit(None)
        self.lane.budget_tokens = None
        if not self._failing:
            self._failing = True
            log.log(
                logging.WARNING if self.failed_ticks == 1 else logging.INFO,
                "%s: the concurrency controller failed (%s: %s); holding the limit at %d without "
                "pacing until it works again",
                self.url,
                type(error).__name__,
                error,
                self.law.limit,
                exc_info=error if self.failed_ticks == 1 else None,
            )

    def _tick_worked(self) -> None:
        if self._failing:
            self._failing = False
            log.info(
                "%s: the concurrency controller works again (%d failed ticks)", self.url, self.failed_ticks
            )

    def tick(self, at: float, sample: ServerSample | None, memory: VramSample | None = None) -> Decision:
        """One decision from what the lane, the server and the GPUs say now."""
        lane = self.lane
        if sample is not None and sample.block_tokens:  # the last known, while the server is unread
            lane.block_tokens = sample.block_tokens
        now = time.monotonic()
        lane.read_server(now, sample)
        outlook = lane.outlook(now)
        observation = Observation(
            at=at,
            server=sample,
            in_flight=lane.in_flight,
            waiting=self.limiter.waiting,
            outlook=outlook,
            completions_per_s=self._rate,
            request_life_s=self.lane.life_s,
            output_spread=self.lane.output_spread,
            healthy=self.lane.endpoint.guard.serves(),
            free_vram_bytes=memory.free_bytes if memory else None,
            total_vram_bytes=memory.total_bytes if memory else None,
        )
        decision = self.law.observe(observation)
        if decision.restarted and self.vram is not None:
            self.vram.relocate()
        self.lane.pacer.set(decision.pace_per_s, decision.pace_burst, time.monotonic())
        self.lane.set_credit(decision.credit, outlook)
        self.lane.budget_tokens = decision.budget_tokens
        self.last, self.last_sample = decision, sample
        self.timeline.add(self.url, decision, sample, outlook)
        if decision.limit != decision.previous:
            log.info("%s: limit %d -> %d (%s)", self.url, decision.previous, decision.limit, decision.reason)
        return decision

    async def aclose(self) -> None:
        """A last reading of the server's busy counter, so the report's share spans the whole run, to
        its last second, then the readers are closed."""
        if self.reader.has_loads is not False:
            loads = await self.reader.loads()
            if loads is not None and loads.busy_us is not None:
                self.busy.add(time.monotonic(), loads.busy_us)
        await self.reader.aclose()
        if self.vram is not None:
            await self.vram.aclose()
