"""The pipeline: categories run side by side, each cut into shards, each shard pumped under the limiter.

The same ``Pipeline`` drives the Prefect flow (a flow run per pipeline run, a subflow per category, a
task per shard) and the Prefect-free path; only the runners differ. A shard's prompts are parked here
between being read and being pumped, so an orchestrator only ever passes (category, index) around.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from flows.run.prompt_stream import Ask, MostlyRejected, Reject, category_items, take
from flows.run.pump import RunAborted, pump_shard
from flows.run.session import RunSession

ShardRunner = Callable[[str, int], Coroutine[Any, Any, None]]
"""(category, shard index) -> shard done. Prefect's task or ``Pipeline.run_shard`` itself."""

CategoryRunner = Callable[[str], Awaitable[None]]
"""category -> category done. Prefect's subflow or a plain call of ``Pipeline.run_category``."""

START_TOGETHER_S = 10.0
"""How long a shard waits at the start line for every category's first window of shards, counted
from when the last category began reading."""
BEGIN_TOGETHER_S = 60.0
"""How long a shard waits for every category to begin reading at all (an orchestrator starts each
category's subflow in turn: on a loaded machine Prefect began the second 12 s after the first)."""


class StartLine:
    """The categories start sending together, once each one's first shards (its window) exist.

    Why: the first category to be read would otherwise take every free slot at once (the whole
    first limit: measured, all 64 first requests of one category), so the first wave, and the
    demand the concurrency law learns from it, would be one category's. After the start the
    limiter serves the shards' dispatchers in turn. Reading a local file's shard takes
    milliseconds; a slow source (the Hub) holds the others ``patience_s`` at most, counted from
    when the last category began: the time an orchestrator takes to start a category is not a slow
    source (counted from the first shard, Prefect's second subflow missed the line and the first
    category took the whole first wave), and it is bounded by ``begin_s``.
    """

    def __init__(
        self, runners: int, patience_s: float = START_TOGETHER_S, begin_s: float = BEGIN_TOGETHER_S
    ) -> None:
        self._missing = runners
        self._not_begun = runners
        self._patience_s = patience_s
        self._begin_s = begin_s
        self._all_in = asyncio.Event()
        self._all_begun = asyncio.Event()
        self._all_begun_at = 0.0
        if runners <= 0:
            self._all_in.set()
            self._all_begun.set()

    def begin(self) -> None:
        """One category began reading its source: the patience runs once every one has."""
        self._not_begun -= 1
        if self._not_begun <= 0 and not self._all_begun.is_set():
            self._all_begun_at = asyncio.get_running_loop().time()
            self._all_begun.set()

    def arrive(self) -> None:
        """One category's window of shards exists (or it has no more to start: its stream is done or
        unreadable). A category's shards are counted together, or the one whose second shard was read
        first would take twice the other's share of the first slots."""
        self._missing -= 1
        if self._missing <= 0:
            self._all_in.set()

    async def wait(self) -> None:
        """Every shard's dispatcher waits here before its first request: until every category has
        begun (``begin_s`` at most), then ``patience_s`` at most from the last one's beginning."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_begun.wait(), self._begin_s)
            if not self._all_in.is_set():
                left = self._all_begun_at + self._patience_s - asyncio.get_running_loop().time()
                await asyncio.wait_for(self._all_in.wait(), max(left, 0.0))


def _settle(shards: set[asyncio.Task[None]]) -> None:
    """Take the finished shards out of ``shards``; a failed one's error is raised."""
    for finished in [shard for shard in shards if shard.done()]:
        shards.discard(finished)
        finished.result()


class SourceError(RuntimeError):
    """A category's prompt source could not be read (missing file, Hub unreachable, corrupt file)."""


