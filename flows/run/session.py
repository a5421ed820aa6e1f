"""What one pipeline run shares across categories and shards, and the order things open and close in.

A small coordinator: the endpoints (``EndpointPool``), the store, the categories, the limiter and
the background loops (flushing shards, probing lost endpoints, progress reports) each live in their
own module; the session opens them in order, runs their loops, and closes them so that every
finished row is on disk before the server is stopped. Plain async code: the Prefect flow and the
Prefect-free path both drive the same session, so everything that matters for correctness is
tested without an orchestrator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio

from flows.client.guard import Endpoint
from flows.config import RunConfig, fingerprint, fingerprinted
from flows.control.limiter import Limiter
from flows.control.wiring import Control
from flows.run.categories import Categories
from flows.run.endpoints import EndpointPool, SecretLoader
from flows.run.pump import Patience
from flows.run.suspects import SuspectGate
from flows.store.flusher import Flusher
from flows.store.parts import Part
from flows.store.run_store import RunStore

if TYPE_CHECKING:  # the plots module is loaded only when a report is drawn
    from flows.report.run_plots import Plots

log = logging.getLogger(__name__)

Reporter = Callable[["RunSession"], Awaitable[None] | None]
T = TypeVar("T")


def shielded() -> anyio.CancelScope:
    """A stop (the pipeline winding down; then flush, report, close) shielded from a cancel scope
    that keeps cancelling. Prefect's engine cancels a flow body through one (a lease it could not
    renew, a flow's timeout): the cancel came again at every await of the stop and cut the final
    flush (rows read, never written). Unbounded, as a stop is when nothing cancels it: a bound would
    cut a long final report of an uncancelled run too. A native cancel (SIGTERM's, Ctrl-C's, asked
    once) still goes through."""
    return anyio.CancelScope(shield=True)


class RunSession:
    """Use with ``async with``: opens the store (fingerprint checked); flushes every row at exit."""

    def __init__(
        self,
        config: RunConfig,
        *,
        force: bool = False,
        part: Part | None = None,
        report_every_s: float = 2.0,
        secrets: SecretLoader | None = None,
    ) -> None:
        self.config = config
        self.force = force
        self.store = RunStore(config.run_location, part)
        self.pool = EndpointPool(config, secrets)
        self.categories = Categories(config, self.store)
        self.started = time.monotonic()
        self.reporters: list[Reporter] = []
        self.resumed = False
        self.fingerprint = ""
        self.opened = False
        """The run directory was opened for this start (not refused: another config, another K)."""
        # The plots this start's Prefect report drew, for report.md to reuse (None: not drawn yet).
        self.drawn_plots: Plots | None = None
        self.patience = Patience(
            outage_s=config.retry.outage_patience_s, failover_s=config.retry.failover_after_s
        )
        self.suspects = SuspectGate()
        """The suspects' turns (prompts in flight at two server outages: ``suspects.py``), shared by the
        categories."""
        self._control: Control | None = None
        self._flusher = Flusher(self.categories.writers)
        self.report_every_s = report_every_s
        self._background: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        await self.pool.open()
        try:
            self.fingerprint = fingerprint(self.config, self.pool.model)
            self.resumed = await asyncio.to_thread(
                self.store.open_run,
                self.fingerprint,
                self.config.model_dump(mode="json"),
                force=self.force,
                fingerprinted=fingerprinted(self.config, self.pool.model),
                earlier=[fingerprint(self.config, self.pool.model, absolute_sources=True)],
            )
            self.opened = True
        except BaseException:
            await self.pool.aclose()
            raise
        self._control = Control(self.pool.endpoints, self.config.concurrency, self.config.run_dir)
        loops = (self._flusher.loop(), self.pool.probe_loop(), self._report_loop(), self._control.run())
        for loop in loops:
            self._background.append(asyncio.create_task(loop))
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Flush, report, close: every step runs even if one fails (the endpoints are always closed).

        When the run is already stopping for an error, a failure here (most often the same full disk
        failing the last flush) is logged at INFO and the first error stays the one the user reads.
        Shielded from a cancel scope cancelling the run (``shielded``).
        """
        with shielded():
            await self._close(exc)

    async def _close(self, exc: BaseException | None) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)  # a loop's failure: `guard`'s
        failures: list[Exception] = []
        for step in (self._flusher.drain, self.report, self._close_control, self.pool.aclose):
            try:
                await step()
            except Exception as error:
                failures.append(error)
        if failures and exc is None:
            raise failures[0]
        for failure in failures:
            log.info("while stopping after %s: %s", type(exc).__name__, failure)

    async def _close_control(self) -> None:
        if self._control is not None:
            await self._control.aclose()

    async def guard(self, work: Awaitable[T]) -> T:
        """Run ``work`` (the pipeline) while the background loops live; a loop that fails stops it.

        A loop fails when a shard or the timeline cannot be written (a full disk). Going on would send
        requests whose answers can only pile up in memory and be lost, so the work is cancelled at
        once and the loop's error is raised. (A loop may also end normally: a fixed limit has no
        controllers to run.)
        """
        job = asyncio.ensure_future(work)
        failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        def watch(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None and not failed.done():
                failed.set_result(task.exception())  # type: ignore[arg-type]

        for task in self._background:
            task.add_done_callback(watch)
        either: set[asyncio.Future[Any]] = {job, failed}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in self._background:
                task.remove_done_callback(watch)
            if not job.done():
                job.cancel()
                with shielded():
                    await asyncio.wait({job})
        if failed.done():
            if not job.cancelled():
                job.exception()  # what the cancel left it with follows from the loop's error
            raise failed.result()
        failed.cancel()
        return job.result()

    @property
    def control(self) -> Control:
        if self._control is None:
            raise RuntimeError("the session is not open: use `async with RunSession(...)`")
        return self._control

    async def flush(self) -> None:
        """Write every buffered row now (a shard each), and the controller's timeline: afterwards the
        files hold all the run made. The Prefect report draws its plots from them before the session
        closes; without the timeline a run shorter than its half-minute write drew no controller
        plot (the demo's) while ``report.md`` linked one."""
        await self._flusher.settle()
        for writer in self.categories.writers():
            rows = writer.take()
            if rows:
                await asyncio.to_thread(writer.write, rows)
        if self._control is not None:
            await asyncio.to_thread(self._control.timeline.write)

    def concurrency_summary(self) -> dict[str, Any]:
        """What the controller did (empty when the run stopped before its limiter was built)."""
        return self._control.summary() if self._control is not None else {}

    @property
    def limiter(self) -> Limiter[Endpoint]:
        return self.control.limiter

    @property
    def model(self) -> str:
        return self.pool.model

    async def report(self) -> None:
        for reporter in self.reporters:
            try:
                result = reporter(self)
                if result is not None:
                    await result
            except Exception:  # a broken progress display must never stop the data
                log.warning("progress reporter failed", exc_info=True)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.report_every_s)
            await self.report()

    def elapsed_s(self) -> float:
        """Seconds since the first prompt was read (orchestrator start-up is not generation time)."""
        return time.monotonic() - (self.categories.loaded_at or self.started)

    def snapshot(self) -> dict[str, Any]:
        """Numbers for progress displays and artifacts."""
        tallies = self.categories.tallies().values()
        return {
            "rows": sum(t.rows for t in tallies),
            "rejects": sum(t.rejects for t in tallies),
            "queued": sum(t.queued for t in tallies),
            "completion_tokens": sum(t.completion_tokens for t in tallies),
            "in_flight": self._control.limiter.in_flight if self._control else 0,
            "elapsed_s": self.elapsed_s(),
            "endpoints": self._control.endpoints_view() if self._control else [],
        }
