"""What one pipeline run shares across categories and shards: store, clients, limiter, sinks, tallies.

Plain async code: the Prefect flow and the Prefect-free path both drive the same session, so
everything that matters for correctness is tested without an orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from flows.client import EndpointClient, RetryPolicy
from flows.concurrency import FixedLimit, Lane, Limiter
from flows.config import CategoryConfig, RunConfig, fingerprint
from flows.health import Endpoint, EndpointGuard, GuardedLimit
from flows.prompt_stream import Reject, StreamCounts
from flows.pump import CategorySink, Patience, Tally
from flows.sampling import SamplingParams
from flows.store import CategoryState, RunStore, ShardWriter
from prompts.dedup import DedupIndex
from prompts.records import PromptRecord
from sglang_launch.engine import Engine, LaunchedEngine
from sglang_launch.server_config import SERVER_LOGS, ServerConfig

log = logging.getLogger(__name__)

FLUSH_POLL_S = 0.25
"""How often due shards are looked for: rows reach disk within flush_seconds + this."""

PROBE_S = 5.0
"""How often an endpoint that was given up on is checked again."""

Reporter = Callable[["RunSession"], Awaitable[None] | None]


class ConfigProblem(RuntimeError):
    """The run cannot start as configured (no model served, unreadable key): say so, spend nothing."""


@dataclass
class CategoryRun:
    """One category's live state in this run."""

    config: CategoryConfig
    sampling: SamplingParams
    sink: CategorySink
    counts: StreamCounts = field(default_factory=StreamCounts)


def sampling_for(config: RunConfig, category: CategoryConfig) -> SamplingParams:
    generation = config.generation_for(category)
    # generation_for merges over DEFAULT_GENERATION, which sets these three
    assert generation.max_tokens is not None and generation.temperature is not None
    assert generation.top_p is not None
    return SamplingParams(
        max_tokens=generation.max_tokens,
        temperature=generation.temperature,
        top_p=generation.top_p,
        chat_template_kwargs=generation.chat_template_kwargs,
        separate_reasoning=generation.separate_reasoning,
        extra_body=dict(generation.extra_body or {}),
    )


def _api_key(env_name: str | None) -> str | None:
    if env_name is None:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise ConfigProblem(f"api_key_env names {env_name}, but that environment variable is empty or unset")
    return key


