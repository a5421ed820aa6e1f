"""The one shared client per endpoint: send a chat request, retry what is worth retrying.

One ``openai.AsyncOpenAI`` (with the SDK's own retries off) over one aiohttp connection pool sized
for thousands of in-flight requests: a run keeps the server's KV cache full for hours, and a
client per request (as SpecForge's script does) pays a TCP/TLS setup and a pool per prompt.

The client's CPU per request is what bounds one orchestrator core driving a fleet
(``bench/client_cpu.py``), so the hot path takes the SDK's cheap roads: the aiohttp transport
(httpx's pool bookkeeping grew with the number of pooled connections and took about a third of the
client's time), and ``post`` with ``cast_to=object``, which sends our own JSON body without the
SDK's per-request parameter transformation and hands back the parsed JSON without building models
(``flows.client.responses`` reads dicts and SDK objects alike). The SDK still does what we keep it
for: headers and auth, the status-code errors, and SSE decoding with in-stream error events.
Retries live here, with tenacity, because only here is the failure known precisely enough
(``flows.client.errors``) to tell "try again" from "reject the prompt" from "stop the run".

Timeouts: connecting is short, but a single read may legitimately wait a long time (a non-streamed
60k-token reasoning answer sends nothing until it is done), so the read timeout defaults to an
hour instead of the SDK's 600 s, which would kill exactly the longest, most valuable answers.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx
import httpx2
import openai
from openai import AsyncStream
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_random_exponential,
)

from flows.client.errors import FatalEndpointError, RequestError, TransientRequestError, classify
from flows.client.responses import Generation, StreamAccumulator, generation_from_completion
from flows.client.sampling import SamplingParams
from sglang_launch.probe import tls_context

T = TypeVar("T")
OnAttemptFailed = Callable[[TransientRequestError], None]

# Sent when the server needs no key: without it the SDK would fall back to $OPENAI_API_KEY and
# hand a real OpenAI key to a self-hosted server.
_NO_KEY = "EMPTY"
# The exception families a request can raise; anything else is a bug and must surface as one.
# Both httpx generations: the SDK runs on httpx2 and converts injected (legacy) httpx clients;
# aiohttp's own errors can escape the transport's mapping while a body is read.
_REQUEST_FAILURES = (openai.OpenAIError, httpx.HTTPError, httpx2.HTTPError, aiohttp.ClientError, RequestError)
# Chat requests carry the bearer key (the SDK's resource methods ask for it the same way).
_CHAT_OPTIONS: Any = {"security": {"bearer_auth": True}}


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry transient failures.

    Waits are exponential with full jitter (uniform in [0, initial * 2**n], capped at
    ``max_wait_s``): when a full queue rejects hundreds of requests at once, they must not all
    come back at the same instant. ``max_total_s`` (None: no limit) stops retrying once that long
    has passed since the first attempt began; it is off by default because a long answer cut
    after many minutes still deserves its retries, and ``max_attempts`` already ends the loop.
    """

    max_attempts: int = 6
    initial_wait_s: float = 1.0
    max_wait_s: float = 60.0
    max_total_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def retrying(self) -> AsyncRetrying:
        """A fresh tenacity controller for one call (tenacity keeps per-call state in it)."""
        deadline = stop_never if self.max_total_s is None else stop_after_delay(self.max_total_s)
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts) | deadline,
            wait=wait_random_exponential(multiplier=self.initial_wait_s, max=self.max_wait_s),
            retry=retry_if_exception_type(TransientRequestError),
            reraise=True,
        )


