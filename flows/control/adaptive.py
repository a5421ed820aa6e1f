"""The adaptive law: keep the KV cache near full with a short server queue ready, never a flood.

Pure: ``observe`` takes one ``Observation`` (the server's sample, the client's own counts, the
projected KV demand of what is in flight, a timestamp) and returns a ``Decision`` with its reason,
so the law replays exactly on a recorded timeline. No clock, no I/O.

The rules, checked in this order each tick (about once a second):

1. Endpoint down: hold (the guard already closes the lane). When it comes back, or a server counter
   goes backwards, its KV capacity changes or its GPU memory is let go (a restart), start again
   cautiously.
2. A retraction / preemption since the last tick, KV usage >= ``kv_full``, or less than
   ``min_free_vram_bytes`` free on the tightest GPU: the server took more than it can hold and is
   recomputing work, or is about to run out of memory. Back off multiplicatively below what is in
   flight (once per event: not again while the requests above the new limit drain), hold growth
   for a request's life, and remember the new limit as a ceiling (TCP's ssthresh): above it the
   law probes once per quarter of a request's life, one request first, then twice as many each
   probe that meets no back-off, up to the ordinary ``grow`` step (like CUBIC's probing past its
   last loss: a ceiling set by one burst of long answers must not pin the limit for many lives).
   A retraction during the hold, with the cache below ``kv_full``, is the same event (the requests
   admitted before the cut finishing their growth) and cuts nothing more.
3. KV usage above ``target_kv``: the running requests still grow a token a step, so stop refills
   (limit = running x target / usage, both of the same reading) until it falls back. The reading
   may be a second old: scaled by what is in flight now, a cohort that ended since the reading
   took the limit with it (measured on the real SGLang: 79 cut to 24 while 52 ran at 0.96, then
   five seconds of regrowth). Nor is it a cut of the last cut: long answers keep the cache over
   the target for many ticks with nothing admitted, and cut again each tick the limit fell from
   21 to 1 with 13-19 running (the simulator, answers of up to 16,384 tokens), so refills then
   waited a request life with the cache a third full. Waiting for ``kv_full`` is too late:
   the gauges lag, and on the real SGLang the cache sat at 0.91-0.95 for five seconds before it
   reached 1.0 and retracted. A retraction costs more than its recompute: SGLang then raises its
   own admission estimate (``new_token_ratio``, to as much as 1.0 of every running request's
   remaining ``max_new_tokens``) and decays it over about 600 decode steps, admitting fewer for
   that long (0.5.x, ``NewTokenRatioTracker``). The cut is a pause: once the cache is under the
   target again (by ``resume_below``) the limit before the cut is given back, never past the
   budget. Kept at the cut, the limit bound nothing while the paced stream aimed at 1.1x it, and
   it grew back only where it bound: on the simulator's shift to long answers a cut from 47 to 38
   at 0.94 left the cache at 0.57-0.80 for 20 s with credit for 12-22 more, the stream aiming at
   41 (given back, the long phase made 1.7 % more in the median of five invocations, from 1.3 %
   less to 4.9 % more; bench/README.md). A paced stream (below) pauses over ``peak_kv`` instead,
   and resumes under it: its answers are of one length and their ages spread, so each end frees
   a whole request's KV and each newcomer adds only its prompt, and the cache saws around the mean
   the stream aims at (the target) by about a request's size. Paused over the target, the tops of
   the saw stopped refills and held the mean under it (the simulator's long phase: 1-12 pauses
   a minute, the cache at 0.78-0.85 on average, 40-44 in flight against an aim of 42-49). Past
   the peak the stream itself has overshot.
4. Budget in tokens, looking ahead (``outlook.py``): from each request's age, its category's expected
   prompt and output and the per-request decode rate, project what the requests in flight will
   hold over a newcomer's life; the budget is those in flight plus the newcomers that keep the
   projection under ``peak_kv`` of the pool all the while. ``occupancy`` (KV tokens actually used
   per modelled token now, a moving average) corrects the model. Counting every request at the
   average size let a cohort admitted together outgrow the cache at the end of its life; counting
   it at its final size keeps the cache half empty when ages are spread. The newcomers that fit are
   the lane's admission credit, apart from the limit. A slot that frees is not room by itself (as
   a cap on the number in flight, every ending request was refilled at once on top of the room
   that its end had made; measured on the simulator's long phase: a new cohort each life): the
   lane works the credit out again from the outlook when a request ends (``Lane.redo_credit``).
   The budget also stops growth, and it reacts to a shift towards longer answers before the gauges
   show it.
5. A long server queue (more than twice the ready-queue allowance) in two readings running: the
   server admits fewer than we send (its own admission rule, or ``--max-running-requests`` where
   the server does not say it: where ``/v1/loads`` does, rule 6's budget stops there before a queue
   forms); trim to running + allowance. One reading is not enough: when a cohort of short answers
   ends together, its refills wait for their prefill, and a reading in that moment sees few running
   and many queued (on the real SGLang, workload 2: 8-39 running and 13-95 queued, the next reading
   none queued); trimmed to it, the limit fell from 150 to 26 and to 11 with the cache at a fifth,
   and the batch was 72-85 against 94-105 with the rule waiting for a second reading (bench/README,
   twenty-sixth session).
6. Room (usage below target, queue within allowance) and the limit binds (in flight at the limit
   and prompts waiting): grow, never past the budget (the token budget's, and at most what the
   server runs at once, its ``max_running_requests``, and the ready queue: more only wait in its
   queue): straight to it where the server says its pool size, no further than the reading allows
   at the requests' size now (the limit x ``target_kv`` / usage), and past the last back-off only
   by probing (rule 2); where the pool size is unknown, doubling in the slow start (until the cache
   is half the target full, or the first back-off) and by ``grow`` a tick after it. Until answers
   come back the budget counts every request at its final size (no decode rate yet), so it is what
   surely fits; the doubling took four ticks to reach it, and on the real CPU SGLang the first ten
   seconds of a 300-prompt run then ran 35 requests on average against fixed 64's 63 (a tenth of
   the run). After the slow start the limit grew by ``grow`` a tick: pauses (rule 3) keep it near
   what is in flight, and when the prompts then turned short (a new category, or a prompt set
   ordered by length) it took five ticks to reach what the budget held, the cache at a fifth to a
   half (the real SGLang, workload 1: 28 to 82 while the credit said 32-60 more fit). Given the
   budget at once, and the budget capped at the server's running requests, workload 1 made 0.98-1.00x
   fixed 64 in three invocations against 0.91-0.98x before (bench/README, twenty-seventh session).
7. Otherwise hold.

Each decision also sets the lane's admission pace (``pacer.py``) while the answers are of about one
length: after the slow start, admissions are a steady stream (``turnover.py``) at the rate requests
end, averaged over a request's life, plus ``stream_gain`` of the way per life from the requests in
flight (averaged alike) to the aim: ``pace_factor`` times the limit, at most the newcomers that,
their ages spread evenly, hold the target KV on average (``Outlook.steady_count``). Never faster
than the outlook's stream rate (zero while a cohort at the budget has yet to end), with a small
bucket; a raised limit's room is filled by the stream too, not at once. Without it, requests of one
length admitted together finish together and each freed slot refilled at once keeps the burst: the
KV usage swings by half the pool once per request life (measured on the simulator's long phase:
bench/README.md). Answers of spread lengths dissolve a burst on their own, and pacing them only
delays refills (``pace_below_spread``); so do answers short beside their prompts, which barely swing
the cache and are prefilled in batches (``pace_above_growth``).

The ready-queue allowance is completions per second times the gauges' staleness (they refresh every
~40 decode steps), at most an eighth of what is in flight: enough queued requests to refill the
batch until the next reading, and no more, because SGLang admits from its queue by its own bolder
estimate and a long queue is how a server over-admits and then retracts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flows.control.outlook import Outlook
from flows.control.signals import ServerSample
from flows.control.turnover import Turnover


@dataclass(frozen=True)
class LawSettings:
    target_kv: float = 0.90
    kv_full: float = 0.99
    peak_above_target: float = 0.04
    """The outlook keeps its projected peak under ``peak_kv``, this much above ``target_kv``: the
    credit and the pace follow the one knob a user sets (``target_kv_usage``), which used to move
    only the over-target rule while the budget, what binds most of the time, stayed at 0.94. At a
    peak of 0.97 the real SGLang retracted once or twice per 300 requests once the credit was worked
    out again at every end; at 0.94 never, at 0.99x the throughput (bench/README, ninth session);
    a target of 0.93 (peak 0.97) ran at 0.98x the default's throughput with 4.2 retractions per
    1,000 requests against 1.2 (thirteenth session)."""
    resume_below: float = 0.02
    """An over-target cut (rule 3) is a pause; it ends once the cache is this far under the target
    (hysteresis: a cache hovering at the target does not cut and give back every tick)."""
    min_limit: int = 1
    max_limit: int = 1024
    initial_limit: int = 8
    grow: float = 1.25
    """Growth a tick where the server does not say its pool's size (no token budget to grow to)."""
    backoff: float = 0.85
    """The cut at a back-off. 0.85, not TCP's halving or the 0.75 used before admissions were paced:
    a cut is held for a request's life and probed back slowly, so a deep one costs a life of a
    quarter-empty cache (the simulator's long phase: about +6 % with 0.85 and the measured request
    life; bench/README)."""
    hold_s: float = 10.0
    """After a back-off growth is held for one request's life (how long answered requests held
    their slot, measured by the client, 2 s to 10 min): the cut must show in the gauges first. This
    long while no answer has come back yet. (Little's law on each tick's completion rate read 10-43 s
    for a 7 s life: completions come in bursts, and a back-off comes when they pause.)"""
    staleness_s: float = 2.0
    min_queue: int = 2
    min_free_vram_bytes: int = 1 << 30
    """Below this much free memory on the tightest GPU, back off: activations need headroom."""
    occupancy_alpha: float = 0.1
    """Occupancy (measured KV per modelled KV) starts at 1 and is learned slowly once answers come
    back: the gauges lag the model by up to their refresh interval."""
    probe_s: float = 5.0
    """Above the last back-off's ceiling, one probe per quarter of a request's life (1 s to 150 s;
    this long while no answer has come back): one request, then twice as many each probe."""
    min_occupancy: float = 0.5
    """Never trust a reading that the model counts twice what the cache holds: the budget would
    double (a stale gauge right after a burst of admissions reads that low)."""
    pace_factor: float | None = 1.1
    """Paced, the stream aims at this many times the limit (at most what the budget holds with ages
    spread): above it, so the limit binds and grows while there is room. None: unpaced
    (``pace_admissions = false``)."""
    pace_below_spread: float = 0.3
    """Pace only while the answers' lengths vary less than this (coefficient of variation of their
    output tokens). A burst of admissions whose lengths vary by ``cv`` spreads out on its own
    within about 1/cv**2 request lives (its ends drift apart like a random walk): 11 lives at 0.3,
    3 at 0.6 (two categories of 64 and 256 tokens), never when every answer runs to ``max_tokens``.
    Paced, the refills of a burst that would dissolve anyway only wait: on the real SGLang the paced
    law ran at 0.84x fixed 64 and the same law unpaced at 0.98x, both with no retraction, while on
    the simulator's long phase (answers of one length) unpaced requests kept one cohort for the
    whole phase and ran at 0.74x the best fixed setting against 0.85x paced (bench/README, ninth
    session)."""
    pace_above_growth: float = 1 / 3
    """Pace only while the answers make at least this share of a request's final KV (its output over
    prompt + output, from the outlook's newcomer). A cohort's KV swings by that share: its prompts
    are held from admission, its answers grow until it ends. Answers short beside their prompts
    barely swing the cache, and refilled at once they go to the server in batches, one prefill for
    many (SGLang runs each prefill apart from the decode batch, so a paced trickle interrupts the
    decode once per admission). Measured on the real SGLang, answers of 64 tokens after prompts of
    about 300 (a share near 0.2), 1,200 prompts: the law paced ran at 0.72x fixed 64, unpaced at
    0.82x (bench/README, eleventh session); the simulator's long phase (answers of 4,096 tokens:
    0.83-1.0 of a request's KV) is paced as before."""
    stream_gain: float = 1.0
    """Paced, each request life the stream closes this share of the gap between the requests in
    flight and its aim (``turnover.py``); both averaged over a life, so the dip a burst of ends
    leaves is not refilled as a new burst. The aim moves with the newcomers' prompt sizes: closing
    half the gap a life, in flight trailed it by 3-7 requests (the simulator's long phase, the cache
    at 0.74-0.80 while the aim held 0.90), the whole gap by about one, and the long phase made
    1.4-5.1 % more in four runs with the pause over the peak (rule 3), no more retractions
    (bench/README, twenty-sixth session)."""
    pace_burst_share: float = 0.0625
    """The pacer's bucket: this share of the limit (at least 2) may be admitted at once."""

    @property
    def peak_kv(self) -> float:
        """The share of the pool the outlook's projected peak may reach: above the target, below
        ``kv_full`` (where the law backs off)."""
        return min(self.target_kv + self.peak_above_target, self.kv_full - 0.01)


