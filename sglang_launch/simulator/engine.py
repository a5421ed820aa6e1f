"""Runs the pure scheduler in real time and hands its tokens to the HTTP handlers.

One asyncio task owns the scheduler. It runs steps back to back until their simulated time
(x ``time_scale``) is ``stream_interval_s`` ahead of the wall clock, sleeps until the wall clock
catches up, then wakes the handlers whose requests moved: each wakeup carries all the tokens
since the last one, so CPU cost grows with wakeups, not with tokens. Idle, it waits on an event
(no polling). Restart, faults, request bookkeeping and the counters behind ``/metrics`` and
``/sim/stats`` live here too: they are the server's state, and a restart wipes them together.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from sglang_launch.simulator.answers import AnswerPlan, AnswerSettings, plan_answer
from sglang_launch.simulator.config import FaultConfig, SimConfig
from sglang_launch.simulator.faults import FaultInjector
from sglang_launch.simulator.metrics import GaugeBoard, HttpCounts, MetricsView, RequestTotals
from sglang_launch.simulator.protocol import SizedRequest
from sglang_launch.simulator.scheduler import (
    QueueFullError,
    Scheduler,
    SchedulerParams,
    SimRequest,
    StepKind,
    StepResult,
)

logger = logging.getLogger("sglang_launch.simulator")


class Outcome(Enum):
    """How a request ended, as its HTTP handler must render it."""

    FINISHED = "finished"
    CUT = "cut"  # fault injection: the stream is cut mid-answer
    DROPPED = "dropped"  # the server restarted under it
    QUEUE_FULL = "queue_full"  # retracted, then refused by a full queue


@dataclass(eq=False)
class Ticket:
    """The handler's view of one queued request: tokens released so far, and how it ended."""

    rid: str
    plan: AnswerPlan
    prompt_tokens: int
    streaming: bool
    cut_at: int | None = None
    stall_at: int | None = None
    released: int = 0
    outcome: Outcome | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class EngineStats:
    """Request-level counters for ``/sim/stats`` (the scheduler keeps the step-level ones)."""

    requests_received: int = 0
    requests_completed: int = 0
    rejected_queue_full: int = 0
    injected_503: int = 0
    injected_500: int = 0
    streams_cut: int = 0
    streams_stalled: int = 0
    client_aborts: int = 0


