"""The async request pump: one shard of prompts through the limiter to the endpoints and into the store.

Requests are asyncio tasks, never Prefect tasks: thousands are in flight at once and each is cheap.
The dispatcher takes a slot BEFORE creating a request task, so waiting prompts are list items, not
thousands of coroutines woken on every completion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from flows.client import EndpointClient
from flows.concurrency import Lane, Limiter
from flows.config import CategoryConfig
from flows.errors import FatalEndpointError, PermanentRequestError, RequestError, TransientRequestError
from flows.health import Endpoint
from flows.prompt_stream import Reject, dedup_key
from flows.quality import TRUNCATED
from flows.regen import regenerate
from flows.rows import output_row, reject_row
from flows.sampling import SamplingParams
from flows.store import ShardWriter
from prompts.records import PromptRecord


class RunAborted(RuntimeError):
    """The endpoint refuses every request (bad key, unknown model): stop, reject nothing."""


@dataclass
class Tally:
    """Live counters of one category, read by the progress display and the Prefect artifact."""

    queued: int = 0
    rows: int = 0
    rejects: int = 0
    truncated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    retried_attempts: int = 0
    recovered: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)

    def count_reject(self, reason: str) -> None:
        self.rejects += 1
        self.reject_reasons[reason] = self.reject_reasons.get(reason, 0) + 1


@dataclass
class CategorySink:
    """Where one category's results go."""

    rows: ShardWriter
    rejects: ShardWriter
    tally: Tally


def _source(record: PromptRecord) -> dict[str, object]:
    return {"dataset": record.source.dataset, "split": record.source.split, "row": record.source.row}


RECOVERY_ROUNDS = 3
"""Times a prompt whose retries ran out is sent again after its endpoint was seen healthy."""


async def _ask(
    record: PromptRecord,
    endpoint: Endpoint,
    category: CategoryConfig,
    sampling: SamplingParams,
    sink: CategorySink,
) -> None:
    """One prompt to exactly one row or one reject; a fatal endpoint error propagates.

    A transient failure that outlived the client's retries is usually a server that died or
    restarts: the guard waits for it (or restarts it) and the prompt is asked again, so an outage
    costs time, not rows. Only a server gone for good, or a prompt that keeps failing on a
    healthy server, ends as a (retryable) reject.
    """
    client = endpoint.client
    prompt_hash = dedup_key(record, category)
    for round_ in range(RECOVERY_ROUNDS):
        try:
            regenerated = await regenerate(record, client, sampling, category.mode)
            break
        except FatalEndpointError:
            raise
        except PermanentRequestError as error:
            _reject(record, sink, client, error, prompt_hash, retryable=False)
            return
        except TransientRequestError as error:
            if round_ == RECOVERY_ROUNDS - 1 or not await endpoint.guard.recover():
                _reject(record, sink, client, error, prompt_hash, retryable=True)
                return
            sink.tally.recovered += 1
    row = output_row(record, regenerated, sampling, client.endpoint, prompt_hash)
    sink.rows.add(row)
    tally = sink.tally
    usage = regenerated.usage
    tally.rows += 1
    tally.truncated += TRUNCATED in row["flags"]
    tally.prompt_tokens += usage.prompt_tokens
    tally.completion_tokens += usage.completion_tokens
    tally.reasoning_tokens += usage.reasoning_tokens
    tally.retried_attempts += regenerated.attempts - len(regenerated.generations)


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
    items: Sequence[PromptRecord | Reject],
    *,
    limiter: Limiter[Endpoint],
    category: CategoryConfig,
    sampling: SamplingParams,
    sink: CategorySink,
) -> None:
    """Send every record of the shard, write every conversion reject; return when all are settled."""
    pending: set[asyncio.Task[None]] = set()
    fatal: list[FatalEndpointError] = []

    held: dict[asyncio.Task[None], Lane[Endpoint]] = {}

    async def release(task: asyncio.Task[None]) -> None:
        lane = held.pop(task, None)
        if lane is not None:
            await limiter.release(lane)

    async def run(record: PromptRecord, lane: Lane[Endpoint]) -> None:
        try:
            await _ask(record, lane.endpoint, category, sampling, sink)
        except FatalEndpointError as error:
            fatal.append(error)
        finally:
            current = asyncio.current_task()
            assert current is not None
            await release(current)

    try:
        for item in items:
            if fatal:
                break
            if isinstance(item, Reject):
                sink.rejects.add(item.row)
                sink.tally.count_reject(item.row["reason"])
                continue
            sink.tally.queued += 1
            lane = await limiter.acquire()
            task = asyncio.create_task(run(item, lane))
            held[task] = lane
            pending.add(task)
            task.add_done_callback(pending.discard)
        while pending and not fatal:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for task in list(held):  # cancelled before they ran: their slots are still taken
            await release(task)
    if fatal:
        raise RunAborted(fatal[0].reason) from fatal[0]
