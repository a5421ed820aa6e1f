"""The Prefect face of the pipeline: one flow run per pipeline run, a subflow per category, a task per shard.

Never a task per request: requests are asyncio inside a shard task. Task results are not persisted
or cached: the checkpoint store is the only source of truth for what is done, so re-running the
same command resumes from the store whatever Prefect remembers. If Prefect fails around a flow
(its API gone), the same pipeline goes on without it (``link.orchestrated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger, tags, task
from prefect.artifacts import Artifact, MarkdownArtifact, ProgressArtifact, TableArtifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.context import FlowRunContext, TagsContext
from prefect.flow_engine import run_flow_async

from flows.orchestration.link import PrefectLink, Unit, discard_prefect_backlog, orchestrated, track
from flows.orchestration.runs import Earlier, run_tag, settle_earlier_runs
from flows.report.live import Rates, RunEvents, category_table, endpoint_table, run_progress
from flows.report.status import RunStatus, run_status
from flows.report.summary import report_with_plots, run_summary
from flows.run.pipeline import Pipeline, ShardRunner
from flows.run.session import RunSession
from prompts.readers import count_rows

ARTIFACT_EVERY_S = 3.0
log = logging.getLogger(__name__)


class _Card:
    """One artifact key in the UI: created once, then updated in place (never a new card per tick)."""

    def __init__(self) -> None:
        self.id: UUID | None = None

    async def put(self, artifact: Artifact) -> None:
        if self.id is None:
            self.id = (await artifact.acreate()).id
            return
        update = ArtifactUpdate(data=await artifact.aformat(), description=artifact.description)
        async with get_client() as client:
            await client.update_artifact(artifact_id=self.id, artifact=update)


class _LiveView:
    """The run's artifacts (progress, endpoints, a table per category) and its run-level log lines.

    Written every few seconds from the session's counters, never per request: artifacts are API
    writes. A failed write (the API restarting) is logged and retried at the next tick; it never
    touches the data.
    """

    def __init__(self, session: RunSession, link: PrefectLink | None) -> None:
        self.session = session
        self.link = link
        self.key = _key(session)
        self.cards: dict[str, _Card] = {}
        self.rates = Rates()
        self.category_rates: dict[str, Rates] = {}
        """Each category's own window: its card shows its tok/s, not the run's."""
        self.events = RunEvents()
        self.source_rows: dict[str, int | None] | None = None

    async def adopt(self, flow_run_id: UUID) -> None:
        """Continue the cards a flow run retried in place already has (one card per key, every start)."""
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            )
        prefix = f"{self.key}-"
        for artifact in found:  # oldest first: the newest of a key wins
            if artifact.key and artifact.key.startswith(prefix):
                name = artifact.key[len(prefix) :]
                self._card(self._names.get(name, name)).id = artifact.id

    @property
    def _names(self) -> dict[str, str]:
        """Card names by key suffix (a category's key is its slug)."""
        return {_slug(c.name): c.name for c in self.session.config.categories}

    def _card(self, key: str) -> _Card:
        return self.cards.setdefault(key, _Card())

    async def tick(self, *, finished: bool = False, status: RunStatus | None = None) -> None:
        if self.link is not None and self.link.down:  # said once already; try again when it answers
            return
        session = self.session
        if self.source_rows is None:
            categories = session.config.categories
            self.source_rows = await asyncio.to_thread(
                lambda: {c.name: count_rows(c.source) for c in categories}
            )
        snap = session.snapshot()
        self.rates.add(snap["rows"] + snap["rejects"], snap["completion_tokens"])
        per_s, tok_s = self.rates.per_s()
        progress = run_progress(session, per_s, finished=finished, source_rows=self.source_rows)
        key = self.key
        await self._card("progress").put(
            ProgressArtifact(
                key=f"{key}-progress", progress=progress.percent, description=progress.description
            )
        )
        for name, run in list(session.categories.runs.items()):
            rates = self.category_rates.setdefault(name, Rates())
            rates.add(run.sink.tally.rows + run.sink.tally.rejects, run.sink.tally.completion_tokens)
            disk = None if status is None else next((c for c in status.categories if c.name == name), None)
            await self._card(name).put(
                TableArtifact(
                    key=f"{key}-{_slug(name)}",
                    table=category_table(session, name, None if finished else rates.per_s()[1], disk),
                    description=f"category {name}" + (" (final, read from the files)" if disk else " (live)"),
                )
            )
        endpoints = endpoint_table(session)
        if endpoints:
            await self._card("endpoints").put(
                TableArtifact(
                    key=f"{key}-endpoints",
                    table=endpoints,
                    description=f"endpoints: {snap['in_flight']} in flight, {tok_s:,.0f} output tok/s now",
                )
            )
        for line in self.events.look(session):
            _events().info("%s", line)

    async def loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.warning("could not update the Prefect artifacts", exc_info=True)
            await asyncio.sleep(ARTIFACT_EVERY_S)

    async def finish(self, completed: bool) -> None:
        """Every row on disk, then the final cards from the files (the numbers `datagen status` prints)."""
        if self.link is not None and self.link.down:
            return
        try:
            await self._finish(completed)
        except Exception:
            log.warning("could not write the final artifacts", exc_info=True)

    async def _finish(self, completed: bool) -> None:
        session = self.session
        await session.flush()
        status = await asyncio.to_thread(run_status, session.store)
        await self.tick(finished=completed, status=status)
        summary = run_summary(session, status)
        report, session.drawn_plots = await asyncio.to_thread(
            report_with_plots, session.config.run_dir, summary
        )
        await self._card("report").put(
            MarkdownArtifact(key=f"{self.key}-report", markdown=report, description="run report")
        )
        _events().info(
            "run %s %s: %d rows and %d rejects on disk (%d and %d in this start)",
            session.config.run.name,
            "finished" if completed else "stopped",
            status.rows,
            status.rejects,
            summary["rows"],
            summary["rejects"],
        )


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _events() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """Run-level events: Prefect's run logger (INFO reaches the UI; the terminal shows warnings only)."""
    try:
        return get_run_logger()
    except Exception:  # outside a flow run (the API was lost): the module logger
        return log


def _slug(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())


def _key(session: RunSession) -> str:
    """The run's artifact keys: each part of a split run has its own cards (``<run>-part-2-of-4-...``)."""
    return _slug(_flow_run_name(session))


def _flow_run_name(session: RunSession) -> str:
    part = session.store.part
    return session.config.run.name + (f"-{part.label}" if part is not None else "")


class _Units:
    """This run's flow bodies by key: Prefect parameters stay small strings, the objects stay here."""

    def __init__(self) -> None:
        self._units: dict[str, Unit] = {}

    def key(self, unit: Unit) -> str:
        key = uuid.uuid4().hex
        self._units[key] = unit
        return key

    def pop(self, key: str) -> Unit:
        return self._units.pop(key)


SigtermHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _own_sigterm(handler: SigtermHandler) -> None:
    """Put the run's SIGTERM handling back inside a flow body Prefect's engine just entered.

    Prefect swaps SIGTERM, for each flow run and subflow, for a handler that raises
    ``TerminationSignal`` in whatever code runs when the signal lands (a request task, a shard
    write): a traceback per task, runs marked crashed mid-step. The run's own stop
    (``sigterm_stops_run``, in ``datagen run`` and in a deployment's firing: its task is cancelled, as
    for Ctrl-C, and everything read is flushed) is the handler that was there before the flow
    started; Prefect restores its saved one when the body ends.
    """
    if handler is not None:
        signal.signal(signal.SIGTERM, handler)


def _datagen_flow(
    pipeline: Pipeline, link: PrefectLink, history: list[str], continuing: bool, sigterm: SigtermHandler
) -> Any:
    """The run's flow, its category subflow and shard task, closed over this run's pipeline.

    The live objects (clients, store, limiter) stay in this process and out of Prefect's parameters,
    which are JSON stored by the API: flows and tasks only pass names, indexes and keys.
    """
    session = pipeline.session
    units = _Units()

    @task(name="shard", cache_policy=NO_CACHE, persist_result=False, task_run_name="{category}-shard-{index}")
    async def shard_task(category: str, index: int) -> None:
        await pipeline.run_shard(category, index)

    @flow(name="category", flow_run_name="{category}", persist_result=False, validate_parameters=False)
    async def category_flow(category: str, unit_key: str) -> None:
        _own_sigterm(sigterm)
        await track(units.pop(unit_key), pipeline.run_category(category, cast(ShardRunner, shard_task)))
        _events().info("%s", RunEvents.category_line(category, session.categories.get(category)))

    started: list[bool] = []

    async def category(name: str) -> None:
        """A category as a Prefect subflow, or without Prefect once its API is gone."""
        if not started:  # the done-sets are read: say how the run starts, once
            started.append(True)
            _events().info("%s", RunEvents.start_line(session))
        await orchestrated(
            link,
            lambda unit: category_flow(name, units.key(unit)),
            lambda: pipeline.run_category(name, pipeline.run_shard),
        )

    @flow(name="datagen", flow_run_name="{run_name}", persist_result=False, validate_parameters=False)
    async def datagen_flow(run_name: str, unit_key: str) -> dict[str, Any]:
        _own_sigterm(sigterm)
        for line in history:
            _events().info("%s", line)
        view = _LiveView(session, link)
        context = FlowRunContext.get()
        if continuing and context is not None and context.flow_run is not None:
            try:
                await view.adopt(context.flow_run.id)
            except Exception:
                log.warning("could not read the flow run's artifacts", exc_info=True)
        updater = asyncio.create_task(view.loop())
        try:
            # the run's tag stays on this flow run: a tagged task run asks the API for tag concurrency
            # slots, which fails the task when the API is gone
            with TagsContext(current_tags=set()):
                await track(units.pop(unit_key), pipeline.run_categories(category))
        except Exception:
            await _stop(updater)
            await view.finish(completed=False)
            raise
        except BaseException:  # a stop (SIGTERM, Ctrl-C): no tick may race Prefect closing its clients
            await _stop(updater)
            raise
        await _stop(updater)
        await view.finish(completed=True)
        return session.snapshot()

    return datagen_flow, units


async def run_with_prefect(session: RunSession, link: PrefectLink, part: str | None = None) -> None:
    """The run as a Prefect flow run; if Prefect fails around it, the data path goes on without.

    Earlier flow runs of the run directory left Running by a killed process are marked Crashed first,
    and a start after a crash runs in that same flow run (see ``flows/orchestration/runs.py``). Inside a
    deployment's flow run (``datagen deploy``) the run is a subflow of it and names what it continues.
    """
    tag = run_tag(session.config.run_dir, part)
    inside = FlowRunContext.get() is not None
    earlier: Earlier | None = None
    try:
        earlier = await settle_earlier_runs(tag, reuse=not inside)
    except Exception:
        log.warning("could not read this run's earlier flow runs", exc_info=True)
    pipeline = Pipeline(session)
    continuing = earlier is not None and earlier.continue_in is not None
    sigterm = signal.getsignal(signal.SIGTERM)
    datagen_flow, units = _datagen_flow(pipeline, link, _history(earlier), continuing, sigterm)
    watcher = asyncio.create_task(link.watch())

    async def start(unit: Unit) -> object:
        parameters = {"run_name": _flow_run_name(session), "unit_key": units.key(unit)}
        with tags(tag):
            if earlier is not None and earlier.continue_in is not None:
                return await run_flow_async(datagen_flow, flow_run=earlier.continue_in, parameters=parameters)
            return await datagen_flow(**parameters)

    try:
        await orchestrated(link, start, pipeline.run_plain)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if link.down:  # undeliverable: Prefect would retry each at exit, for minutes
            discard_prefect_backlog()


def _history(earlier: Earlier | None) -> list[str]:
    """Log lines that tie this start to the flow runs before it."""
    if earlier is None:
        return []
    lines = [
        f"flow run {run_id} was left Running by a dead process: marked Crashed" for run_id in earlier.crashed
    ]
    if earlier.continue_in is not None:
        lines.append(f"retrying flow run {earlier.continue_in.id} in place: resuming from the files")
    elif earlier.latest is not None:
        state = earlier.latest.state.name if earlier.latest.state is not None else "unknown"
        lines.append(f"continues flow run {earlier.latest.id} ({earlier.latest.name}, {state})")
    return lines
