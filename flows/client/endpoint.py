"""The one shared client per endpoint: send a chat request, retry what is worth retrying.

One aiohttp connection pool per endpoint, sized for thousands of in-flight requests: a run keeps
the server's KV cache full for hours, and a client per request (as SpecForge's script does) pays
a TCP/TLS setup and a pool per prompt.

The client's CPU per request bounds how many servers one orchestrator core keeps busy
(``bench/client_cpu.py``), so the chat request, the one call made per prompt, is posted on aiohttp
directly: our JSON body out, the JSON (or the SSE chunks) back as plain dicts. Measured against the
simulator made instant, the OpenAI SDK's request layer on this path (its httpx2 request objects,
URL and header handling, over its aiohttp transport) cost 0.9-1.4 ms of CPU a request, this post
0.3 ms: the SDK's layer alone was about 60 % of a whole run's CPU. The SDK is still the client for
everything else (``/v1/models``, whose errors ``flows.client.errors`` reads), and its SSE decoder
parses streams; what the SDK did for the chat call we do here: the bearer header, the status code
and the server's error body (``error_for_reply``), and in-stream error events.
Retries live here, with tenacity, because only here is the failure known precisely enough
(``flows.client.errors``) to tell "try again" from "reject the prompt" from "stop the run".

Timeouts: connecting is short, but a single read may legitimately wait a long time (a non-streamed
60k-token reasoning answer sends nothing until it is done), so the read timeout defaults to an
hour instead of the SDK's 600 s, which would kill exactly the longest, most valuable answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx2
import openai
from openai._streaming import SSEDecoder
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_random_exponential,
)

from flows.client.errors import (
    FatalEndpointError,
    PermanentRequestError,
    RequestError,
    TransientRequestError,
    answer_room,
    classify,
    error_for_event,
    error_for_reply,
)
from flows.client.responses import (
    Generation,
    StreamAccumulator,
    cut_at_max_tokens,
    generation_from_completion,
)
from flows.client.sampling import SamplingParams
from sglang_launch.probe import endpoint_http, tls_context

T = TypeVar("T")
log = logging.getLogger(__name__)
OnAttemptFailed = Callable[[TransientRequestError], None]

# Sent when the server needs no key: without it the SDK would fall back to $OPENAI_API_KEY and
# hand a real OpenAI key to a self-hosted server.
_NO_KEY = "EMPTY"
# The exception families a request can raise; anything else is a bug and must surface as one:
# the SDK's (model listing), aiohttp's and its timeouts (the chat post), ours.
_REQUEST_FAILURES = (openai.OpenAIError, aiohttp.ClientError, TimeoutError, RequestError)
# The SDK's pool serves only the model listing; the chat pool is ours.
_SDK_CONNECTIONS = 4
# SGLang and vLLM (uvicorn) close a connection idle for 5 s. Reusing one they are closing fails the
# request ("Server disconnected", "Can not write request body": seen on the CPU vLLM after each
# back-off left connections idle), so the pool drops idle connections first.
_KEEPALIVE_S = 3.0


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

    def first_wait_s(self, elapsed_s: float) -> float | None:
        """The wait before the second attempt, or None when there is none (one attempt allowed, or
        ``max_total_s`` already spent by the first)."""
        if self.max_attempts == 1 or (self.max_total_s is not None and elapsed_s >= self.max_total_s):
            return None
        return random.uniform(0.0, min(self.initial_wait_s, self.max_wait_s))

    def retrying_after_first(self, elapsed_s: float) -> AsyncRetrying:
        """A fresh tenacity controller for attempts 2.. of one call, ``elapsed_s`` after the first
        began. Its attempt k is our attempt k + 1, so its waits are doubled to keep the schedule."""
        deadline = stop_never if self.max_total_s is None else stop_after_delay(self.max_total_s - elapsed_s)
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts - 1) | deadline,
            wait=wait_random_exponential(multiplier=2 * self.initial_wait_s, max=self.max_wait_s),
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
        api_base = f"{base_url.rstrip('/').removesuffix('/v1')}/v1"
        self._chat_url = f"{api_base}/chat/completions"
        self._chat_headers = {
            "Authorization": f"Bearer {api_key or _NO_KEY}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
        }
        # A pool wait only means the controller let more requests in flight than connections:
        # that must queue, not fail prompts, so only connecting and each read are timed.
        self._chat_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self._chat_session: aiohttp.ClientSession | None = None
        timeout = httpx2.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._openai = openai.AsyncOpenAI(
            base_url=api_base,
            api_key=api_key or _NO_KEY,
            max_retries=0,
            timeout=timeout,
            http_client=openai.DefaultAioHttpClient(
                limits=httpx2.Limits(max_connections=_SDK_CONNECTIONS),
                timeout=timeout,
                **endpoint_http(ca_bundle),
            ),
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

    async def listed_models(self) -> list[str]:
        """The model ids ``GET /v1/models`` lists (served names, LoRA adapters), asked once: the
        run's start and an endpoint's return ask this where a retry would only delay the answer."""
        return await self._attempt(lambda _attempt: self._model_ids(), 1)

    def use_model(self, model: str) -> None:
        """Ask for ``model`` from now on (the model of the run, checked to be listed here)."""
        self._model = model

    async def generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> Generation:
        """One assistant turn for ``messages``, retried on transient failures.

        Raises ``PermanentRequestError`` (reject the prompt) or ``FatalEndpointError`` (stop the
        run) at once, and ``TransientRequestError`` once retries are spent; every error carries
        the number of attempts made.
        """
        model = await self._resolved_model()
        try:
            return await self._generate(model, messages, tools, sampling)
        except PermanentRequestError as refused:
            room = answer_room(refused)
            if room is None or room >= sampling.max_tokens:
                raise
            # the prompt fits with a shorter answer: asked so (the answer is flagged if it is cut)
            shorter = dataclasses.replace(sampling, max_tokens=room)
            generation = await self._generate(model, messages, tools, shorter)
            generation.max_tokens = room
            generation.attempts += refused.attempts  # the row counts the refused request too
            return generation

    async def _generate(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> Generation:
        request = _request_kwargs(model, messages, tools, sampling)
        if self._stream:
            request = {**request, "stream": True, "stream_options": {"include_usage": True}}
        body = json.dumps(request, ensure_ascii=False).encode()
        generation = await self._with_retries(lambda attempt: self._generate_once(body, model, attempt))
        return cut_at_max_tokens(generation, sampling.max_tokens)

    async def aclose(self) -> None:
        """Close both connection pools."""
        if self._chat_session is not None:
            await self._chat_session.close()
        await self._openai.close()

    async def _resolved_model(self) -> str:
        if self._model is not None:
            return self._model
        async with self._model_lock:  # thousands of first requests must not each ask /v1/models
            return self._model if self._model is not None else await self.detect_model()

    async def _first_model_id(self) -> str:
        return first_model(await self._model_ids())

    async def _model_ids(self) -> list[str]:
        page = await self._openai.models.list()
        return [model.id for model in page.data]

    def _session(self) -> aiohttp.ClientSession:
        """The chat pool, made on first use (an aiohttp session belongs to the running loop)."""
        if self._chat_session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ssl=tls_context(self._ca_bundle), keepalive_timeout=_KEEPALIVE_S
            )
            self._chat_session = aiohttp.ClientSession(connector=connector, timeout=self._chat_timeout)
        return self._chat_session

    async def _generate_once(self, body: bytes, model: str, attempt: int) -> Generation:
        start = time.monotonic()
        post = self._session().post(
            self._chat_url, data=body, headers=self._chat_headers, allow_redirects=False
        )
        async with post as reply:  # closes the connection even if this task is cancelled mid-stream
            if reply.status >= 300:
                raise error_for_reply(reply.status, await reply.read())
            if not self._stream:
                return generation_from_completion(
                    _json(await reply.read()),
                    latency_s=time.monotonic() - start,
                    attempts=attempt,
                    default_model=model,
                )
            accumulator = StreamAccumulator()
            ttft_s: float | None = None
            done = False
            # Read to the end of the body, past "[DONE]" (a body left unread closes the connection
            # instead of returning it to the pool); events without data are keep-alives.
            async for event in SSEDecoder().aiter_bytes(reply.content.iter_any()):
                if event.data.startswith("[DONE]"):
                    done = True
                if not event.data or done:
                    continue
                chunk = _json(event.data)
                if isinstance(chunk, Mapping) and chunk.get("error"):
                    raise error_for_event(chunk["error"])
                if accumulator.feed(chunk) and ttft_s is None:
                    ttft_s = time.monotonic() - start
        generation = accumulator.result(
            latency_s=time.monotonic() - start, ttft_s=ttft_s, attempts=attempt, default_model=model
        )
        if not done:  # cut after its finish chunk: the usage (asked for) never came either
            raise TransientRequestError("stream ended without [DONE] (cut stream)")
        return generation

    async def _with_retries(self, operation: Callable[[int], Awaitable[T]]) -> T:
        """Run ``operation(attempt_number)`` under the retry policy, failures classified.

        The first attempt runs bare and tenacity takes over only once it failed: building
        tenacity's per-call state and actions cost about 0.2 ms a request (``bench/client_cpu.py``),
        as much as the rest of the client, for the one attempt nearly every request needs.
        """
        started = time.monotonic()
        try:
            return await self._attempt(operation, 1)
        except TransientRequestError:
            wait_s = self._retry.first_wait_s(time.monotonic() - started)
            if wait_s is None:
                raise
        await asyncio.sleep(wait_s)
        numbers = itertools.count(2)

        async def one_attempt() -> T:
            return await self._attempt(operation, next(numbers))

        return await self._retry.retrying_after_first(time.monotonic() - started)(one_attempt)

    async def _attempt(self, operation: Callable[[int], Awaitable[T]], attempt: int) -> T:
        try:
            return await operation(attempt)
        except _REQUEST_FAILURES as exc:
            error = classify(exc, secret=self._api_key)
        # Raised outside the except block so the SDK exception (whose text may hold the key)
        # is not chained onto ours.
        error.attempts = attempt
        if isinstance(error, TransientRequestError):
            # quiet by default (INFO); a run that retries much says why with -v
            log.info("%s: %s; retried while attempts remain", self._endpoint, error)
            if self._on_attempt_failed is not None:
                self._on_attempt_failed(error)
        raise error


def first_model(listed: list[str]) -> str:
    """The model a server serves by default: the first it lists (vLLM and SGLang list the base model
    first, LoRA adapters after it)."""
    if not listed:
        raise FatalEndpointError("the endpoint serves no model (GET /v1/models is empty)")
    return listed[0]


def _json(data: bytes | str) -> Any:
    """A 2xx body or stream chunk that is not JSON is a broken answer, worth another try."""
    try:
        return json.loads(data)
    except ValueError as exc:
        raise TransientRequestError(f"malformed response: {exc}") from None


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
