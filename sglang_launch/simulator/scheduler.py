"""A pure model of SGLang's scheduler: KV pool, admission, decode, retraction, step time.

No I/O and no wall clock: ``step()`` runs one iteration of SGLang's (non-overlapped) event loop
on a virtual clock and reports what happened. The rules follow SGLang 0.5.x so that a client
controller tested here meets the same behaviour on a real server:

* Admission (``PrefillAdder``): FIFO; the queue head gets in only if its input tokens plus
  ``min(max_new - generated, clip)`` are *strictly less* than the free pool minus the growth
  reserved for the running requests, ``sum(min(max_new - generated, clip)) x new_token_ratio``,
  minus what this same prefill batch already took (input + clipped max_new, not scaled). It stops
  at the first request that does not fit (no skipping), at ``max_running_requests``, and once
  the batch holds ``max_prefill_tokens`` input tokens (a first request always fits that budget;
  chunked prefill is not modelled, a long prompt is one prefill).
* A prefill batch runs instead of a decode step whenever one can be formed; it yields the first
  token of each admitted request.
* Decode: every running request gets one token. If the pool cannot hold one more token per
  request, requests are retracted first: SGLang's ``retract_decode`` order, fewest generated
  tokens first and, among equals, the longest prompt (the least work thrown away). At least one
  goes; more until the rest fit. Their KV is freed and they go back to the END of the queue
  (SGLang's FCFS ``waiting_queue.append``); the tokens already sent stay sent, but the prompt and
  those tokens are recomputed by a new prefill when readmitted. ``new_token_ratio`` then jumps to
  ``min(1, (generated + retract_decode_steps x n) / sum(max_new))`` over the remaining batch.
* ``new_token_ratio`` starts at ``init`` and decays linearly, once per decode step without
  retraction, to ``init x min_factor`` over ``decay_steps`` steps; it resets to ``init`` when the
  server goes idle (SGLang does so in its idle self-check).
* A request that would overflow the queue cap is rejected, a retracted one included (SGLang's
  ``_abort_on_queued_limit`` applies to both).

Step time: prefill ``base + per_token x input tokens``; decode ``base + per_request x batch +
per_kv_token x KV tokens held``, so throughput per request falls as the batch grows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from sglang_launch.simulator.config import SimConfig


class QueueFullError(Exception):
    """The waiting queue is at ``max_queued_requests``: SGLang answers 503."""


@dataclass(frozen=True, slots=True)
class SchedulerParams:
    """The scheduler's knobs, separate from the HTTP-level configuration."""

    max_total_tokens: int
    max_running_requests: int
    max_queued_requests: int | None = None
    max_prefill_tokens: int = 16384
    clip_max_new_tokens: int = 4096
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    decode_base_s: float = 0.02
    decode_per_request_s: float = 0.0002
    decode_per_kv_token_s: float = 5e-8
    prefill_base_s: float = 0.005
    prefill_per_token_s: float = 5e-5

    @classmethod
    def from_config(cls, cfg: SimConfig) -> SchedulerParams:
        """Pick the scheduler's fields out of the full simulator configuration."""
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})

    @property
    def min_new_token_ratio(self) -> float:
        """SGLang: ``min(init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1)``."""
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        """Decrement per decode step, so the floor is reached after ``decay_steps`` steps."""
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps

    def decode_seconds(self, batch_size: int, kv_tokens: int) -> float:
        """Simulated seconds of one decode step over ``batch_size`` requests holding ``kv_tokens``."""
        return (
            self.decode_base_s
            + self.decode_per_request_s * batch_size
            + self.decode_per_kv_token_s * kv_tokens
        )

    def prefill_seconds(self, input_tokens: int) -> float:
        """Simulated seconds of one prefill batch of ``input_tokens`` tokens."""
        return self.prefill_base_s + self.prefill_per_token_s * input_tokens


@dataclass(slots=True)
class SimRequest:
    """One request as the scheduler sees it: sizes only, the text lives elsewhere.

    ``output_tokens`` is where the answer ends (EOS or ``max_new_tokens``); the scheduler never
    looks at it for admission, exactly as SGLang cannot know it in advance.
    """

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    output_tokens: int
    generated: int = 0
    retractions: int = 0
    kv_tokens: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.output_tokens <= self.max_new_tokens:
            raise ValueError(f"output_tokens must be in [1, {self.max_new_tokens}], got {self.output_tokens}")

    @property
    def remaining_new(self) -> int:
        """Tokens the request may still generate under its ``max_new_tokens``."""
        return max(self.max_new_tokens - self.generated, 0)

    @property
    def extend_tokens(self) -> int:
        """Input a prefill must compute: the prompt, plus the answer so far after a retraction."""
        return self.prompt_tokens + self.generated


