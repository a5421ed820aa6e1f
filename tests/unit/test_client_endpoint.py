"""EndpointClient against the REAL captured SGLang/vLLM bytes, served through httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.client.endpoint import EndpointClient, RetryPolicy
from flows.client.errors import FatalEndpointError, PermanentRequestError, RequestError, TransientRequestError
from flows.client.responses import Usage
from flows.client.sampling import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SGLANG = "sglang-0.5.23"
VLLM = "vllm-0.32.0"
KEY = "sk-test-5f0c1e9d2b7a4c38"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLING = SamplingParams(max_tokens=16)
FAST_RETRY = RetryPolicy(max_attempts=3, initial_wait_s=0.001, max_wait_s=0.002)
Responder = Callable[[httpx.Request], httpx.Response]

SGLANG_OVER_CONTEXT = (
    "Requested token count exceeds the model's maximum context length of 1024 tokens. You requested a"
    " total of 1450 tokens: 850 tokens from the input messages and 600 tokens for the completion. Please"
    " reduce the number of tokens in the input messages or the completion to fit within the limit."
)
VLLM_TOO_LONG = (
    "This model's maximum context length is 1024 tokens. However, your prompt contains at least 1025"
    " input tokens, which exceeds this limit even without any output tokens. Please reduce the length of"
    " the input prompt. (parameter=input_tokens, value=1025)"
)
VLLM_BUSY = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a"
    " different instance."
)


def captured(engine: str, name: str) -> Responder:
    """Serve a captured body with the captured status and content type (from its .headers.txt)."""
    folder = FIXTURES / engine
    head = (folder / f"{name}.headers.txt").read_text().splitlines()
    status = int(head[0].split()[1])
    content_type = next(
        line.split(":", 1)[1].strip() for line in head if line.lower().startswith("content-type:")
    )
    body_path = next(p for p in folder.glob(f"{name}.*") if not p.name.endswith(".headers.txt"))
    body = body_path.read_bytes()
    return lambda _request: httpx.Response(status, headers={"content-type": content_type}, content=body)


def sse_prefix(engine: str, name: str, events: int) -> bytes:
    """The first ``events`` SSE events of a captured stream: a stream the server stopped early."""
    body = (FIXTURES / engine / f"{name}.sse").read_bytes()
    return b"".join(event + b"\n\n" for event in body.split(b"\n\n")[:events])


class FakeServer:
    """Answers each request with the next responder (the last one repeats) and keeps the requests."""

    def __init__(self, *responders: Responder) -> None:
        self._responders = list(responders)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        responder = self._responders.pop(0) if len(self._responders) > 1 else self._responders[0]
        return responder(request)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.requests]


def make_client(server: FakeServer, **options: Any) -> EndpointClient:
    options.setdefault("retry", FAST_RETRY)
    http_client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return EndpointClient("http://127.0.0.1:30000", "tinyllm", KEY, http_client=http_client, **options)


async def generate(server: FakeServer, **options: Any) -> Any:
    client = make_client(server, **options)
    try:
        return await client.generate(MESSAGES, None, SAMPLING)
    finally:
        await client.aclose()


async def failure(server: FakeServer, **options: Any) -> RequestError:
    with pytest.raises(RequestError) as caught:
        await generate(server, **options)
    return caught.value


def assert_key_hidden(error: BaseException) -> None:
    text = "".join(traceback.format_exception(error)) + repr(error) + str(error)
    assert KEY not in text


# --- answers -------------------------------------------------------------------------------------


async def test_sglang_stream_end_to_end() -> None:
    server = FakeServer(captured(SGLANG, "chat_stream"))

    generation = await generate(server)

    assert generation.message == {
        "role": "assistant",
        "content": " rindo\ufffd link"
        + "#" * 64
        + " next dictionary norm optional\ufffdUToptsbitsnchannels tuple config",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert generation.finish_reason == "length"
    assert generation.usage == Usage(prompt_tokens=22, completion_tokens=16)
    assert generation.model == "tinyllm"
    assert generation.attempts == 1
    assert generation.ttft_s is not None
    assert 0 <= generation.ttft_s <= generation.latency_s


@pytest.mark.parametrize(
    ("engine", "name", "stream", "content", "reasoning_prefix", "tool_calls", "finish_reason", "usage"),
    [
        (SGLANG, "chat_nonstream", False, " ()warnings erroption", None, None, "length", Usage(22, 32)),
        (VLLM, "chat_nonstream", False, " equivalent overriddenrange", None, None, "length", Usage(22, 32)),
        (VLLM, "chat_stream", True, "valuesresponse,-conds", None, None, "length", Usage(22, 16)),
        (
            SGLANG,
            "parsers_r1_qwen25_chat_reasoning",
            False,
            "",
            " indicate\ufffdIIang",
            None,
            "length",
            Usage(23, 48, 48),
        ),
        (
            SGLANG,
            "parsers_r1_qwen25_chat_reasoning_stream",
            True,
            "",
            " shdicate..cle",
            None,
            "length",
            Usage(23, 48, 48),
        ),
        (
            SGLANG,
            "parsers_qwen3_hermes_chat_reasoning",
            False,
            "",
            " ZipG [",
            None,
            "length",
            Usage(23, 48, 48),
        ),
        (
            SGLANG,
            "parsers_qwen3_hermes_chat_reasoning_stream",
            True,
            "",
            "bels success",
            None,
            "length",
            Usage(23, 48, 48),
        ),
        (
            SGLANG,
            "parsers_qwen25_regex_toolcall",
            False,
            "",
            None,
            [("call_286d338b98994bdfadc5144c", {"city": "Paris"})],
            "tool_calls",
            Usage(22, 57),
        ),
        (
            SGLANG,
            "parsers_qwen25_regex_toolcall_stream",
            True,
            "",
            None,
            [("call_bd87fc585f6045578250364f", {"city": "Paris"})],
            "tool_calls",
            Usage(22, 61),
        ),
        (
            SGLANG,
            "parsers_qwen25_tools_required_stream",
            True,
            "",
            None,
            [("call_5c34cd06d817467fb562586e", 150325533025599997700)],
            "length",
            Usage(22, 48),
        ),
    ],
)
async def test_captured_answers(
    engine: str,
    name: str,
    stream: bool,
    content: str,
    reasoning_prefix: str | None,
    tool_calls: list[tuple[str, Any]] | None,
    finish_reason: str,
    usage: Usage,
) -> None:
    server = FakeServer(captured(engine, name))

    generation = await generate(server, stream=stream)

    message = generation.message
    assert message["content"].startswith(content)
    assert bool(message["content"]) == bool(content)
    if reasoning_prefix is None:
        assert message["reasoning_content"] is None
    else:
        assert message["reasoning_content"].startswith(reasoning_prefix)
    if tool_calls is None:
        assert message["tool_calls"] is None
    else:
        assert [(c["id"], c["type"], c["function"]["name"]) for c in message["tool_calls"]] == [
            (call_id, "function", "get_weather") for call_id, _ in tool_calls
        ]
        assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
            a for _, a in tool_calls
        ]
    assert (generation.finish_reason, generation.usage, generation.model) == (finish_reason, usage, "tinyllm")
    assert (generation.ttft_s is not None) == stream
    assert server.bodies()[0].get("stream", False) == stream


async def test_request_body_carries_extras_at_top_level() -> None:
    server = FakeServer(captured(SGLANG, "parsers_qwen25_regex_toolcall_stream"))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    sampling = SamplingParams(
        max_tokens=300,
        temperature=0.6,
        top_p=0.95,
        chat_template_kwargs={"thinking": True},
        separate_reasoning=True,
        extra_body={"top_k": 20},
    )
    client = make_client(server)
    try:
        await client.generate(MESSAGES, tools, sampling)
    finally:
        await client.aclose()

    (request,) = server.requests
    assert request.url == "http://127.0.0.1:30000/v1/chat/completions"
    assert json.loads(request.content) == {
        "model": "tinyllm",
        "messages": MESSAGES,
        "tools": tools,
        "max_tokens": 300,
        "temperature": 0.6,
        "top_p": 0.95,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": True},
        "separate_reasoning": True,
        "top_k": 20,
    }
    assert request.headers["authorization"] == f"Bearer {KEY}"
    # The SDK's 600 s default would kill long reasoning answers.
    assert request.extensions["timeout"] == {"connect": 10.0, "read": 3600.0, "write": 3600.0, "pool": 3600.0}


async def test_non_streaming_body_and_no_tools_key() -> None:
    server = FakeServer(captured(SGLANG, "chat_nonstream"))

    await generate(server, stream=False, read_timeout_s=120.0)

    body = server.bodies()[0]
    assert "stream" not in body
    assert "stream_options" not in body
    assert "tools" not in body
    assert server.requests[0].extensions["timeout"]["read"] == 120.0


# --- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "name", "reason"),
    [
        (
            SGLANG,
            "chat_too_long",
            "The input (2410 tokens) is longer than the model's context length (1024 tokens).",
        ),
        (
            SGLANG,
            "chat_too_long_stream",
            "The input (2410 tokens) is longer than the model's context length (1024 tokens).",
        ),
        (
            SGLANG,
            "chat_prompt_plus_max_tokens_over_ctx",
            SGLANG_OVER_CONTEXT,
        ),
        (
            VLLM,
            "chat_too_long",
            VLLM_TOO_LONG,
        ),
    ],
)
async def test_prompt_too_long_is_permanent_and_never_retried(engine: str, name: str, reason: str) -> None:
    server = FakeServer(captured(engine, name), captured(SGLANG, "chat_stream"))

    error = await failure(server)

    assert type(error) is PermanentRequestError
    assert (error.status, error.reason, error.attempts) == (400, reason, 1)
    assert len(server.requests) == 1


@pytest.mark.parametrize("engine", [SGLANG, VLLM])
async def test_invalid_request_is_permanent(engine: str) -> None:
    server = FakeServer(captured(engine, "chat_invalid_schema"))

    error = await failure(server, stream=False)

    assert type(error) is PermanentRequestError
    assert error.status == 400
    assert error.reason.startswith("2 validation errors:\n  {'type': 'list_type'")
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("engine", "name", "stream", "reason"),
    [
        (SGLANG, "chat_queue_full_503", False, "The request queue is full."),
        (SGLANG, "chat_queue_full_503_stream", True, "The request queue is full."),
        (
            VLLM,
            "chat_queue_full_503",
            False,
            VLLM_BUSY,
        ),
        (
            VLLM,
            "chat_queue_full_503_stream",
            True,
            VLLM_BUSY,
        ),
    ],
)
async def test_queue_full_is_retried_then_raised_with_attempts(
    engine: str, name: str, stream: bool, reason: str
) -> None:
    server = FakeServer(captured(engine, name))
    seen: list[TransientRequestError] = []

    error = await failure(server, stream=stream, on_attempt_failed=seen.append)

    assert type(error) is TransientRequestError
    assert (error.status, error.reason, error.attempts) == (503, reason, 3)
    assert str(error) == f"HTTP 503: {reason} (attempt 3)"
    assert len(server.requests) == 3
    assert [e.attempts for e in seen] == [1, 2, 3]


async def test_permanent_error_after_a_retry_reports_both_attempts() -> None:
    server = FakeServer(captured(SGLANG, "chat_queue_full_503"), captured(SGLANG, "chat_too_long"))

    error = await failure(server)

    assert (type(error), error.status, error.attempts) == (PermanentRequestError, 400, 2)


@pytest.mark.parametrize("first", ["chat_queue_full_503", "chat_queue_full_503_stream"])
async def test_two_queue_full_then_success_counts_three_attempts(first: str) -> None:
    server = FakeServer(captured(SGLANG, first), captured(SGLANG, first), captured(SGLANG, "chat_stream"))
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 3
    assert generation.finish_reason == "length"
    assert [(e.status, e.attempts) for e in seen] == [(503, 1), (503, 2)]


async def test_stream_that_stops_without_finish_reason_is_retried() -> None:
    cut = sse_prefix(SGLANG, "chat_stream", 5)
    server = FakeServer(
        lambda _r: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=cut),
        captured(SGLANG, "chat_stream"),
    )
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 2
    assert generation.usage.completion_tokens == 16
    assert [e.reason for e in seen] == ["stream ended without a finish_reason (cut stream)"]


async def test_connection_dropped_mid_stream_is_transient() -> None:
    head = sse_prefix(SGLANG, "chat_stream", 3)

    async def dropped() -> AsyncIterator[bytes]:
        yield head
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    server = FakeServer(
        lambda _r: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=dropped())
    )

    error = await failure(server)

    assert type(error) is TransientRequestError
    assert error.reason == (
        "connection error: RemoteProtocolError: peer closed connection without sending complete message body"
    )
    assert (error.status, error.attempts) == (None, 3)


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (
            httpx.ConnectError("[Errno 111] Connection refused"),
            "connection error: ConnectError: [Errno 111] Connection refused",
        ),
        (httpx.ReadTimeout("timed out"), "request timed out"),
    ],
)
async def test_unreachable_server_is_transient(raised: Exception, reason: str) -> None:
    def fail(_request: httpx.Request) -> httpx.Response:
        raise raised

    error = await failure(FakeServer(fail))

    assert type(error) is TransientRequestError
    assert (error.reason, error.attempts) == (reason, 3)


async def test_bad_key_is_fatal_and_the_key_never_shows() -> None:
    echoed = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}",
            "type": "invalid_request_error",
            "code": 401,
        }
    }
    server = FakeServer(lambda _r: httpx.Response(401, json=echoed))

    error = await failure(server)

    assert type(error) is FatalEndpointError
    assert (error.status, error.reason, error.attempts) == (401, "Incorrect API key provided: ***", 1)
    assert len(server.requests) == 1
    assert_key_hidden(error)


async def test_unknown_model_is_fatal() -> None:
    missing = {
        "error": {"message": "The model `tinylm` does not exist.", "type": "NotFoundError", "code": 404}
    }
    server = FakeServer(lambda _r: httpx.Response(404, json=missing))

    error = await failure(server)

    assert type(error) is FatalEndpointError
    assert (error.status, error.reason) == (404, "The model `tinylm` does not exist.")


async def test_key_is_hidden_in_transient_errors_too() -> None:
    def fail(_request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"proxy refused Bearer {KEY}")

    error = await failure(FakeServer(fail))

    assert error.reason == "connection error: ConnectError: proxy refused Bearer ***"
    assert_key_hidden(error)


async def test_abort_finish_reason_is_retried() -> None:
    aborted = {
        "model": "tinyllm",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "par"}, "finish_reason": "abort"}
        ],
    }
    server = FakeServer(lambda _r: httpx.Response(200, json=aborted), captured(SGLANG, "chat_nonstream"))

    generation = await generate(server, stream=False)

    assert (generation.attempts, generation.finish_reason) == (2, "length")


# --- model detection and identity ----------------------------------------------------------------


@pytest.mark.parametrize("engine", [SGLANG, VLLM])
async def test_detect_model(engine: str) -> None:
    server = FakeServer(captured(engine, "v1_models"))
    client = EndpointClient(
        "http://127.0.0.1:30000/v1/",
        None,
        None,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(server)),
    )
    try:
        assert client.model is None
        assert await client.detect_model() == "tinyllm"
        assert client.model == "tinyllm"
    finally:
        await client.aclose()
    assert server.requests[0].url == "http://127.0.0.1:30000/v1/models"
    assert server.requests[0].headers["authorization"] == "Bearer EMPTY"


async def test_model_is_detected_once_for_concurrent_first_requests() -> None:
    models = captured(SGLANG, "v1_models")
    chat = captured(SGLANG, "chat_stream")
    server = FakeServer(lambda r: models(r) if r.url.path == "/v1/models" else chat(r))
    client = EndpointClient(
        "http://127.0.0.1:30000",
        None,
        KEY,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(server)),
    )
    try:
        generations = await asyncio.gather(*(client.generate(MESSAGES, None, SAMPLING) for _ in range(5)))
    finally:
        await client.aclose()

    assert [g.finish_reason for g in generations] == ["length"] * 5
    assert [r.url.path for r in server.requests].count("/v1/models") == 1
    chats = [json.loads(r.content) for r in server.requests if r.url.path == "/v1/chat/completions"]
    assert [body["model"] for body in chats] == ["tinyllm"] * 5


async def test_empty_model_list_is_fatal() -> None:
    server = FakeServer(lambda _r: httpx.Response(200, json={"object": "list", "data": []}))
    client = EndpointClient(
        "http://127.0.0.1:30000",
        None,
        None,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(server)),
    )
    try:
        with pytest.raises(FatalEndpointError, match="serves no model"):
            await client.detect_model()
    finally:
        await client.aclose()


def test_endpoint_and_repr_show_no_credentials() -> None:
    client = EndpointClient("http://user:pw@gpu-node-3:30000/v1/", "tinyllm", KEY)

    assert client.endpoint == "http://gpu-node-3:30000"
    assert repr(client) == "EndpointClient(endpoint='http://gpu-node-3:30000', model='tinyllm', stream=True)"
    assert KEY not in repr(client)
    asyncio.run(client.aclose())


def test_retry_policy_rejects_zero_attempts() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


async def test_max_total_seconds_stops_retrying() -> None:
    server = FakeServer(captured(SGLANG, "chat_queue_full_503"))
    policy = RetryPolicy(max_attempts=100, initial_wait_s=0.001, max_wait_s=0.002, max_total_s=0.0)

    error = await failure(server, retry=policy)

    assert (type(error), error.attempts) == (TransientRequestError, 1)


async def test_cancelling_a_request_closes_its_stream() -> None:
    head = sse_prefix(SGLANG, "chat_stream", 3)
    started = asyncio.Event()
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            yield head
            started.set()
            await asyncio.Event().wait()
            yield b""
        finally:
            closed.set()

    server = FakeServer(
        lambda _r: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=endless())
    )
    client = make_client(server)
    try:
        task = asyncio.create_task(client.generate(MESSAGES, None, SAMPLING))
        await asyncio.wait_for(started.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 2)
    finally:
        await client.aclose()
    assert len(server.requests) == 1  # cancellation is not a failure to retry
