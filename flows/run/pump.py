"""The async request pump: one shard of prompts through the limiter to the endpoints and into the store.

Requests are asyncio tasks, never Prefect tasks: thousands are in flight at once and each is cheap.
The dispatcher takes a slot BEFORE creating a request task, so waiting prompts are list items, not
thousands of coroutines woken on every completion.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from flows.client.endpoint import EndpointClient
from flows.client.errors import FatalEndpointError, PermanentRequestError, RequestError, TransientRequestError
from flows.client.guard import Endpoint
from flows.client.sampling import SamplingParams
from flows.config import CategoryConfig
from flows.control.demand import CategoryDemand
from flows.control.limiter import GateClosed, Lane, Limiter
from flows.run.prompt_stream import Ask, Reject
from flows.run.quality import TRUNCATED
from flows.run.reasons import OTHER_REASONS
from flows.run.regen import regenerate
from flows.run.rows import output_row, reject_row
from flows.run.suspects import CONVICTED_AGAIN, LONE_SUSPECT, OUTAGE_ROUNDS, SUSPECT_OUTAGES, SuspectGate
from flows.say import SAY
from flows.store.run_store import ShardWriter
from prompts.records import PromptRecord

log = logging.getLogger(__name__)


class RunAborted(RuntimeError):
    """The endpoint refuses every request (bad key, unknown model): stop, reject nothing."""


MAX_REJECT_REASONS = 200


@dataclass
class Tally:
    """Live counters of one category, read by the progress display and the Prefect artifact."""

    queued: int = 0
    rows: int = 0
    rejects: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    retried_attempts: int = 0
    recovered: int = 0
    internal_errors: int = 0
    outage_rejects: int = 0
    """Prompts rejected for being in flight at ``OUTAGE_ROUNDS`` server outages."""
    reject_reasons: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    left_out: int = 0
    """Rows with a quality flag: kept, but not in the training split."""
    flags: Counter[str] = field(default_factory=Counter)

    @property
    def truncated(self) -> int:
        return self.flags[TRUNCATED]

    def count_reject(self, reason: str) -> None:
        """Counted by its reason, at most ``MAX_REJECT_REASONS`` reasons apart: servers word reasons
        with each prompt's numbers (``maximum context length of 8192 tokens. You requested a total of
        9131 tokens``), and a week of such rejects grew one entry each, in memory, in every refresh
        of the Prefect card and in the summary (the rejects table keeps every one). When full, the
        less common half is summed as ``OTHER_REASONS``, so a reason that starts late (the server
        busy at the end of a week of long prompts) is still counted apart."""
        self.rejects += 1
        if reason not in self.reject_reasons and len(self.reject_reasons) >= MAX_REJECT_REASONS:
            self._lump_the_less_common_half()
        self.reject_reasons[reason] = self.reject_reasons.get(reason, 0) + 1

    def _lump_the_less_common_half(self) -> None:
        counts = self.reject_reasons
        other = counts.pop(OTHER_REASONS, 0)
        ranked = sorted(counts.items(), key=lambda item: -item[1])
        kept = ranked[: MAX_REJECT_REASONS // 2]
        other += sum(n for _, n in ranked[len(kept) :])
        self.reject_reasons = {**dict(kept), OTHER_REASONS: other}


@dataclass
class CategorySink:
    """Where one category's results go."""

    rows: ShardWriter
    rejects: ShardWriter
    tally: Tally


def _source(record: PromptRecord) -> dict[str, object]:
    return {"dataset": record.source.dataset, "split": record.source.split, "row": record.source.row}


RECOVERY_ROUNDS = 3
"""Times a prompt may fail (its retries run out) on a server found healthy right after: then it is a
retryable reject, the prompt's fault (a poison prompt), not the server's."""