class StepKind(Enum):
    """Which forward pass a step ran."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Retraction:
    """One retraction event, with SGLang's log fields."""

    rids: tuple[str, ...]
    tokens_freed: int
    ratio_before: float
    ratio_after: float


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one scheduler iteration did. Every rid in ``advanced`` got exactly one token."""

    kind: StepKind
    duration_s: float
    advanced: tuple[str, ...]
    finished: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()
    input_tokens: int = 0
    retraction: Retraction | None = None
    rejected: tuple[str, ...] = ()


@dataclass(slots=True)
class SchedulerCounters:
    """Totals since the last reset, for metrics counters and tests."""

    prefill_steps: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    rejected_requests: int = 0
    retractions: int = 0
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    peak_running: int = 0
    peak_queued: int = 0
    peak_used_tokens: int = 0
    prefill_busy_s: float = 0.0
    decode_moments: list[float] = field(default_factory=lambda: [0.0] * 6)
    """SGLang's decode step sums (0.5.2x, ``/v1/loads``): steps, Σ batch, Σ step seconds, Σ batch²,
    Σ batch x seconds, Σ tokens, in simulated seconds."""


@dataclass(slots=True)
class Scheduler:
    """SGLang's scheduling loop on a virtual clock. See the module docstring for the rules."""

    params: SchedulerParams
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    used_tokens: int = 0
    clock_s: float = 0.0
    new_token_ratio: float = 0.0
    counters: SchedulerCounters = field(default_factory=SchedulerCounters)

    def __post_init__(self) -> None:
        self.new_token_ratio = self.params.init_new_token_ratio

    # ----- queries -------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self.waiting and not self.running

    @property
    def token_usage(self) -> float:
        """Share of the KV pool held by running requests (SGLang's ``token_usage``)."""
        return self.used_tokens / self.params.max_total_tokens

    def reserved_tokens(self) -> float:
        """Growth reserved for the running requests at the current ``new_token_ratio``."""
        clip = self.params.clip_max_new_tokens
        return sum(min(r.remaining_new, clip) for r in self.running) * self.new_token_ratio

    def waiting_tokens(self) -> int:
        """Input tokens the queue still has to prefill (``num_waiting_uncached_tokens``)."""
        return sum(r.extend_tokens for r in self.waiting)

    # ----- commands ------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        """Queue a new request, or raise ``QueueFullError`` when the queue is at its cap."""
        if self._queue_full():
            self.counters.rejected_requests += 1
            raise QueueFullError(req.rid)
        self.waiting.append(req)
        self.counters.peak_queued = max(self.counters.peak_queued, len(self.waiting))

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is (client gone, stream cut); frees its KV. False if unknown."""
        for req in self.running:
            if req.rid == rid:
                self.running.remove(req)
                self._free(req)
                self.counters.aborted_requests += 1
                return True
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self.counters.aborted_requests += 1
                return True
        return False

    def step(self) -> StepResult | None:
        """Run one iteration: a prefill batch if one can be formed, else a decode step.

        Returns None, and resets ``new_token_ratio``, when there is nothing to do.
        """
        admitted = self._select_prefill_batch()
        if admitted:
            return self._run_prefill(admitted)
        if self.running:
            return self._run_decode()
        self.new_token_ratio = self.params.init_new_token_ratio
        return None

    # ----- prefill -------------------------------------------------------------------------

    def _select_prefill_batch(self) -> list[SimRequest]:
        """SGLang's PrefillAdder over the FIFO queue; see the module docstring."""
        p = self.params
        free = p.max_total_tokens - self.used_tokens
        offset = self.reserved_tokens()
        budget = p.max_prefill_tokens
        batch: list[SimRequest] = []
        for req in self.waiting:
            if len(self.running) + len(batch) >= p.max_running_requests:
                break
            growth = min(req.remaining_new, p.clip_max_new_tokens)
            if req.extend_tokens + growth >= free - offset:
                break
            if req.extend_tokens >= budget and batch:
                break
            batch.append(req)
            offset += req.extend_tokens + growth
            budget -= req.extend_tokens
        return batch

    def _run_prefill(self, batch: list[SimRequest]) -> StepResult:
        input_tokens = sum(r.extend_tokens for r in batch)
        for req in batch:
            self.waiting.popleft()
            self.running.append(req)
            req.kv_tokens = req.extend_tokens
            self.used_tokens += req.kv_tokens
        self.counters.prefill_steps += 1
        self.counters.prefill_tokens += input_tokens
        self.counters.peak_running = max(self.counters.peak_running, len(self.running))
        duration = self.params.prefill_seconds(input_tokens)
        self.counters.prefill_busy_s += duration
        finished = self._advance(batch)
        self.clock_s += duration
        return StepResult(
            kind=StepKind.PREFILL,
            duration_s=duration,
            advanced=tuple(r.rid for r in batch),
            finished=finished,
            admitted=tuple(r.rid for r in batch),
            input_tokens=input_tokens,
        )

    # ----- decode --------------------------------------------------------------------------

    def _run_decode(self) -> StepResult:
        retraction: Retraction | None = None
        rejected: tuple[str, ...] = ()
        if self.params.max_total_tokens - self.used_tokens < len(self.running):
            retraction, rejected = self._retract()
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - self.params.new_token_ratio_decay, self.params.min_new_token_ratio
            )
        batch = list(self.running)
        duration = self.params.decode_seconds(len(batch), self.used_tokens)
        self.counters.decode_steps += 1
        size = float(len(batch))
        for i, value in enumerate((1.0, size, duration, size * size, size * duration, size)):
            self.counters.decode_moments[i] += value
        finished = self._advance(batch)
        self.clock_s += duration
        return StepResult(
            kind=StepKind.DECODE,
            duration_s=duration,
            advanced=tuple(r.rid for r in batch),
            finished=finished,
            retraction=retraction,
            rejected=rejected,
        )

    def _retract(self) -> tuple[Retraction, tuple[str, ...]]:
        """Free KV until one more token per remaining request fits (at least one victim).

        The last request is never retracted: with ``context_length <= max_total_tokens`` and
        prompt + max_tokens < context_length, a request alone always fits.
        """
        ratio_before = self.new_token_ratio
        # SGLang sorts by (generated, -prompt) descending and pops from the end.
        order = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        victims: list[SimRequest] = []
        freed = 0
        while len(order) > 1 and (
            not victims or self.params.max_total_tokens - self.used_tokens < len(order)
        ):
            victim = order.pop()
            victims.append(victim)
            self.running.remove(victim)
            freed += victim.kv_tokens
            self.counters.retracted_input_tokens += victim.prompt_tokens
            self.counters.retracted_output_tokens += victim.generated
            self._free(victim)
        self.counters.retractions += 1
        self.counters.retracted_requests += len(victims)
        rejected = []
        for victim in victims:
            victim.retractions += 1
            if self._queue_full():
                rejected.append(victim.rid)
                self.counters.rejected_requests += 1
            else:
                self.waiting.append(victim)
        self.counters.peak_queued = max(self.counters.peak_queued, len(self.waiting))
        total_max_new = sum(r.max_new_tokens for r in self.running)
        decoded = sum(r.generated for r in self.running)
        steps = self.params.retract_decode_steps * len(self.running)
        self.new_token_ratio = min(1.0, (decoded + steps) / total_max_new)
        retraction = Retraction(tuple(v.rid for v in victims), freed, ratio_before, self.new_token_ratio)
        return retraction, tuple(rejected)

    # ----- helpers -------------------------------------------------------------------------

    def _advance(self, batch: list[SimRequest]) -> tuple[str, ...]:
        """Give every request in ``batch`` one token; retire those whose answer is complete."""
        finished = []
        for req in batch:
            req.generated += 1
            req.kv_tokens += 1
            if req.generated >= req.output_tokens:
                finished.append(req)
        self.used_tokens += len(batch)
        self.counters.generated_tokens += len(batch)
        self.counters.peak_used_tokens = max(self.counters.peak_used_tokens, self.used_tokens)
        for req in finished:
            self.running.remove(req)
            self._free(req)
        self.counters.finished_requests += len(finished)
        return tuple(r.rid for r in finished)

    def _free(self, req: SimRequest) -> None:
        self.used_tokens -= req.kv_tokens
        req.kv_tokens = 0

    def _queue_full(self) -> bool:
        cap = self.params.max_queued_requests
        return cap is not None and len(self.waiting) >= cap