class RunSession:
    """Use with ``async with``: opens the store (fingerprint checked); flushes every row at exit."""

    def __init__(
        self,
        config: RunConfig,
        *,
        force: bool = False,
        report_every_s: float = 2.0,
    ) -> None:
        self.config = config
        self.force = force
        self.store = RunStore(config.run_dir)
        self.started = time.monotonic()
        self.categories: dict[str, CategoryRun] = {}
        self.shards: dict[tuple[str, int], list[PromptRecord | Reject]] = {}
        self.states: dict[str, CategoryState] = {}
        self.pipeline_started: float | None = None
        self.dedup = DedupIndex()
        self.reporters: list[Reporter] = []
        self.resumed = False
        self.model = ""
        self.fingerprint = ""
        self._report_every_s = report_every_s
        self._clients: list[EndpointClient] = []
        self._background: list[asyncio.Task[None]] = []
        self._writing: asyncio.Future[Path | None] | None = None
        self.limiter: Limiter[Endpoint] | None = None
        self.patience = Patience()
        self.endpoints: list[Endpoint] = []
        self.engine: LaunchedEngine | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        try:
            targets = await self._targets()
            retry = self.config.retry
            policy = RetryPolicy(
                max_attempts=retry.max_attempts,
                initial_wait_s=retry.initial_wait_s,
                max_wait_s=retry.max_wait_s,
                max_total_s=retry.max_total_s,
            )
            for url, model, key_env, stream, engine in targets:
                client = EndpointClient(
                    url,
                    model,
                    _api_key(key_env),
                    stream=stream,
                    read_timeout_s=retry.read_timeout_s,
                    retry=policy,
                )
                self._clients.append(client)
                guard = EndpointGuard(url, engine, patience_s=retry.outage_patience_s)
                self.endpoints.append(Endpoint(client, guard))
            self.model = await self._resolve_model()
            self.fingerprint = fingerprint(self.config, self.model)
            self.resumed = await asyncio.to_thread(
                self.store.open_run,
                self.fingerprint,
                self.config.model_dump(mode="json"),
                force=self.force,
            )
        except BaseException:
            await self._close()
            raise
        limit = self.config.concurrency.limit
        self.limiter = Limiter([Lane(e, GuardedLimit(FixedLimit(limit), e.guard)) for e in self.endpoints])
        for endpoint in self.endpoints:
            endpoint.guard.on_up = self.limiter.notify
        self.patience = Patience(outage_s=retry.outage_patience_s, failover_s=retry.failover_after_s)
        self._background.append(asyncio.create_task(self._flush_loop()))
        self._background.append(asyncio.create_task(self._probe_loop()))
        self._background.append(asyncio.create_task(self._report_loop()))
        return self

    async def _targets(self) -> list[tuple[str, str | None, str | None, bool, Engine | None]]:
        """(url, model, api-key env name, stream, engine) per endpoint; launches ``[server]`` first."""
        targets: list[tuple[str, str | None, str | None, bool, Engine | None]] = []
        server = self.config.server
        if server is not None and server.launch:
            if server.log_dir == ServerConfig.model_fields["log_dir"].default:
                server = server.model_copy(update={"log_dir": self.config.run_dir / SERVER_LOGS})
            self.engine = LaunchedEngine(server)
            await asyncio.to_thread(self.engine.ensure_running)
            targets.append((self.engine.url, server.served_model_name, server.api_key_env, True, self.engine))
        for endpoint in self.config.endpoints:
            targets.append((endpoint.url, endpoint.model, endpoint.api_key_env, endpoint.stream, None))
        return targets

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writing is not None:
            await self._writing
        self.flush()
        await self.report()
        await self._close()

    async def _close(self) -> None:
        """Close the clients, then stop the server this run launched (never one it did not)."""
        for client in self._clients:
            await client.aclose()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)

    async def _resolve_model(self) -> str:
        models = []
        for client in self._clients:
            models.append(client.model or await client.detect_model())
        if len(set(models)) > 1:
            raise ConfigProblem(f"the endpoints serve different models: {sorted(set(models))}")
        return models[0]

    # -- categories ------------------------------------------------------------------------------
    def category(self, name: str) -> CategoryRun:
        if name not in self.categories:
            cfg = self.config.category(name)
            store = self.config.store
            sink = CategorySink(
                rows=self.store.row_writer(
                    name, flush_rows=store.flush_rows, flush_seconds=store.flush_seconds
                ),
                rejects=self.store.reject_writer(
                    name, flush_rows=store.flush_rows, flush_seconds=store.flush_seconds
                ),
                tally=Tally(),
            )
            self.categories[name] = CategoryRun(cfg, sampling_for(self.config, cfg), sink)
        return self.categories[name]

    def load_states(self) -> None:
        """Read what every category already has, and claim its prompts for cross-category dedup.

        All categories are read before any streams, so a prompt already answered in one category is
        never asked again in another on resume, whatever order the categories then run in.
        """
        self.pipeline_started = time.monotonic()
        for category in self.config.categories:
            state = self.store.category_state(category.name)
            self.states[category.name] = state
            for key in state.prompt_hashes:
                self.dedup.claim(key, category.name)

    def tallies(self) -> dict[str, Tally]:
        return {name: run.sink.tally for name, run in self.categories.items()}

    # -- background ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every buffered row now (at exit, after the flush loop has stopped)."""
        for writer in self._writers():
            writer.flush()

    def _writers(self) -> list[ShardWriter]:
        return [w for run in self.categories.values() for w in (run.sink.rows, run.sink.rejects)]

    async def _flush_loop(self) -> None:
        """Write due shards in a worker thread, so an fsync never pauses the streams being read.

        Each write is shielded: cancelling the loop at shutdown lets a shard being written finish
        (``__aexit__`` waits for it) instead of leaving its rows neither buffered nor on disk.
        """
        while True:
            await asyncio.sleep(FLUSH_POLL_S)
            for writer in self._writers():
                if writer.due():
                    self._writing = asyncio.ensure_future(asyncio.to_thread(writer.write, writer.take()))
                    await asyncio.shield(self._writing)

    async def _probe_loop(self) -> None:
        """Put endpoints that were given up on back in service when they answer again."""
        while True:
            await asyncio.sleep(PROBE_S)
            for endpoint in self.endpoints:
                await endpoint.guard.probe()

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
            await asyncio.sleep(self._report_every_s)
            await self.report()

    def elapsed_s(self) -> float:
        """Seconds since the first prompt was read (orchestrator start-up is not generation time)."""
        return time.monotonic() - (self.pipeline_started or self.started)

    def snapshot(self) -> dict[str, Any]:
        """Numbers for progress displays and artifacts."""
        tallies = self.tallies()
        return {
            "rows": sum(t.rows for t in tallies.values()),
            "rejects": sum(t.rejects for t in tallies.values()),
            "queued": sum(t.queued for t in tallies.values()),
            "completion_tokens": sum(t.completion_tokens for t in tallies.values()),
            "in_flight": self.limiter.in_flight if self.limiter else 0,
            "elapsed_s": self.elapsed_s(),
        }
