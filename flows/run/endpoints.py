"""The run's servers: launched by the run or given in the config, each with its client and guard.

Opening the pool is where a run first touches the network: it starts ``[server]`` when asked, builds
one client per endpoint, reads which model they serve (``flows.run.served``), and closes what it opened
(clients, and the server it launched, never one it did not) on the way out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from flows.client.endpoint import EndpointClient, RetryPolicy
from flows.client.guard import Endpoint, EndpointGuard
from flows.config import RunConfig
from flows.run.served import ModelsDiffer, ServedModel, first_answers, not_answering, run_model
from flows.say import SAY
from sglang_launch.engine import Engine, LaunchedEngine
from sglang_launch.placement import Placement
from sglang_launch.server_config import SERVER_LOGS, ServerConfig

log = logging.getLogger(__name__)

PROBE_S = 5.0
"""How often an endpoint that was given up on is checked again."""


class ConfigProblem(RuntimeError):
    """The run cannot start as configured (no model served, unreadable key): say so, spend nothing."""


SecretLoader = Callable[[str], Awaitable[str]]
"""A Prefect Secret block's name -> its value. Given by the orchestration room (the only one that
imports Prefect); None for a run without Prefect."""


@dataclass(frozen=True)
class Target:
    """One server to send to, before a client exists for it."""

    url: str
    model: str | None
    api_key_env: str | None
    stream: bool
    engine: Engine | None
    api_key_secret: str | None = None
    ca_bundle: str | None = None
    vram: str | None = None
    gpus: frozenset[int] | None = None
    placement: Callable[[], Placement] | None = None


async def _api_key(target: Target, secrets: SecretLoader | None) -> str | None:
    """The target's key, from its env var or its Prefect Secret block; a key that cannot be read is a
    ConfigProblem whose message names where it was looked for, never a value."""
    if target.api_key_secret is not None:
        name = target.api_key_secret
        if secrets is None:
            raise ConfigProblem(
                f"the API key of {target.url} is in the Prefect Secret block {name!r} (api_key_secret), but "
                "this run has no Prefect (--no-prefect, or its API did not answer): run with Prefect, "
                "or name an environment variable with api_key_env"
            )
        try:
            return await secrets(name)
        except Exception as error:
            raise ConfigProblem(
                f"cannot read the API key of {target.url} from the Prefect Secret block {name!r}: "
                f"{type(error).__name__}: {error}"
            ) from None
    if target.api_key_env is None:
        return None
    key = os.environ.get(target.api_key_env)
    if not key:
        raise ConfigProblem(
            f"api_key_env names {target.api_key_env}, but that environment variable is empty or unset"
        )
    return key


class EndpointPool:
    """Every endpoint of a run; ``open`` connects, ``aclose`` releases. ``model`` is what they serve."""

    def __init__(self, config: RunConfig, secrets: SecretLoader | None = None) -> None:
        self.config = config
        self.secrets = secrets
        self.endpoints: list[Endpoint] = []
        self.engine: LaunchedEngine | None = None
        self.model = ""

    async def open(self) -> None:
        """Launch ``[server]`` if asked, build a client and a guard per endpoint, resolve the model."""
        try:
            retry = self.config.retry
            policy = RetryPolicy(
                max_attempts=retry.max_attempts,
                initial_wait_s=retry.initial_wait_s,
                max_wait_s=retry.max_wait_s,
                max_total_s=retry.max_total_s,
            )
            for target in await self._targets():
                key = await _api_key(target, self.secrets)
                client = EndpointClient(
                    target.url,
                    target.model,
                    key,
                    stream=target.stream,
                    read_timeout_s=retry.read_timeout_s,
                    ca_bundle=target.ca_bundle,
                    retry=policy,
                )
                guard = EndpointGuard(
                    target.url,
                    target.engine,
                    patience_s=retry.outage_patience_s,
                    ca_bundle=target.ca_bundle,
                    api_key=key,
                )
                self.endpoints.append(Endpoint(client, guard, target.vram, target.gpus, target.placement))
            self.model = await self._resolve_model()
        except BaseException:
            await self.aclose()
            raise

    async def _targets(self) -> list[Target]:
        """The servers to use, in config order; launches ``[server]`` first."""
        targets: list[Target] = []
        server = self.config.server
        if server is not None and server.launch:
            if server.log_dir == ServerConfig.model_fields["log_dir"].default:
                server = server.model_copy(update={"log_dir": self.config.run_dir / SERVER_LOGS})
            self.engine = LaunchedEngine(server)
            await asyncio.to_thread(self.engine.ensure_running)
            # its GPUs are found by the OOM guard's lookup by port (the server is this process's
            # child), else where the run placed it (in a container NVML lists host pids): asked
            # there, of the server serving then, and by no run without an OOM guard
            targets.append(
                Target(
                    self.engine.url,
                    server.served_model_name,
                    server.api_key_env,
                    False,
                    self.engine,
                    placement=self.engine.placement,
                )
            )
        for endpoint in self.config.endpoints:
            targets.append(
                Target(
                    endpoint.url,
                    endpoint.model,
                    endpoint.api_key_env,
                    endpoint.stream,
                    engine=None,
                    api_key_secret=endpoint.api_key_secret,
                    ca_bundle=endpoint.ca_bundle,
                    vram=endpoint.vram,
                    gpus=frozenset(endpoint.gpus) if endpoint.gpus is not None else None,
                )
            )
        return targets

    async def _resolve_model(self) -> str:
        """The run's model (``flows.run.served``); the endpoints that do not answer are left out until
        they answer and list it, each said once; every endpoint is checked again when it comes back."""
        configured = {e.client.model for e in self.endpoints if e.client.model is not None}
        if len(configured) > 1:  # said before anything is asked
            raise ConfigProblem(f"the endpoints serve different models: {sorted(configured)}")
        listings = await first_answers(self.endpoints, self.config.retry.outage_patience_s)
        try:
            model = run_model(listings)
        except ModelsDiffer as error:
            raise ConfigProblem(str(error)) from None
        answering = sum(entry.down is None for entry in listings)
        for entry in listings:
            served = ServedModel(entry.endpoint, model, configured=entry.endpoint.client.model is not None)
            entry.endpoint.client.use_model(model)
            entry.endpoint.guard.admit = served.admit
            if entry.down is None:
                served.check(entry.models)
                continue
            entry.endpoint.guard.leave_out()
            log.warning(
                "%s: the run starts on the %d other endpoint(s); it joins when it answers%s",
                not_answering(entry),
                answering,
                "" if served.configured else f" and lists {model}",
                extra=SAY,
            )
        return model

    async def probe_loop(self) -> None:
        """Put endpoints that were given up on back in service when they answer again.

        All at once: a silent host's check lasts its whole timeout (5 s), so one after another, each
        silent host ahead of a returning one kept it out of service 5 s longer.
        """
        while True:
            await asyncio.sleep(PROBE_S)
            await asyncio.gather(*(endpoint.guard.probe() for endpoint in self.endpoints))

    @property
    def restarts(self) -> int:
        return sum(e.guard.restarts for e in self.endpoints)

    async def aclose(self) -> None:
        """Close the clients, then stop the server this run launched (never one it did not)."""
        for endpoint in self.endpoints:
            await endpoint.client.aclose()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