class EndpointClient:
    """Chat completions against one OpenAI-compatible endpoint (SGLang, vLLM, the simulator)."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key: str | None,
        *,
        stream: bool = True,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 3600.0,
        max_connections: int = 4096,
        ca_bundle: str | None = None,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        on_attempt_failed: OnAttemptFailed | None = None,
    ) -> None:
        self._endpoint = _server_root(base_url)
        self._model = model
        self._api_key = api_key
        self._ca_bundle = ca_bundle
        self._stream = stream
        self._retry = retry or RetryPolicy()
        self._on_attempt_failed = on_attempt_failed
        self._model_lock = asyncio.Lock()
        # Write and pool waits get the read allowance: a pool wait only means the controller let
        # more requests in flight than connections, and that must queue, not fail prompts.
        timeout = httpx2.Timeout(read_timeout_s, connect=connect_timeout_s)
        if http_client is None:
            # ``max_connections`` bounds the pool (the limiter bounds what is in flight); the SSL
            # context trusts ``ca_bundle`` alone when one is given, else the system's CAs.
            pool = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
            http_client = openai.DefaultAioHttpClient(
                limits=pool,
                timeout=timeout,
                verify=tls_context(ca_bundle),
            )
        # This SDK is typed for httpx2 but converts httpx (legacy) clients, as the tests inject.
        self._openai = openai.AsyncOpenAI(
            base_url=f"{base_url.rstrip('/').removesuffix('/v1')}/v1",
            api_key=api_key or _NO_KEY,
            max_retries=0,
            timeout=cast(Any, timeout),
            http_client=cast(Any, http_client),
        )

    def __repr__(self) -> str:
        return f"EndpointClient(endpoint={self._endpoint!r}, model={self._model!r}, stream={self._stream})"

    @property
    def endpoint(self) -> str:
        """The server's base URL for output rows: no ``/v1``, no credentials."""
        return self._endpoint

    @property
    def api_key(self) -> str | None:
        """For the other readers of this server (load signals); never logged or written."""
        return self._api_key

    @property
    def ca_bundle(self) -> str | None:
        """The CA file this endpoint's certificate is checked against (None: the system's CAs)."""
        return self._ca_bundle

    @property
    def model(self) -> str | None:
        """The served model name, once configured or detected."""
        return self._model

    async def detect_model(self) -> str:
        """The first model id from ``GET /v1/models`` (remembered for later requests)."""
        self._model = await self._with_retries(lambda _attempt: self._first_model_id())
        return self._model

    async def generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> Generation:
        """One assistant turn for ``messages``, retried on transient failures.

        Raises ``PermanentRequestError`` (reject the prompt) or ``FatalEndpointError`` (stop the
        run) at once, and ``TransientRequestError`` once retries are spent; every error carries
        the number of attempts made.
        """
        model = await self._resolved_model()
        request = _request_kwargs(model, messages, tools, sampling)
        return await self._with_retries(lambda attempt: self._generate_once(request, attempt))

    async def aclose(self) -> None:
        """Close the connection pool (also an injected one)."""
        await self._openai.close()

    async def _resolved_model(self) -> str:
        if self._model is not None:
            return self._model
        async with self._model_lock:  # thousands of first requests must not each ask /v1/models
            return self._model if self._model is not None else await self.detect_model()

    async def _first_model_id(self) -> str:
        page = await self._openai.models.list()
        if not page.data:
            raise FatalEndpointError("the endpoint serves no model (GET /v1/models is empty)")
        return page.data[0].id

    async def _generate_once(self, request: dict[str, Any], attempt: int) -> Generation:
        start = time.monotonic()
        if not self._stream:
            completion = await self._openai.post(
                "/chat/completions", cast_to=object, body=request, options=_CHAT_OPTIONS
            )
            return generation_from_completion(
                completion,
                latency_s=time.monotonic() - start,
                attempts=attempt,
                default_model=request["model"],
            )
        accumulator = StreamAccumulator()
        ttft_s: float | None = None
        stream = await self._openai.post(
            "/chat/completions",
            cast_to=object,
            body={**request, "stream": True, "stream_options": {"include_usage": True}},
            options=_CHAT_OPTIONS,
            stream=True,
            stream_cls=AsyncStream[object],
        )
        async with stream:  # closes the connection even if this task is cancelled mid-stream
            async for chunk in stream:
                if accumulator.feed(chunk) and ttft_s is None:
                    ttft_s = time.monotonic() - start
        return accumulator.result(
            latency_s=time.monotonic() - start,
            ttft_s=ttft_s,
            attempts=attempt,
            default_model=request["model"],
        )

    async def _with_retries(self, operation: Callable[[int], Awaitable[T]]) -> T:
        """Run ``operation(attempt_number)`` under the retry policy, failures classified."""
        numbers = itertools.count(1)

        async def one_attempt() -> T:
            return await self._attempt(operation, next(numbers))

        return await self._retry.retrying()(one_attempt)

    async def _attempt(self, operation: Callable[[int], Awaitable[T]], attempt: int) -> T:
        try:
            return await operation(attempt)
        except _REQUEST_FAILURES as exc:
            error = classify(exc, secret=self._api_key)
        # Raised outside the except block so the SDK exception (whose text may hold the key)
        # is not chained onto ours.
        error.attempts = attempt
        if isinstance(error, TransientRequestError) and self._on_attempt_failed is not None:
            self._on_attempt_failed(error)
        raise error


def _request_kwargs(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
) -> dict[str, Any]:
    """The JSON body; the sampling extras (``chat_template_kwargs``, ...) go at its top level, as
    SGLang reads them, and win over the standard fields as the SDK's ``extra_body`` did."""
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        **sampling.extra_fields(),
    }
    if tools:
        request["tools"] = tools
    return request


def _server_root(base_url: str) -> str:
    """``base_url`` without credentials, trailing slash or ``/v1``."""
    parts = urlsplit(base_url.rstrip("/"))
    netloc = parts.netloc.rpartition("@")[2]
    path = parts.path.removesuffix("/v1")
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))