@dataclass
class Rounds:
    """The failures of one prompt that outlived the client's retries, by whose fault."""

    healthy: int = 0
    """On a server that was serving right after: the prompt's."""
    outages: int = 0
    """With its server down, restarted or given up on: the server's, or a prompt that kills it."""
    convicted: bool = False
    """An earlier start of the run rejected it alone among suspects at its third outage: this start
    asks it as a suspect from the first (``SUSPECT_OUTAGES`` counted), and its next outage is its
    last (``suspects.py``)."""

    @classmethod
    def first(cls, convicted: bool) -> Rounds:
        """A prompt's rounds as this start first asks it."""
        return cls(outages=SUSPECT_OUTAGES, convicted=True) if convicted else cls()

    def spent(self, outage: bool) -> bool:
        """Count one failure; whether the prompt has had all the rounds it gets."""
        if outage:
            self.outages += 1
            return self.outages >= OUTAGE_ROUNDS
        self.healthy += 1
        return self.healthy >= RECOVERY_ROUNDS


@dataclass(frozen=True)
class Patience:
    """How long to wait for a silent endpoint: alone (``outage_s``) or with others to fail over to."""

    outage_s: float = 1800.0
    failover_s: float = 60.0


Held = dict["asyncio.Task[None]", Lane[Endpoint]]