class Pipeline:
    """Runs a session's categories; ``run_plain`` is the whole pipeline without an orchestrator."""

    def __init__(self, session: RunSession) -> None:
        self.session = session
        self._shards: dict[tuple[str, int], list[Ask | Reject]] = {}
        self._sent: dict[tuple[str, int], Callable[[], None]] = {}
        """What a shard calls once it has sent its last prompt (``run_category``'s window)."""
        self._start = StartLine(0)

    async def run_shard(self, category: str, index: int) -> None:
        """Pump one shard; its items were parked by ``run_category``."""
        items = self._shards.pop((category, index))
        run = self.session.categories.get(category)
        await pump_shard(
            items,
            limiter=self.session.limiter,
            category=run.config,
            sampling=run.sampling,
            sink=run.sink,
            patience=self.session.patience,
            demand=self.session.control.demand_for(
                category, run.sampling.max_tokens, self.session.categories.earlier_answers.get(category, ())
            ),
            before_first=self._start.wait,
            after_last=self._sent.pop((category, index), None),
            suspects=self.session.suspects,
            convicted=self.session.categories.convicted.get(category, set()),
        )

    def shard_window(self) -> int:
        """Shards sending per category: enough queued prompts to fill the limit across a shard boundary."""
        config = self.session.config
        limit = config.concurrency.ceiling * max(len(self.session.pool.endpoints), 1)
        size = config.store.shard_prompts
        return max(2, -(-limit // size) + 1)

    async def run_category(self, category: str, shard_runner: ShardRunner) -> None:
        """Stream the category's prompts into shards and run a few shards at once.

        The window counts the shards still sending prompts, not those that have sent them all and
        wait for their answers: counted, a shard waiting for its slowest answer (a slow endpoint's)
        held its place while the endpoints that had answered the rest idled (measured on simulators:
        two fast endpoints and one answering after 12 s, 128 of 300 prompts answered in those 12 s).
        Those waiting are at most as many as the prompts in flight.
        """
        self._start.begin()
        categories = self.session.categories
        run = categories.get(category)
        state = categories.states[category]
        part = categories.store.part
        items = category_items(run.config, state, run.counts, dedup=categories.dedup, part=part)
        size = self.session.config.store.shard_prompts
        window = self.shard_window()
        active: set[asyncio.Task[None]] = set()
        sending: set[int] = set()
        sent = asyncio.Event()

        def done_sending(shard: int, _ended: object = None) -> None:
            """Called with the shard's index when it sent its last prompt, and when its task ends
            (``_ended``: the task, from its done callback; one that failed before sending all)."""
            sending.discard(shard)
            sent.set()

        index = 0
        unreadable: SourceError | None = None
        arrived = False
        try:
            while True:
                try:
                    shard = await asyncio.to_thread(take, items, size)
                except MostlyRejected as error:
                    unreadable = SourceError(f"category {category}: {error}")
                    break
                except Exception as error:  # the shards already running still finish and are saved
                    unreadable = SourceError(f"category {category}: cannot read {run.config.source}: {error}")
                    break
                if not shard:
                    break
                self._shards[(category, index)] = shard
                self._sent[(category, index)] = functools.partial(done_sending, index)
                sending.add(index)
                task = asyncio.create_task(shard_runner(category, index))
                task.add_done_callback(functools.partial(done_sending, index))
                active.add(task)
                index += 1
                if len(sending) >= window and not arrived:
                    arrived = True
                    self._start.arrive()
                while len(sending) >= window:
                    sent.clear()
                    waiter = asyncio.create_task(sent.wait())
                    try:
                        await asyncio.wait({*active, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                    _settle(active)
                _settle(active)
            if not arrived:  # fewer shards than the window: all of them exist now
                arrived = True
                self._start.arrive()
            if active:
                await asyncio.gather(*active)
        finally:
            if not arrived:  # stopped by an error: nobody waits for this category
                self._start.arrive()
            for task in active:
                task.cancel()
            if active:
                await asyncio.gather(*active, return_exceptions=True)
        if unreadable is not None:
            raise unreadable

    async def run_categories(self, category_runner: CategoryRunner) -> None:
        """All categories at once: they share the limiter, so the endpoint never idles between them."""
        await asyncio.to_thread(self.session.categories.load_states)
        self._start = StartLine(len(self.session.config.categories))
        results = await asyncio.gather(
            *(category_runner(c.name) for c in self.session.config.categories), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        aborted = [f for f in failures if isinstance(f, RunAborted)]
        others = [f for f in failures if not isinstance(f, SourceError | RunAborted)]
        if aborted or others:
            raise (aborted or others)[0]
        if failures:  # only unreadable sources: the other categories ran to the end
            raise SourceError("; ".join(str(f) for f in failures))

    async def run_plain(self) -> None:
        """The pipeline without Prefect: same code path, no orchestrator (tests, `--no-prefect`)."""
        await self.run_categories(lambda name: self.run_category(name, self.run_shard))