@dataclass(frozen=True)
class Observation:
    at: float
    server: ServerSample | None
    in_flight: int
    waiting: int
    """Prompts the client holds ready for a slot: growing helps only when there are some."""
    outlook: Outlook | None
    """What the requests in flight will hold in the KV cache over a newcomer's life (``outlook.py``);
    None when nothing counted is in flight."""
    completions_per_s: float
    healthy: bool = True
    """The endpoint not seen down (``EndpointGuard.serves``), not its lane open: that also closes
    while a request's failure is checked, on a server that serves (rule 1, ``Comeback``)."""
    free_vram_bytes: int | None = None
    """Free memory of the tightest GPU (NVML or DCGM), when it can be read: the OOM guard."""
    total_vram_bytes: int | None = None
    request_life_s: float | None = None
    """How long a request holds its slot, averaged over the answers so far (None before any)."""
    output_spread: float | None = None
    """How much the answers differ in length: the coefficient of variation of their output tokens
    over the last answers (None before any)."""


@dataclass(frozen=True)
class Decision:
    at: float
    limit: int
    previous: int
    reason: str
    credit: int | None
    """Admissions the token budget allows now (None: no budget). Not a cap on in flight: a slot
    that frees is not room by itself; the lane works the credit out again when a request ends."""
    kv_usage: float | None
    running: int | None
    queued: int | None
    retractions: int
    in_flight: int
    waiting: int
    completions_per_s: float
    healthy: bool
    free_vram_bytes: int | None
    total_vram_bytes: int | None
    budget_limit: int | None
    """Those in flight, the newcomers that fit beside them (the credit) and the ready queue, at most
    what the server runs at once (its ``max_running_requests``) and the ready queue: growth stops
    here."""
    queue_allowance: int
    occupancy: float | None
    request_life_s: float | None = None
    output_spread: float | None = None
    pace_per_s: float | None = None
    """Admissions per second the limiter allows this endpoint (None: unpaced)."""
    pace_burst: float = 1.0
    budget_tokens: float | None = None
    """The modelled KV tokens the outlook may reach (``peak_kv`` of the pool at the learned
    occupancy): the lane works its credit out again from this when a request ends."""
    restarted: bool = False
    """The server restarted since the last tick (rule 1), also while it is still down: its
    processes are new, so the controller finds again which GPUs its OOM guard reads."""