@dataclass(frozen=True, eq=False)
class Demand:
    """One prompt's KV footprint for the token budget (``Footprint``), and where to learn from its
    answer. A fixed limit has no demand model, so its prompts have none (``of`` gives None)."""

    model: CategoryDemand
    prompt_chars: int

    @classmethod
    def of(cls, model: CategoryDemand | None, record: PromptRecord) -> Demand | None:
        return None if model is None else cls(model, prompt_chars(record))

    def learn(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.model.learn(self.prompt_chars, prompt_tokens, completion_tokens)


def prompt_chars(record: PromptRecord) -> int:
    """Characters the server will tokenize for the first request: message texts and tool schemas."""
    chars = sum(len(m.get("content") or "") for m in record.messages if isinstance(m.get("content"), str))
    return chars + (len(json.dumps(record.tools)) if record.tools else 0)


async def _ask(
    item: Ask,
    held: Held,
    limiter: Limiter[Endpoint],
    category: CategoryConfig,
    sampling: SamplingParams,
    sink: CategorySink,
    patience: Patience,
    demand: Demand | None,
    suspects: SuspectGate,
    rounds: Rounds,
) -> None:
    """One prompt to exactly one row or one reject; a fatal endpoint error propagates.

    A transient failure that outlived the client's retries is usually a server that died or
    restarts: the prompt waits for its endpoint (the guard restarts a server this run launched),
    or, when other endpoints answer, moves to one of them after ``failover_s``. So an outage costs
    time, not rows. If no endpoint answers for ``outage_s``, the run stops (FatalEndpointError)
    instead of turning every remaining prompt into a reject. A prompt that keeps failing on a
    healthy server, or that was in flight at ``OUTAGE_ROUNDS`` outages, ends as a retryable reject
    (``Rounds``): whose fault a failure was is known once its endpoint's health is, and an outage's
    is counted only once the run goes on (an endpoint answers): a run that stops at it leaves the
    prompt unanswered, as it does all the others it stops with. A prompt in flight at
    ``SUSPECT_OUTAGES`` outages is a suspect, asked again in its turn (``suspects.py``: alone while
    other prompts wait for a slot): it waits for it without its slot, which prompts beside it fill,
    and holds it until it settles (``pump_shard`` gives it back). An outage it was at with other
    suspects counts for none of them.
    """
    task = asyncio.current_task()
    assert task is not None
    record, prompt_hash = item.record, item.prompt_hash
    while True:
        if rounds.outages >= SUSPECT_OUTAGES and not suspects.held_by(task):
            # its turn among the suspects waited for without a slot: the batch goes on without it
            await limiter.release(held.pop(task), demand)
            await suspects.enter(record.id, rounds.convicted, limiter.unused_for)
            held[task] = await limiter.acquire(demand)
        lane = held[task]
        client, guard = lane.endpoint.client, lane.endpoint.guard
        outages_before, sent = guard.outages, suspects.sent(task)
        try:
            regenerated = await guard.serve(regenerate(record, client, sampling, category.mode))
            break
        except FatalEndpointError:
            raise
        except PermanentRequestError as error:
            _reject(record, sink, client, error, prompt_hash, retryable=False)
            return
        except TransientRequestError as error:
            # an endpoint being waited for by other requests is not given up on: counted as down,
            # it stopped a healthy run whenever one of its requests was checking its health
            others = any(other is not lane and not other.endpoint.guard.gone for other in limiter.lanes)
            # the outage patience this prompt has left once its own endpoint is given up on: alone, it
            # waited all of it there; with others, only failover_s, and may wait the rest for any one
            patience_left_at = time.monotonic() + patience.outage_s if others else -math.inf
            serving = await guard.recover(patience.failover_s if others else patience.outage_s)
            outage = not serving or guard.outages != outages_before
            if not serving:
                # move the prompt to an endpoint that answers; none within the outage patience stops
                # the run here, before its rounds are counted: a prompt its run gave up on with the
                # server is unanswered (the resume asks it once), not a reject row to pay for
                await limiter.release(held.pop(task), demand)
                held[task] = await _another_lane(limiter, demand, patience_left_at, error, patience)
            if outage and suspects.held_by(task) and not suspects.alone(sent):
                # with other suspects: none is counted, fewer go together next
                suspects.split(task, (guard, guard.outages))
            elif rounds.spent(outage):
                if outage and suspects.held_by(task):
                    suspects.convicted()
                _reject_spent(record, sink, client, error, prompt_hash, rounds)
                return
            if serving and demand is not None:  # asked again from its start: the budget counts it as new
                held[task].admit(demand, time.monotonic())
            sink.tally.recovered += 1
        except Exception as error:  # not the server's fault nor the prompt's: a bug in reading the answer
            _reject_internal(record, sink, client, error, prompt_hash)
            return
    try:
        row = output_row(record, regenerated, sampling, client.endpoint, prompt_hash)
        sink.rows.add(row)  # a row its shard cannot hold (UnstorableRow) is this prompt's reject
    except Exception as error:
        _reject_internal(record, sink, client, error, prompt_hash)
        return
    tally = sink.tally
    usage = regenerated.usage
    held[task].finished(regenerated.latency_s, usage.completion_tokens)
    if demand is not None:
        demand.learn(usage.prompt_tokens, usage.completion_tokens)
    tally.rows += 1
    finish = str(row["finish_reason"])
    tally.finish_reasons[finish] = tally.finish_reasons.get(finish, 0) + 1
    _watch_quality(category.name, tally, row["flags"])
    tally.prompt_tokens += usage.prompt_tokens
    tally.completion_tokens += usage.completion_tokens
    tally.reasoning_tokens += usage.reasoning_tokens
    tally.retried_attempts += regenerated.attempts - len(regenerated.generations)


WATCHED_ROWS = 32
LEFT_OUT_ALARM = 0.9


def _watch_quality(category: str, tally: Tally, flags: list[str]) -> None:
    """Say once, at a category's ``WATCHED_ROWS``-th row, when nearly all its rows so far are left
    out of training: a thinking model whose answers all end inside the reasoning (a reasoning parser
    that takes the answer, a ``max_tokens`` too small to finish thinking) makes rows that are all
    flagged, and a week of GPU time went into them with the numbers in the report only at the end.
    Said (``extra=SAY``): at the terminal the CLI's ``warning:`` line, not a log line that the
    progress bar's redraws bury; in a deployment's log a warning as before."""
    if flags:
        tally.left_out += 1
        tally.flags.update(flags)
    if tally.rows != WATCHED_ROWS or tally.left_out < LEFT_OUT_ALARM * WATCHED_ROWS:
        return
    seen = ", ".join(f"{flag} {n}" for flag, n in tally.flags.most_common())
    log.warning(
        "category %s: %d of its first %d rows are left out of training (%s): 'truncated' means a "
        "max_tokens too small (for a thinking model, to finish thinking); 'empty' with reasoning, a "
        "reasoning parser that took the answer. The run goes on; stop it to change the config.",
        category,
        tally.left_out,
        WATCHED_ROWS,
        seen,
        extra=SAY,
    )


async def _another_lane(
    limiter: Limiter[Endpoint],
    demand: Demand | None,
    deadline: float,
    error: TransientRequestError,
    patience: Patience,
) -> Lane[Endpoint]:
    """A slot for a prompt whose endpoint was given up on after ``failover_s``, on one that answers.

    While every endpoint is given up on (all down at once: a switch, a power cut), the prompt waits
    for one to answer again (the pool's probe puts it back in service) until ``outage_s`` after its
    own endpoint fell silent; then the run stops. Stopped at once, all endpoints down for a minute
    ended a run that ``outage_patience_s`` promised to wait half an hour for.
    """
    if not all(lane.endpoint.guard.gone for lane in limiter.lanes):
        return await limiter.acquire(demand)
    try:
        return await asyncio.wait_for(limiter.acquire(demand), max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        raise FatalEndpointError(_given_up(patience, len(limiter.lanes))) from error


def _given_up(patience: Patience, endpoints: int) -> str:
    if endpoints == 1:
        return f"no endpoint has answered for {patience.outage_s:.0f} s"
    return (
        f"no endpoint has answered for {patience.outage_s:.0f} s: each of the {endpoints} was given up on "
        f"(after {patience.failover_s:.0f} s while another could take its prompts) and none came back"
    )


def _reject_spent(
    record: PromptRecord,
    sink: CategorySink,
    client: EndpointClient,
    error: TransientRequestError,
    prompt_hash: str,
    rounds: Rounds,
) -> None:
    """A retryable reject for a prompt out of rounds; one in flight at every outage says so, and is
    named in the log (the first of its category): it was the only suspect in flight at the last
    (``suspects.py``), so it is most likely what brings the servers down. Retryable all the same: a
    server that died for its own reasons three times with it in flight (an OOM at full load) looks
    the same, and the next start asks it again, alone, before anything else of it is known. One that
    brings the server down then too is a final reject: asked again at every start (a scheduled run
    starts every hour), it brought the server down at each."""
    if rounds.outages < OUTAGE_ROUNDS:
        _reject(record, sink, client, error, prompt_hash, retryable=True)
        return
    sink.tally.outage_rejects += 1
    if rounds.convicted:
        head, said, what = CONVICTED_AGAIN, "a final reject, not asked again", CONVICTED_AGAIN
    else:
        head, said = f"was {LONE_SUSPECT}", "a retryable reject, asked again alone at the next start"
        what = f"{LONE_SUSPECT} (it brings the server down)"
    if sink.tally.outage_rejects == 1:
        log.warning(
            "category %s: prompt %s %s: %s (the rejects table names any more such)",
            record.category,
            record.id,
            head,
            said,
            extra=SAY,
        )
    suspect = TransientRequestError(f"{what}: {error.reason}", status=error.status, attempts=error.attempts)
    _reject(record, sink, client, suspect, prompt_hash, retryable=not rounds.convicted)


def _reject_internal(
    record: PromptRecord, sink: CategorySink, client: EndpointClient, error: Exception, prompt_hash: str
) -> None:
    """A bug, not the server or the prompt: a retryable reject that says so (a resume asks again once
    it is mended) and the category's first such traceback in the log. Before, the request's task
    died with the error unread: a prompt with neither a row nor a reject, and a run that said it
    had finished."""
    sink.tally.internal_errors += 1
    if sink.tally.internal_errors == 1:
        log.error(
            "category %s: an answer could not be read (%s); its prompt is a retryable reject",
            record.category,
            error,
            exc_info=error,
        )
    reason = f"internal error: {type(error).__name__}: {error}"[:300]
    _reject(record, sink, client, RequestError(reason), prompt_hash, retryable=True)


def _reject(
    record: PromptRecord,
    sink: CategorySink,
    client: EndpointClient,
    error: RequestError,
    prompt_hash: str,
    *,
    retryable: bool,
) -> None:
    attempts = getattr(error, "attempts", 1)
    sink.rejects.add(
        reject_row(
            record_id=record.id,
            category=record.category,
            source=_source(record),
            stage="request",
            reason=error.reason,
            status=error.status,
            retryable=retryable,
            attempts=attempts,
            endpoint=client.endpoint,
            prompt_hash=prompt_hash,
        )
    )
    sink.tally.count_reject(error.reason)


async def pump_shard(
    items: Sequence[Ask | Reject],
    *,
    limiter: Limiter[Endpoint],
    category: CategoryConfig,
    sampling: SamplingParams,
    sink: CategorySink,
    patience: Patience = Patience(),
    demand: CategoryDemand | None = None,
    before_first: Callable[[], Awaitable[None]] | None = None,
    after_last: Callable[[], None] | None = None,
    suspects: SuspectGate | None = None,
    convicted: Collection[str] = (),
) -> None:
    """Send every record of the shard, write every conversion reject; return when all are settled.

    A fatal error closes the limiter (``Limiter.close``), which stops every shard of every category
    sharing it: each raises ``RunAborted`` with the first reason, its unsettled prompts neither rows
    nor rejects (a resume sends them). The dispatcher runs as its own task so that the close stops
    it even while it waits for a slot. ``before_first`` is awaited before the
    first request (the categories' start line). After each admission the dispatcher yields, so
    that with free slots to share (the start, a raised limit) the shards' dispatchers take them in
    turn instead of the first one taking them all. ``after_last`` is called once the dispatcher has
    sent its last prompt (or stopped): the shard then only waits for answers, and the pipeline starts
    the next one instead of leaving the endpoints that answered theirs idle. ``suspects`` is the
    run's gate (the suspects' turns across its shards, ``suspects.py``); without one, the shard's own.
    ``convicted``: the ids an earlier start rejected alone among suspects (``Rounds.convicted``).
    """
    gate = suspects or SuspectGate()
    pending: set[asyncio.Task[None]] = set()
    held: Held = {}
    needs: dict[asyncio.Task[None], Demand | None] = {}
    fatal: list[FatalEndpointError] = []

    async def run(item: Ask, need: Demand | None) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            rounds = Rounds.first(item.record.id in convicted)
            await _ask(item, held, limiter, category, sampling, sink, patience, need, gate, rounds)
        except FatalEndpointError as error:
            fatal.append(error)
            await limiter.close(error.reason)
        except GateClosed:
            pass  # the run stops while this prompt moved endpoints: a resume sends it
        finally:
            gate.leave(task)
            lane = held.pop(task, None)
            needs.pop(task, None)
            if lane is not None:
                await limiter.release(lane, need)

    async def dispatch() -> None:
        try:
            await send()
        finally:
            if after_last is not None:
                after_last()

    async def send() -> None:
        if before_first is not None:
            await before_first()
        for item in items:
            if limiter.closed.is_set():
                return
            if isinstance(item, Reject):
                sink.rejects.add(item.row)
                sink.tally.count_reject(item.row["reason"])
                continue
            sink.tally.queued += 1
            need = Demand.of(demand, item.record)
            try:
                lane = await limiter.acquire(need)
            except GateClosed:
                return
            task = asyncio.create_task(run(item, need))
            held[task] = lane  # before the task first runs: create_task only schedules it
            needs[task] = need
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(0)

    dispatcher = asyncio.create_task(dispatch())
    stopped = asyncio.create_task(limiter.closed.wait())
    try:
        await asyncio.wait({dispatcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if dispatcher.done():
            dispatcher.result()
        while pending and not limiter.closed.is_set():
            await asyncio.wait({*pending, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (dispatcher, stopped, *pending):
            task.cancel()
        await asyncio.gather(dispatcher, stopped, *pending, return_exceptions=True)
        for task in list(held):  # cancelled before they ran: their slots are still taken
            await limiter.release(held.pop(task), needs.pop(task, None))
    if limiter.closed_reason is not None:
        raise RunAborted(limiter.closed_reason) from (fatal[0] if fatal else None)
