"""EndpointClient against the REAL captured SGLang/vLLM bytes, served by a loopback aiohttp server."""

from __future__ import annotations

import asyncio
import json
import random
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from flows.client.endpoint import EndpointClient, RetryPolicy
from flows.client.errors import FatalEndpointError, PermanentRequestError, RequestError, TransientRequestError
from flows.client.responses import Usage
from flows.client.sampling import SamplingParams
from sglang_launch.ports import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SGLANG = "sglang-0.5.23"
VLLM = "vllm-0.32.0"
KEY = "sk-test-5f0c1e9d2b7a4c38"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLING = SamplingParams(max_tokens=16)
CAPTURED_MAX_TOKENS = SamplingParams(max_tokens=64)
"""The most any captured answer was asked for (its usage says what it made)."""
FAST_RETRY = RetryPolicy(max_attempts=3, initial_wait_s=0.001, max_wait_s=0.002)
Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]

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


def reply(status: int, body: bytes, content_type: str = "application/json") -> Responder:
    async def respond(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    return respond


def json_reply(status: int, body: object) -> Responder:
    return reply(status, json.dumps(body).encode())


def captured(engine: str, name: str) -> Responder:
    """Serve a captured body with the captured status and content type (from its .headers.txt)."""
    folder = FIXTURES / engine
    head = (folder / f"{name}.headers.txt").read_text().splitlines()
    status = int(head[0].split()[1])
    content_type = next(
        line.split(":", 1)[1].strip() for line in head if line.lower().startswith("content-type:")
    )
    body_path = next(p for p in folder.glob(f"{name}.*") if not p.name.endswith(".headers.txt"))
    return reply(status, body_path.read_bytes(), content_type)


def sse_prefix(engine: str, name: str, events: int) -> bytes:
    """The first ``events`` SSE events of a captured stream: a stream the server stopped early."""
    body = (FIXTURES / engine / f"{name}.sse").read_bytes()
    return b"".join(event + b"\n\n" for event in body.split(b"\n\n")[:events])


async def sse_head(request: web.Request, head: bytes) -> web.StreamResponse:
    """Start a 200 event stream and send ``head``: the caller decides how it goes on."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(head)
    return response


@dataclass(frozen=True)
class Seen:
    """A request as the server received it."""

    path: str
    headers: CIMultiDictProxy[str]
    content: bytes


class FakeServer:
    """A loopback HTTP server: answers each request with the next responder (the last one repeats)
    and keeps the requests. Started on first use, stopped by the ``servers`` fixture."""

    running: ClassVar[list[web.AppRunner]] = []

    def __init__(self, *responders: Responder) -> None:
        self._responders = list(responders)
        self.requests: list[Seen] = []
        self._url: str | None = None

    async def url(self) -> str:
        if self._url is None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            FakeServer.running.append(runner)
            self._url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self._url

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Seen(request.path, request.headers, await request.read()))
        responder = self._responders.pop(0) if len(self._responders) > 1 else self._responders[0]
        return await responder(request)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.requests]


@pytest.fixture(autouse=True)
async def servers() -> AsyncIterator[None]:
    yield
    while FakeServer.running:
        await FakeServer.running.pop().cleanup()


async def make_client(server: FakeServer, *, path: str = "", **options: Any) -> EndpointClient:
    options.setdefault("retry", FAST_RETRY)
    options.setdefault("model", "tinyllm")
    options.setdefault("api_key", KEY)
    return EndpointClient(await server.url() + path, **options)


async def generate(server: FakeServer, sampling: SamplingParams = CAPTURED_MAX_TOKENS, **options: Any) -> Any:
    client = await make_client(server, **options)
    try:
        return await client.generate(MESSAGES, None, sampling)
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
    client = await make_client(server)
    try:
        await client.generate(MESSAGES, tools, sampling)
    finally:
        await client.aclose()

    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
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
    assert request.headers["content-type"] == "application/json"


async def test_a_base_url_with_v1_and_a_path_prefix_is_kept() -> None:
    server = FakeServer(captured(SGLANG, "chat_nonstream"))

    await generate(server, path="/gpu-3/v1/", stream=False)

    assert server.requests[0].path == "/gpu-3/v1/chat/completions"


async def test_a_read_slower_than_the_read_timeout_is_transient() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        response = await sse_head(request, sse_prefix(SGLANG, "chat_stream", 2))
        await asyncio.sleep(1.0)
        return response

    error = await failure(FakeServer(slow), read_timeout_s=0.2)

    assert type(error) is TransientRequestError
    assert error.reason.startswith("request timed out: ")
    assert error.attempts == 3


async def test_a_slow_answer_within_the_read_timeout_is_kept() -> None:
    answer = captured(SGLANG, "chat_nonstream")

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.3)
        return await answer(request)

    generation = await generate(FakeServer(slow), stream=False, read_timeout_s=2.0)

    assert (generation.finish_reason, generation.attempts) == ("length", 1)


async def test_non_streaming_body_and_no_tools_key() -> None:
    server = FakeServer(captured(SGLANG, "chat_nonstream"))

    await generate(server, stream=False)

    body = server.bodies()[0]
    assert "stream" not in body
    assert "stream_options" not in body
    assert "tools" not in body


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


async def test_a_prompt_that_fits_with_a_shorter_answer_is_asked_so() -> None:
    """SGLang refuses prompt + max_tokens over the context (850 + 600 > 1024): every prompt within
    max_tokens of the context was a reject, though 174 tokens of answer fitted beside it."""
    server = FakeServer(
        captured(SGLANG, "chat_prompt_plus_max_tokens_over_ctx"), captured(SGLANG, "chat_stream")
    )

    generation = await generate(server, sampling=SamplingParams(max_tokens=600))

    assert [body["max_tokens"] for body in server.bodies()] == [600, 1024 - 850]
    assert generation.max_tokens == 174 and generation.usage.completion_tokens == 16
    assert generation.attempts == 2  # the refused request and the one answered


async def test_no_room_for_an_answer_stays_a_reject() -> None:
    too_full = SGLANG_OVER_CONTEXT.replace("850 tokens from", "1000 tokens from")  # 24 tokens left
    server = FakeServer(json_reply(400, {"object": "error", "message": too_full, "code": 400}))

    error = await failure(server)

    assert type(error) is PermanentRequestError and len(server.requests) == 1
    asked_less = FakeServer(captured(SGLANG, "chat_prompt_plus_max_tokens_over_ctx"))
    assert type(await failure(asked_less)) is PermanentRequestError  # never more than the config's 64
    assert len(asked_less.requests) == 1


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
    server = FakeServer(reply(200, cut, "text/event-stream"), captured(SGLANG, "chat_stream"))
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 2
    assert generation.usage.completion_tokens == 16
    assert [e.reason for e in seen] == ["stream ended without a finish_reason (cut stream)"]


async def test_a_stream_cut_after_its_finish_chunk_is_retried_not_kept_without_usage() -> None:
    """No [DONE]: the usage chunk never came either, and the row was stored with zero tokens."""
    events = (FIXTURES / SGLANG / "chat_stream.sse").read_bytes().split(b"\n\n")
    finish = next(i for i, event in enumerate(events) if b'"finish_reason":"length"' in event)
    cut = b"".join(event + b"\n\n" for event in events[: finish + 1])
    server = FakeServer(reply(200, cut, "text/event-stream"), captured(SGLANG, "chat_stream"))
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 2 and generation.usage.completion_tokens == 16
    assert [e.reason for e in seen] == ["stream ended without [DONE] (cut stream)"]


async def test_an_answer_that_made_max_tokens_is_cut_whatever_its_finish_reason() -> None:
    """vLLM streams "tool_calls" for an answer max_tokens cut while it wrote a second call."""
    server = FakeServer(captured(SGLANG, "parsers_qwen25_regex_toolcall_stream"))
    made = (await generate(server, stream=True)).usage.completion_tokens
    assert made == 61
    at_cap = await generate(
        FakeServer(captured(SGLANG, "parsers_qwen25_regex_toolcall_stream")),
        sampling=SamplingParams(max_tokens=made),
        stream=True,
    )
    assert at_cap.finish_reason == "length" and at_cap.message["tool_calls"]


async def test_vllm_error_finish_reason_is_retried() -> None:
    failed = {
        "model": "m",
        "choices": [{"index": 0, "message": {"content": "par"}, "finish_reason": "error"}],
    }
    server = FakeServer(json_reply(200, failed), captured(SGLANG, "chat_nonstream"))
    assert (await generate(server, stream=False)).attempts == 2


async def test_connection_dropped_mid_stream_is_transient() -> None:
    async def dropped(request: web.Request) -> web.StreamResponse:
        response = await sse_head(request, sse_prefix(SGLANG, "chat_stream", 3))
        assert request.transport is not None
        request.transport.close()  # the server dies mid-answer
        return response

    error = await failure(FakeServer(dropped))

    assert type(error) is TransientRequestError
    assert error.reason.startswith("connection error: ClientPayloadError: Response payload is not completed")
    assert (error.status, error.attempts) == (None, 3)


async def test_unreachable_server_is_transient() -> None:
    client = EndpointClient(f"http://127.0.0.1:{free_port()}", "tinyllm", KEY, retry=FAST_RETRY)
    try:
        with pytest.raises(TransientRequestError) as caught:
            await client.generate(MESSAGES, None, SAMPLING)
    finally:
        await client.aclose()

    assert caught.value.reason.startswith("connection error: ClientConnectorError: Cannot connect to host")
    assert caught.value.attempts == 3


async def test_an_error_body_that_is_not_json_gives_its_text() -> None:
    server = FakeServer(reply(502, b"<html>Bad Gateway</html>", "text/html"), captured(SGLANG, "chat_stream"))
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 2
    assert [(e.status, e.reason) for e in seen] == [(502, "<html>Bad Gateway</html>")]


async def test_a_200_that_is_not_json_is_retried() -> None:
    server = FakeServer(
        reply(200, b"<html>proxy page</html>", "text/html"), captured(SGLANG, "chat_nonstream")
    )
    seen: list[TransientRequestError] = []

    generation = await generate(server, stream=False, on_attempt_failed=seen.append)

    assert generation.attempts == 2
    assert seen[0].reason.startswith("malformed response: ")


async def test_an_error_event_inside_a_stream_is_classified_by_its_code() -> None:
    event = {"error": {"message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "code": 503}}
    queue_full = sse_prefix(SGLANG, "chat_stream", 2) + b"data: " + json.dumps(event).encode() + b"\n\n"
    server = FakeServer(reply(200, queue_full, "text/event-stream"), captured(SGLANG, "chat_stream"))
    seen: list[TransientRequestError] = []

    generation = await generate(server, on_attempt_failed=seen.append)

    assert generation.attempts == 2
    assert [(e.status, e.reason) for e in seen] == [(503, "The request queue is full.")]


async def test_keep_alive_events_and_crlf_lines_are_read_like_the_engines_own() -> None:
    body = (FIXTURES / SGLANG / "chat_stream.sse").read_bytes()
    noisy = b": keep-alive\r\n\r\nevent: ping\r\ndata:\r\n\r\n" + body.replace(b"\n", b"\r\n")

    plain = await generate(FakeServer(captured(SGLANG, "chat_stream")))
    generation = await generate(FakeServer(reply(200, noisy, "text/event-stream")))

    assert (generation.message, generation.usage) == (plain.message, plain.usage)


async def test_connections_are_reused_across_streamed_answers() -> None:
    ports: set[int] = set()
    body = (FIXTURES / SGLANG / "chat_stream.sse").read_bytes()

    async def note_peer(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        ports.add(request.transport.get_extra_info("peername")[1])
        response = await sse_head(request, body)
        await asyncio.sleep(0.05)  # the body's end comes after "[DONE]", as over a real network
        return response

    client = await make_client(FakeServer(note_peer))
    try:
        for _ in range(5):
            await client.generate(MESSAGES, None, SAMPLING)
    finally:
        await client.aclose()

    assert len(ports) == 1


async def test_bad_key_is_fatal_and_the_key_never_shows() -> None:
    echoed = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}",
            "type": "invalid_request_error",
            "code": 401,
        }
    }
    server = FakeServer(json_reply(401, echoed))

    error = await failure(server)

    assert type(error) is FatalEndpointError
    assert (error.status, error.reason, error.attempts) == (401, "Incorrect API key provided: ***", 1)
    assert len(server.requests) == 1
    assert_key_hidden(error)


async def test_unknown_model_is_fatal() -> None:
    missing = {
        "error": {"message": "The model `tinylm` does not exist.", "type": "NotFoundError", "code": 404}
    }
    server = FakeServer(json_reply(404, missing))

    error = await failure(server)

    assert type(error) is FatalEndpointError
    assert (error.status, error.reason) == (404, "The model `tinylm` does not exist.")


async def test_key_is_hidden_in_transient_errors_too() -> None:
    error = await failure(FakeServer(reply(503, f"proxy refused Bearer {KEY}".encode(), "text/plain")))

    assert (type(error), error.reason) == (TransientRequestError, "proxy refused Bearer ***")
    assert_key_hidden(error)


async def test_abort_finish_reason_is_retried() -> None:
    aborted = {
        "model": "tinyllm",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "par"}, "finish_reason": "abort"}
        ],
    }
    server = FakeServer(json_reply(200, aborted), captured(SGLANG, "chat_nonstream"))

    generation = await generate(server, stream=False)

    assert (generation.attempts, generation.finish_reason) == (2, "length")


# --- model detection and identity ----------------------------------------------------------------


@pytest.mark.parametrize("engine", [SGLANG, VLLM])
async def test_detect_model(engine: str) -> None:
    server = FakeServer(captured(engine, "v1_models"))
    client = await make_client(server, path="/v1/", model=None, api_key=None)
    try:
        assert client.model is None
        assert await client.detect_model() == "tinyllm"
        assert client.model == "tinyllm"
    finally:
        await client.aclose()
    assert server.requests[0].path == "/v1/models"
    assert server.requests[0].headers["authorization"] == "Bearer EMPTY"


async def test_model_is_detected_once_for_concurrent_first_requests() -> None:
    models = captured(SGLANG, "v1_models")
    chat = captured(SGLANG, "chat_stream")

    async def route(request: web.Request) -> web.StreamResponse:
        return await (models if request.path == "/v1/models" else chat)(request)

    server = FakeServer(route)
    client = await make_client(server, model=None)
    try:
        generations = await asyncio.gather(*(client.generate(MESSAGES, None, SAMPLING) for _ in range(5)))
    finally:
        await client.aclose()

    assert [g.finish_reason for g in generations] == ["length"] * 5
    assert [r.path for r in server.requests].count("/v1/models") == 1
    chats = [json.loads(r.content) for r in server.requests if r.path == "/v1/chat/completions"]
    assert [body["model"] for body in chats] == ["tinyllm"] * 5


async def test_empty_model_list_is_fatal() -> None:
    server = FakeServer(json_reply(200, {"object": "list", "data": []}))
    client = await make_client(server, model=None, api_key=None)
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


def test_the_retry_schedule_doubles_from_the_first_wait_and_is_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "uniform", lambda _low, high: high)  # every wait at its upper bound
    policy = RetryPolicy(max_attempts=7, initial_wait_s=1.0, max_wait_s=20.0)
    later = policy.retrying_after_first(0.0)

    # after attempt 1 (bare), then after attempts 2.. (tenacity's attempts 1..)
    waits = [policy.first_wait_s(0.0)] + [later.wait(SimpleNamespace(attempt_number=k)) for k in range(1, 6)]

    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0]


def test_no_second_attempt_when_one_is_allowed_or_the_deadline_is_spent() -> None:
    assert RetryPolicy(max_attempts=1).first_wait_s(0.0) is None
    assert RetryPolicy(max_total_s=5.0).first_wait_s(5.0) is None
    wait = RetryPolicy(initial_wait_s=0.5, max_total_s=5.0).first_wait_s(1.0)
    assert wait is not None and 0.0 <= wait <= 0.5


async def test_max_total_seconds_stops_retrying() -> None:
    server = FakeServer(captured(SGLANG, "chat_queue_full_503"))
    policy = RetryPolicy(max_attempts=100, initial_wait_s=0.001, max_wait_s=0.002, max_total_s=0.0)

    error = await failure(server, retry=policy)

    assert (type(error), error.attempts) == (TransientRequestError, 1)


async def test_cancelling_a_request_closes_its_stream() -> None:
    started = asyncio.Event()
    closed = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = await sse_head(request, sse_prefix(SGLANG, "chat_stream", 3))
        started.set()
        try:
            while True:  # a keep-alive comment every 10 ms, until the client hangs up
                await asyncio.sleep(0.01)
                await response.write(b": keep-alive\n\n")
        except (ConnectionError, asyncio.CancelledError):
            closed.set()
        return response

    server = FakeServer(endless)
    client = await make_client(server)
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