@dataclass
class Comeback:
    """The endpoint's health back since the last look (``seen`` once a tick): a server waited for may
    have died and been started again during the wait, a new process, on other GPUs maybe. The law
    then starts cautiously (rule 1), and whoever reads the server's free GPU memory finds its GPUs
    again (``VramReader.relocate``): the adaptive controller and a fixed lane's ``OomHold`` alike.

    Health, not the guard's outage count: that moves as an outage begins, when its server may still
    be the old process (hung) or none, and not again if it dies and is restarted in the same wait.
    Health is back once the new process answers, so it is found then. Health is the endpoint not
    seen down (``EndpointGuard.serves``: down from a failed check or a restart's start to the next
    check that passes), not its lane open: the lane closes for the health check of every request
    that fails on it, a busy server's too, and a tick within such a check was a restart here.
    Looked at once a tick like the law's other inputs (replayed from the timeline's ``healthy``): a
    restart lasts far longer than a tick, so no look misses one."""

    was_down: bool = False

    def seen(self, healthy: bool) -> bool:
        """Whether the endpoint is back since the last look (down then, ``healthy`` now)."""
        came_back = self.was_down and healthy
        self.was_down = not healthy
        return came_back


@dataclass
class AdaptiveLimit:
    """The law as a ``Limit``: ``limit`` is the last decision; ``observe`` makes the next."""

    settings: LawSettings = field(default_factory=LawSettings)
    _limit: int = 0
    _last_counter: float | None = None
    _last_capacity: int | None = None
    _hold_until: float = -math.inf
    _occupancy: float = 1.0
    _last_probe: float = -math.inf
    _probe_step: int = 1
    _slow_start: bool = True
    _ceiling: float = math.inf
    """Like TCP's ssthresh: the limit a back-off left; above it the law probes one request a tick."""
    _comeback: Comeback = field(default_factory=Comeback)
    _last_free_vram: int | None = None
    _turnover: Turnover = field(default_factory=Turnover)
    """Completions and requests in flight averaged over a life: the pace of answers of one length."""
    _last_modelled: float | None = None
    """The modelled KV of the requests running at the last tick that learned the occupancy."""
    _queue_was_long: bool = False
    """The last reading's server queue was more than twice the ready-queue allowance (rule 5)."""
    _paused_from: int | None = None
    """The limit an over-target cut paused refills from: given back once the cache is under the
    target again (rule 3 is a pause, not a new limit)."""

    def __post_init__(self) -> None:
        s = self.settings
        self._limit = _clamp(s.initial_limit, s.min_limit, s.max_limit)

    @property
    def limit(self) -> int:
        return self._limit

    def observe(self, obs: Observation) -> Decision:
        s = self.settings
        server = obs.server
        restarted = self._restarted(obs)
        retractions = self._retractions(server)
        self._learn_occupancy(obs)
        self._turnover.add(obs.at, obs.completions_per_s, obs.in_flight, obs.request_life_s)
        allowance = self._queue_allowance(obs)
        budget_tokens = self._budget_tokens(obs)
        budget = credit = None
        if budget_tokens is not None and obs.outlook is not None:
            # those in flight, the newcomers that fit beside them, the ready queue
            budget = obs.in_flight + math.floor(obs.outlook.room(budget_tokens)) + allowance
            credit = obs.outlook.credit(budget_tokens)
            if server is not None and server.max_running:  # more would only wait in its queue
                budget = min(budget, server.max_running + allowance)
        current = self._limit
        flooded = self._queue_stays_long(server, allowance)
        target, reason = self._target(obs, retractions, restarted, budget, allowance, flooded)
        self._limit = _clamp(target, s.min_limit, s.max_limit)
        pace, burst = self._pace(obs, budget_tokens)
        return Decision(
            at=obs.at,
            limit=self._limit,
            previous=current,
            reason=reason if self._limit != current else f"hold: {reason}",
            credit=credit,
            kv_usage=server.kv_usage if server else None,
            running=server.running if server else None,
            queued=server.queued if server else None,
            retractions=retractions,
            in_flight=obs.in_flight,
            waiting=obs.waiting,
            completions_per_s=obs.completions_per_s,
            healthy=obs.healthy,
            free_vram_bytes=obs.free_vram_bytes,
            total_vram_bytes=obs.total_vram_bytes,
            budget_limit=budget,
            budget_tokens=budget_tokens,
            queue_allowance=allowance,
            occupancy=self._occupancy,
            request_life_s=obs.request_life_s,
            output_spread=obs.output_spread,
            pace_per_s=pace,
            pace_burst=burst,
            restarted=restarted,
        )

    # -- the rules --------------------------------------------------------------------------------
    def _target(
        self,
        obs: Observation,
        retractions: int,
        restarted: bool,
        budget: int | None,
        allowance: int,
        flooded: bool,
    ) -> tuple[int, str]:
        s, server, current = self.settings, obs.server, self._limit
        if not obs.healthy:
            return current, "endpoint down"
        life = obs.request_life_s or 0.0
        if restarted:
            self._hold_until = obs.at + s.hold_s
            self._ceiling, self._probe_step = math.inf, 1
            self._slow_start = True
            self._turnover = Turnover()
            self._paused_from = None
            return min(current, s.initial_limit), "restart detected: cautious start"
        usage = server.kv_usage if server else None
        if usage is not None and usage >= s.target_kv / 2:
            self._slow_start = False
        low_vram = short_of_memory(obs.free_vram_bytes, s.min_free_vram_bytes)
        if retractions or low_vram or (usage is not None and usage >= s.kv_full):
            if obs.at < self._hold_until and obs.in_flight > current:
                # one back-off per event: the requests above the new limit are still draining
                return current, "holding after a back-off: in flight draining to the limit"
            full = usage is not None and usage >= s.kv_full
            if obs.at < self._hold_until and retractions and not (full or low_vram):
                return current, "holding after a back-off: requests admitted before the cut retracted"
            self._hold_until = obs.at + (min(max(life, 2.0), 600.0) if life else s.hold_s)
            if retractions:
                why = f"{retractions} retraction(s)"
            elif low_vram:
                why = f"GPU free memory {(obs.free_vram_bytes or 0) / 2**30:.2f} GiB (OOM guard)"
            else:
                why = f"KV usage {usage:.2f}"
            backed = math.floor(min(current, max(obs.in_flight, 1)) * s.backoff)
            self._ceiling, self._probe_step = max(backed, s.min_limit), 1
            self._slow_start, self._paused_from = False, None
            return backed, f"back off: {why}"
        pause_at = s.peak_kv if self._paces(obs) else s.target_kv
        if usage is not None and usage > pause_at and obs.in_flight > 0:
            seen = server.running if server is not None and server.running else obs.in_flight
            over = math.floor(seen * pause_at / usage)
            if over < current:
                self._slow_start = False
                self._paused_from = max(self._paused_from or 0, current)
                return max(over, s.min_limit), f"over target: KV usage {usage:.2f}, no refills until it falls"
        queued = server.queued if server else None
        if flooded and server is not None and server.running:
            trimmed = min(current, server.running + allowance)
            return trimmed, f"trim: server queue {queued} > ready allowance {allowance}"
        if self._paused_from is not None and usage is not None and usage < pause_at - s.resume_below:
            paused, self._paused_from = self._paused_from, None
            resumed = _within_budget(paused, budget, current)
            if resumed > current:
                return resumed, "under the target again: the limit before the pause given back"
        binds = obs.in_flight >= current - 1 and obs.waiting > 0
        room = (usage is None or usage < s.target_kv) and (queued is None or queued <= allowance)
        if binds and room and obs.at >= self._hold_until:
            grown = max(current + 1, math.floor(current * (2.0 if self._slow_start else s.grow)))
            if budget is not None:  # what fits at the occupancy known so far
                grown = max(grown, budget)
            if grown > self._ceiling:  # past the last back-off: probe, one request first
                if current < self._ceiling:
                    grown = max(current + 1, math.floor(self._ceiling))
                elif obs.at - self._last_probe >= (min(max(life / 4, 1.0), 150.0) if life else s.probe_s):
                    grown = current + min(self._probe_step, max(1, grown - current))
                    self._last_probe, self._probe_step = obs.at, self._probe_step * 2
                else:
                    return current, "probing above the last back-off"
            if usage is not None and usage > 0.05:
                grown = min(grown, max(current + 1, math.floor(current * s.target_kv / usage)))
            grown = _within_budget(grown, budget, current)  # its credit stops admissions
            return grown, "grow: room in the KV cache and prompts waiting"
        if not binds:
            return current, "limit not binding"
        if obs.at < self._hold_until:
            return current, "holding after a back-off"
        return current, "at target"

    # -- what the rules read ------------------------------------------------------------------------
    def _queue_stays_long(self, server: ServerSample | None, allowance: int) -> bool:
        """The server queue is more than twice the allowance in this reading and the last (rule 5)."""
        long = server is not None and server.queued is not None and server.queued > 2 * allowance
        stays, self._queue_was_long = long and self._queue_was_long, long
        return stays

    def _retractions(self, server: ServerSample | None) -> int:
        if server is None or server.preemptions_total is None:
            return 0
        last, self._last_counter = self._last_counter, server.preemptions_total
        if last is None or server.preemptions_total < last:
            return 0
        return int(server.preemptions_total - last)

    def _restarted(self, obs: Observation) -> bool:
        """Health came back, the retraction counter went backwards, the KV pool changed size, or GPU
        memory was let go (free memory up by half the GPU: the server's pool is gone)."""
        came_back = self._comeback.seen(obs.healthy)
        free, total, last_free = obs.free_vram_bytes, obs.total_vram_bytes, self._last_free_vram
        released = free is not None and total and last_free is not None and free - last_free > total / 2
        if free is not None:
            self._last_free_vram = free
        came_back = came_back or bool(released)
        server = obs.server
        if server is None:
            return came_back
        counter_back = (
            server.preemptions_total is not None
            and self._last_counter is not None
            and server.preemptions_total < self._last_counter
        )
        capacity = server.capacity_tokens
        resized = capacity is not None and self._last_capacity is not None and capacity != self._last_capacity
        if capacity is not None:
            self._last_capacity = capacity
        return came_back or counter_back or resized

    def _pace(self, obs: Observation, budget_tokens: float | None) -> tuple[float | None, float]:
        """Admissions per second and bucket size: the steady stream of ``turnover.py`` towards the
        aim (``pace_factor`` x limit, at most ``Outlook.steady_count`` at the target KV), and never
        faster than the outlook's stream rate.

        None during the slow start, while the endpoint is down, before any answer came back,
        while the answers' lengths vary by ``pace_below_spread`` or more, and while they make less
        than ``pace_above_growth`` of a request's KV. The life is the client's own measure of how
        long answered requests held their slot. The stream rate (``Outlook.stream_rate``) bounds the
        pace while a cohort in flight is yet to reach its peak: admitted faster, the newcomers would
        meet it there.
        """
        s = self.settings
        burst = max(2.0, self._limit * s.pace_burst_share)
        life, outlook = obs.request_life_s, obs.outlook
        if s.pace_factor is None or not life or not self._paces(obs):  # (both checked there: for mypy)
            return None, burst
        aim, stream = s.pace_factor * self._limit, None
        if budget_tokens is not None and outlook is not None:
            aim = min(aim, outlook.steady_count(budget_tokens * s.target_kv / s.peak_kv))
            stream = outlook.stream_rate(budget_tokens)  # 0 against a cohort at the budget
        pace = self._turnover.pace(aim, life, s.stream_gain)
        return (pace if stream is None else min(pace, stream)), burst

    def _paces(self, obs: Observation) -> bool:
        """Whether this tick's admissions are a steady stream (the conditions ``_pace`` documents)."""
        s, life, outlook = self.settings, obs.request_life_s, obs.outlook
        if s.pace_factor is None or self._slow_start or not obs.healthy or not life or life <= 0:
            return False
        if obs.output_spread is None or obs.output_spread >= s.pace_below_spread:
            return False  # answers of spread lengths dissolve a burst on their own
        # a burst of short answers barely swings the cache: batched prefills pay
        return outlook is None or outlook.growth_share() >= s.pace_above_growth

    def _learn_occupancy(self, obs: Observation) -> None:
        """KV tokens used per modelled token of the requests running (a moving average): what the
        outlook's model misses (prompt tokens from characters, a shared prefix cached once).

        Read only once answers come back (before, the outlook counts every request at its final
        size while the cache holds prompts only), and never below ``min_occupancy``.

        A reading that lags (SGLang's ``/metrics``: its gauges refresh every ~40 decode steps, and
        they are polled once a tick) is set against the model of the tick before: set against the
        model of now it read the cache short by what a tick adds while the batch grows. At the
        start of a run on the real SGLang the cache grew a tenth of the pool a second and the
        occupancy learned fell from 1.05 to 0.81 in ten seconds, the budget rose to 1.16 of the pool
        and the first cohort retracted (every retraction of the law there came then; bench/README,
        eighteenth session). In a steady state both models are alike.
        """
        s, server, outlook = self.settings, obs.server, obs.outlook
        if (
            server is None
            or server.kv_usage is None
            or server.capacity_tokens is None
            or not server.running
            or obs.in_flight <= 0
            or outlook is None
            or outlook.tokens_per_s is None
            or outlook.now_tokens <= 0
        ):
            self._last_modelled = None
            return
        modelled = outlook.now_tokens * min(server.running, obs.in_flight) / obs.in_flight
        previous, self._last_modelled = self._last_modelled, modelled
        read_against = previous if previous is not None and server.lags else modelled
        ratio = min(max(server.kv_usage * server.capacity_tokens / read_against, s.min_occupancy), 1.5)
        self._occupancy += s.occupancy_alpha * (ratio - self._occupancy)

    def _budget_tokens(self, obs: Observation) -> float | None:
        """The modelled tokens that fill ``peak_kv`` of the pool at the occupancy learned so far."""
        if obs.server is None or obs.server.capacity_tokens is None:
            return None
        return self.settings.peak_kv * obs.server.capacity_tokens / self._occupancy

    def _queue_allowance(self, obs: Observation) -> int:
        """Completions until the next fresh reading, at most an eighth of what is in flight.

        SGLang admits from its queue by its own estimate (which grows bolder as it decodes), so a long
        queue is how a server over-admits and then retracts.
        """
        s = self.settings
        wanted = math.ceil(obs.completions_per_s * s.staleness_s)
        return max(s.min_queue, min(wanted, obs.in_flight // 8))


def short_of_memory(free_bytes: int | None, min_free_bytes: int) -> bool:
    """The OOM guard's test, the adaptive law's and a fixed lane's (``oom_hold.py``) alike: memory
    that cannot be read is no reason to back off (the reader warned that there is no guard)."""
    return free_bytes is not None and free_bytes < min_free_bytes


def _within_budget(limit: int, budget: int | None, current: int) -> int:
    """A raised limit stops at the budget (growth and a pause's end alike), never below the limit
    now: the budget is a bound on raising it, not a cut."""
    return limit if budget is None else min(limit, max(budget, current))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))
