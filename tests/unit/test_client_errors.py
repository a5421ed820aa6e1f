"""classify(), error_for_reply(), error_for_event(): every SDK, aiohttp or HTTP failure lands in
exactly one of transient / permanent / fatal."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx
import openai
import pytest

from flows.client.errors import (
    MAX_REASON_CHARS,
    FatalEndpointError,
    PermanentRequestError,
    RequestError,
    TransientRequestError,
    classify,
    error_for_event,
    error_for_reply,
    error_for_status,
)

# The SDK's errors (model listing) carry a request; typed Any: this SDK is typed for httpx2.
REQUEST: Any = httpx.Request("POST", "http://127.0.0.1:30000/v1/chat/completions")


def status_error(status: int, body: object) -> openai.APIStatusError:
    response: Any = httpx.Response(status, request=REQUEST, json=body)
    return openai.APIStatusError(f"Error code: {status}", response=response, body=body)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, PermanentRequestError),
        (413, PermanentRequestError),
        (422, PermanentRequestError),
        (401, FatalEndpointError),
        (403, FatalEndpointError),
        (404, FatalEndpointError),
        (405, FatalEndpointError),
        (408, TransientRequestError),
        (409, TransientRequestError),
        (429, TransientRequestError),
        (500, TransientRequestError),
        (501, FatalEndpointError),
        (502, TransientRequestError),
        (503, TransientRequestError),
        (504, TransientRequestError),
        (None, TransientRequestError),
    ],
)
def test_status_table(status: int | None, kind: type[RequestError]) -> None:
    error = error_for_status(status, "why")

    assert type(error) is kind
    assert (error.status, error.reason, error.attempts) == (status, "why", 1)


def test_status_error_uses_the_servers_message() -> None:
    sglang_body = {"object": "error", "message": "The request queue is full.", "type": "503", "code": 503}

    error = classify(status_error(503, sglang_body))

    assert type(error) is TransientRequestError
    assert (error.status, error.reason) == (503, "The request queue is full.")


def test_status_error_without_a_message_falls_back_to_the_sdk_text() -> None:
    error = classify(status_error(502, "<html>Bad Gateway</html>"))

    assert (type(error), error.status, error.reason) == (TransientRequestError, 502, "Error code: 502")


def test_nested_error_body_is_unwrapped() -> None:
    body = {"error": {"message": "The model `x` does not exist.", "code": 404}}

    error = classify(status_error(404, body))

    assert (type(error), error.reason) == (FatalEndpointError, "The model `x` does not exist.")


@pytest.mark.parametrize(
    ("body", "kind", "status"),
    [
        (
            {"message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "code": 503},
            TransientRequestError,
            503,
        ),
        ({"message": "The request queue is full.", "code": "503"}, TransientRequestError, 503),
        ({"message": "The request queue is full."}, TransientRequestError, None),
        ({"message": "The request queue is full.", "code": True}, TransientRequestError, None),
        ({"message": "The request queue is full.", "code": 400}, PermanentRequestError, 400),
    ],
)
def test_in_stream_error_event_takes_its_code_from_the_body(
    body: dict[str, object], kind: type[RequestError], status: int | None
) -> None:
    error = error_for_event(body)

    assert (type(error), error.status, error.reason) == (kind, status, "The request queue is full.")


def test_error_event_without_a_message_says_so() -> None:
    assert error_for_event({"code": 503}).reason == "error event in the stream"
    assert error_for_event("queue full").reason == "error event in the stream"


@pytest.mark.parametrize(
    ("status", "body", "kind", "reason"),
    [
        (
            503,
            b'{"object": "error", "message": "The request queue is full.", "type": "503", "code": 503}',
            TransientRequestError,
            "The request queue is full.",
        ),
        (
            404,
            b'{"error": {"message": "The model `x` does not exist.", "code": 404}}',
            FatalEndpointError,
            "The model `x` does not exist.",
        ),
        (400, b'{"detail": "bad"}', PermanentRequestError, '{"detail": "bad"}'),
        (502, b"<html>Bad Gateway</html>\n", TransientRequestError, "<html>Bad Gateway</html>"),
        (500, b"", TransientRequestError, "HTTP 500 with an empty body"),
        (413, b"\xff\xfe too large", PermanentRequestError, "\ufffd\ufffd too large"),
    ],
)
def test_error_reply_uses_the_servers_message_or_its_text(
    status: int, body: bytes, kind: type[RequestError], reason: str
) -> None:
    error = error_for_reply(status, body)

    assert (type(error), error.status, error.reason) == (kind, status, reason)


def test_transport_failures_are_transient() -> None:
    cut = openai.APIConnectionError(request=REQUEST)
    cut.__cause__ = httpx.ReadError("connection reset")

    assert classify(cut).reason == "connection error: ReadError: connection reset"
    assert (
        classify(openai.APIConnectionError(request=REQUEST)).reason
        == "connection error: APIConnectionError: Connection error."
    )
    assert classify(openai.APITimeoutError(request=REQUEST)).reason == "request timed out"
    # what the chat post on aiohttp raises
    assert (
        classify(aiohttp.SocketTimeoutError("slow")).reason == "request timed out: SocketTimeoutError: slow"
    )
    assert (
        classify(aiohttp.ConnectionTimeoutError("slow")).reason
        == "request timed out: ConnectionTimeoutError: slow"
    )
    assert classify(aiohttp.ServerDisconnectedError()).reason == (
        "connection error: ServerDisconnectedError: Server disconnected"
    )
    assert classify(aiohttp.ClientPayloadError("cut")).reason == "connection error: ClientPayloadError: cut"
    assert classify(aiohttp.InvalidURL("h ttp://x")).reason == "InvalidURL: h ttp://x"
    assert all(
        type(classify(exc)) is TransientRequestError
        for exc in (
            cut,
            aiohttp.SocketTimeoutError("slow"),
            aiohttp.ServerDisconnectedError(),
            RuntimeError("odd"),
        )
    )


def test_a_refused_connection_says_so_not_timed_out() -> None:
    """The SDK on aiohttp (``/v1/models``) reports a refused connection as ``APITimeoutError`` over
    ``ConnectTimeout``: a run at a closed port said "request timed out" until it gave up."""
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")
    connector = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None), refused
    )
    timeout = httpx.ConnectTimeout(str(connector))
    timeout.__cause__ = connector
    wrapped = openai.APITimeoutError(request=REQUEST)
    wrapped.__cause__ = timeout

    error = classify(wrapped)

    assert type(error) is TransientRequestError
    assert error.reason.startswith(
        "connection error: ClientConnectorError: Cannot connect to host 127.0.0.1:9"
    )
    assert classify(openai.APITimeoutError(request=REQUEST)).reason == "request timed out"  # a real one


def test_invalid_response_body_is_transient() -> None:
    response: Any = httpx.Response(200, request=REQUEST, content=b"not json")
    error = classify(openai.APIResponseValidationError(response=response, body="not json"))

    assert (type(error), error.status) == (TransientRequestError, 200)
    assert error.reason.startswith("malformed response: ")


def test_our_own_errors_pass_through_with_the_secret_scrubbed() -> None:
    original = PermanentRequestError("too long", status=400, attempts=2)
    echoed = TransientRequestError("queue full for Bearer sk-live-0123456789", status=503)

    assert classify(original) is original
    assert (original.reason, original.status, original.attempts) == ("too long", 400, 2)
    assert classify(echoed, secret="sk-live-0123456789").reason == "queue full for Bearer ***"


def test_secret_is_redacted_everywhere() -> None:
    secret = "sk-live-0123456789"
    error = classify(status_error(401, {"message": f"Incorrect API key provided: {secret}."}), secret=secret)

    assert error.reason == "Incorrect API key provided: ***."
    assert error.args == ("Incorrect API key provided: ***.",)
    assert secret not in str(error) + repr(error)


def test_long_reasons_are_cut() -> None:
    error = classify(status_error(400, {"message": "x" * 5000}))

    assert len(error.reason) == MAX_REASON_CHARS
    assert error.reason.endswith("x…")


def test_str_shows_status_reason_and_attempts() -> None:
    assert str(TransientRequestError("cut stream", attempts=4)) == "cut stream (attempt 4)"
    assert str(FatalEndpointError("bad key", status=401)) == "HTTP 401: bad key (attempt 1)"