class Engine:
    """The simulated server's state and its scheduling loop (``run``)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.settings = AnswerSettings.from_config(cfg)
        self.faults = FaultInjector(cfg.faults, cfg.seed)
        self.restarts = 0
        self._wake = asyncio.Event()
        self._status = "starting"
        self._unavailable_until = time.monotonic() + cfg.startup_delay_s
        self._reset()

    def _reset(self) -> None:
        params = SchedulerParams.from_config(self.cfg)
        self.scheduler = Scheduler(params)
        self.gauges = GaugeBoard(
            self.cfg.metrics_decode_interval, self.cfg.time_scale, params.init_new_token_ratio
        )
        self.stats = EngineStats()
        self.totals = {False: RequestTotals(), True: RequestTotals()}
        self.http = HttpCounts()
        self.tickets: dict[str, Ticket] = {}
        self._dirty: set[Ticket] = set()

    # ----- availability and admin --------------------------------------------------------

    def unavailable_reason(self) -> str | None:
        """ "starting" or "restarting" while the server must answer 503, else None."""
        return self._status if time.monotonic() < self._unavailable_until else None

    def set_answers(self, update: dict[str, Any]) -> AnswerSettings:
        """Change the model's behaviour at run time (e.g. longer answers mid-run); unknown keys raise."""
        knobs = set(AnswerSettings.__dataclass_fields__) - {"seed"}
        unknown = set(update) - knobs
        if unknown:
            raise ValueError(f"not an answer knob: {sorted(unknown)}")
        self.cfg = SimConfig.model_validate({**self.cfg.model_dump(), **update})
        self.settings = AnswerSettings.from_config(self.cfg)
        return self.settings

    def set_faults(self, faults: FaultConfig) -> None:
        """Swap the fault knobs at run time; the seeded draw sequence carries on."""
        self.cfg = self.cfg.model_copy(update={"faults": faults})
        self.faults.faults = faults

    def restart(self, downtime_s: float) -> None:
        """Drop every request (their handlers cut the connections) and wipe all state and counters."""
        for ticket in self.tickets.values():
            ticket.outcome = Outcome.DROPPED
            ticket.changed.set()
        dropped = len(self.tickets)
        self.restarts += 1
        self._reset()
        self._status = "restarting"
        self._unavailable_until = time.monotonic() + downtime_s
        self._wake.set()
        logger.warning("Simulated restart: dropped %d requests, down for %.1f s", dropped, downtime_s)

    # ----- requests ----------------------------------------------------------------------

    def submit(self, sized: SizedRequest, streaming: bool) -> Ticket:
        """Plan the answer and queue the request; ``QueueFullError`` if it must be refused."""
        self.stats.requests_received += 1
        plan = plan_answer(sized.answer_request(), self.settings)
        injected = self.faults.reject_with_503()
        cut_at = self.faults.cut_point(plan.output_tokens)
        if injected:
            self.stats.injected_503 += 1
            raise QueueFullError("injected")
        rid = uuid.uuid4().hex
        try:
            self.scheduler.submit(
                SimRequest(rid, sized.prompt_tokens, sized.max_new_tokens, plan.output_tokens)
            )
        except QueueFullError:
            self.stats.rejected_queue_full += 1
            raise
        stall_at = self.faults.stall_point(plan.output_tokens) if streaming else None
        ticket = Ticket(rid, plan, sized.prompt_tokens, streaming, cut_at if streaming else None, stall_at)
        self.tickets[rid] = ticket
        self._wake.set()
        return ticket

    def inject_500(self) -> bool:
        """Whether this arriving request gets an HTTP 500 with a plain-text body (counted)."""
        if not self.faults.fail_with_500():
            return False
        self.stats.injected_500 += 1
        return True

    def forget(self, ticket: Ticket) -> None:
        """The handler is done with ``ticket``; a request still in flight is aborted (client gone)."""
        if self.tickets.pop(ticket.rid, None) is not None and ticket.outcome is None:
            self.scheduler.abort(ticket.rid)
            self.stats.client_aborts += 1

    # ----- views -------------------------------------------------------------------------

    def metrics_view(self) -> MetricsView:
        """What ``/metrics`` renders."""
        return MetricsView(
            model_name=self.cfg.model_name,
            max_total_tokens=self.cfg.max_total_tokens,
            context_length=self.cfg.context_length,
            gauges=self.gauges.gauges,
            scheduler=self.scheduler,
            totals=self.totals,
            http=self.http,
        )

    def stats_body(self) -> dict[str, Any]:
        """``/sim/stats``: request and scheduler counters plus the live state."""
        sched = self.scheduler
        return {
            **asdict(self.stats),
            **asdict(sched.counters),
            "restarts": self.restarts,
            "running": len(sched.running),
            "queued": len(sched.waiting),
            "used_tokens": sched.used_tokens,
            "token_usage": sched.token_usage,
            "new_token_ratio": sched.new_token_ratio,
            "simulated_seconds": sched.clock_s,
            "faults": self.cfg.faults.model_dump(),
        }

    # ----- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Schedule forever; cancel the task to stop."""
        loop = asyncio.get_running_loop()
        interval, scale = self.cfg.stream_interval_s, self.cfg.time_scale
        if self._unavailable_until > time.monotonic():
            await asyncio.sleep(self._unavailable_until - time.monotonic())
        self._log_ready()
        deadline = loop.time()
        while True:
            result = self.scheduler.step()
            if result is None:  # idle: publish once, then sleep until a request arrives
                self._flush()
                self.gauges.publish(self.scheduler, with_throughput=False)
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            self._apply(result)
            deadline += result.duration_s * scale
            now = loop.time()
            if deadline - now >= interval:
                await asyncio.sleep(deadline - now)
                self._flush()
            elif now - deadline >= interval:
                deadline = now - interval  # running behind: deliver, yield, and do not bank the debt
                self._flush()
                await asyncio.sleep(0)

    def _apply(self, result: StepResult) -> None:
        """Release the step's tokens to the tickets and record what ended."""
        for rid in result.advanced:
            ticket = self.tickets.get(rid)
            if ticket is None:
                continue
            ticket.released += 1
            self._dirty.add(ticket)
            if ticket.cut_at is not None and ticket.released >= ticket.cut_at:
                ticket.outcome = Outcome.CUT
                self.scheduler.abort(rid)
                self.stats.streams_cut += 1
        for rid in result.finished:
            self._end(rid, Outcome.FINISHED)
        for rid in result.rejected:
            self._end(rid, Outcome.QUEUE_FULL)
        if self.gauges.observe(result, self.scheduler):
            self._log_batch(result)
        if result.retraction is not None:
            r = result.retraction
            logger.warning(
                "KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_tokens_gained: %d, "
                "#new_token_ratio: %.4f -> %.4f",
                len(r.rids),
                r.tokens_freed,
                r.ratio_before,
                r.ratio_after,
            )

    def _end(self, rid: str, outcome: Outcome) -> None:
        ticket = self.tickets.get(rid)
        if ticket is None or ticket.outcome is not None:
            return
        ticket.outcome = outcome
        self._dirty.add(ticket)
        if outcome is Outcome.FINISHED:
            self.stats.requests_completed += 1
            totals = self.totals[ticket.streaming]
            totals.requests += 1
            totals.prompt_tokens += ticket.prompt_tokens
            totals.generation_tokens += ticket.plan.output_tokens
        else:
            self.stats.rejected_queue_full += 1

    def _flush(self) -> None:
        """Wake the handlers whose requests moved since the last flush."""
        for ticket in self._dirty:
            ticket.changed.set()
        self._dirty.clear()

    def _log_ready(self) -> None:
        self._status = "ready"
        logger.info(
            "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, "
            "max_running_requests=%d, context_len=%d",
            self.cfg.max_total_tokens,
            self.cfg.max_prefill_tokens,
            self.cfg.max_prefill_tokens,
            self.cfg.max_running_requests,
            self.cfg.context_length,
        )
        logger.info("The server is fired up and ready to roll!")

    def _log_batch(self, result: StepResult) -> None:
        """SGLang's batch log lines, emitted when the gauges refresh (as SGLang does)."""
        g = self.gauges.gauges
        if result.kind is StepKind.PREFILL:
            logger.info(
                "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: %.2f, "
                "#running-req: %d, #queue-req: %d",
                len(result.admitted),
                result.input_tokens,
                g.token_usage,
                g.num_running_reqs - len(result.admitted),
                g.num_queue_reqs,
            )
        else:
            logger.info(
                "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, "
                "gen throughput (token/s): %.2f, #queue-req: %d",
                g.num_running_reqs,
                g.num_used_tokens,
                g.token_usage,
                g.gen_throughput,
                g.num_queue_reqs,
            )
