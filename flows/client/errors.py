"""Request failures, sorted by what the run must do about them.

Three outcomes matter over a days-long run, and mixing them up is costly: retrying a prompt that
can never fit wastes GPU time, rejecting prompts because the API key is wrong throws away the
whole data set, and giving up on a full server queue loses prompts that would have worked a
second later. So every failure becomes exactly one of:

- ``TransientRequestError``: try again (connection trouble, timeouts, 5xx incl. SGLang's
  "The request queue is full.", 429, cut streams, in-stream error events), except 501;
- ``PermanentRequestError``: this prompt can never succeed, reject it (400/413/422);
- ``FatalEndpointError``: the endpoint is misconfigured, stop the run and keep the prompts
  (401/403 bad key, 404 no such model or route, and other 4xx; 501, what vLLM answers for a
  feature it does not implement (``NotImplementedError``), which the category's request options ask
  of every prompt alike; and a server certificate that does not verify: no retry makes an untrusted
  certificate trusted).

``reason`` is written to the rejects table and to logs: short, human, and never the API key.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
import openai

PERMANENT_STATUSES = frozenset({400, 413, 422})
# 4xx codes that say "not now" rather than "never" or "misconfigured".
TRANSIENT_CLIENT_STATUSES = frozenset({408, 409, 425, 429})
NOT_IMPLEMENTED = 501
"""Not "not now": retried, every prompt of the category would be asked 18 times and then rejected."""
MAX_REASON_CHARS = 1000
MIN_ANSWER_ROOM = 64
"""Fewer tokens left for an answer than this beside a prompt, and asking with a smaller
``max_tokens`` is not worth it: the answer would be cut (a flagged row)."""
_OVER_CONTEXT = re.compile(
    r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens from "
    r"the input messages and (\d+) tokens for the completion"
)
_REDACTED = "***"


class RequestError(Exception):
    """A failed request: ``reason`` (short, human), the HTTP ``status`` if any, and ``attempts``
    (set by the client to the attempt that raised it, so an exhausted retry says how many)."""

    def __init__(self, reason: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.attempts = attempts

    @property
    def what(self) -> str:
        """The status and reason without the attempt count: for a person told why the run cannot
        start, where "(attempt 1)" reads as a retry that never was."""
        status = f"HTTP {self.status}: " if self.status is not None else ""
        return f"{status}{self.reason}"

    def __str__(self) -> str:
        return f"{self.what} (attempt {self.attempts})"


class TransientRequestError(RequestError):
    """Worth retrying: the same request may well succeed later."""


class PermanentRequestError(RequestError):
    """The prompt itself is at fault (too long, invalid): reject it, do not retry."""


class FatalEndpointError(RequestError):
    """The endpoint or its configuration is wrong: stop the run rather than reject prompts."""


def error_for_status(status: int | None, reason: str) -> RequestError:
    """The error class an HTTP status calls for; no status (an event without a code) is transient."""
    if status is None or (status >= 500 and status != NOT_IMPLEMENTED) or status in TRANSIENT_CLIENT_STATUSES:
        return TransientRequestError(reason, status=status)
    if status in PERMANENT_STATUSES:
        return PermanentRequestError(reason, status=status)
    return FatalEndpointError(reason, status=status)


def error_for_reply(status: int, body: bytes) -> RequestError:
    """The error an HTTP error reply calls for, with the server's own message when its body has one
    (SGLang's flat ``{"message": ...}``, vLLM's ``{"error": {...}}``), else the body's text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = None
    return error_for_status(status, _body_message(parsed) or text or f"HTTP {status} with an empty body")


def error_for_event(error: object) -> RequestError:
    """An error event inside a 200 stream (SGLang/vLLM queue full): the status is in its body."""
    return error_for_status(_body_code(error), _body_message(error) or "error event in the stream")


def classify(exc: BaseException, *, secret: str | None = None) -> RequestError:
    """Map an exception of the SDK, aiohttp or ours to a ``RequestError``.

    ``secret`` (the API key) is scrubbed from the reason: some servers echo the key back, in 401s
    and in other error bodies. Anything unrecognised is transient, so the retry budget, not a
    guess, decides its fate.
    """
    error = exc if isinstance(exc, RequestError) else _classify_foreign(exc)
    error.reason = _shorten(_redact(error.reason, secret))
    error.args = (error.reason,)
    return error


def _classify_foreign(exc: BaseException) -> RequestError:
    # The innermost one is the socket's own, with OpenSSL's words (aiohttp's wrapper subclasses it).
    certificates = [e for e in _chain(exc) if isinstance(e, ssl.SSLCertVerificationError)]
    if certificates:
        detail = getattr(certificates[-1], "verify_message", None) or str(certificates[-1])
        return FatalEndpointError(
            f"TLS certificate verification failed ({detail}): "
            "set the endpoint's ca_bundle to the CA that signed the server's certificate"
        )
    if isinstance(exc, openai.APIStatusError):
        return error_for_status(exc.status_code, _body_message(exc.body) or exc.message)
    if isinstance(exc, openai.APITimeoutError):
        # the SDK on aiohttp wraps a refused connection as a connect timeout: say what happened
        refused = [e for e in _chain(exc) if isinstance(e, aiohttp.ClientConnectorError)]
        if refused:
            return TransientRequestError(f"connection error: {_describe(refused[0])}")
        return TransientRequestError("request timed out")
    if isinstance(exc, openai.APIConnectionError):
        return TransientRequestError(f"connection error: {_describe(exc.__cause__ or exc)}")
    if isinstance(exc, openai.APIResponseValidationError):
        return TransientRequestError(f"malformed response: {exc.message}", status=exc.status_code)
    # aiohttp's read and connect timeouts are TimeoutErrors (and ClientErrors): test them first.
    if isinstance(exc, TimeoutError):
        return TransientRequestError(f"request timed out: {_describe(exc)}")
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return TransientRequestError(f"connection error: {_describe(exc)}")
    return TransientRequestError(_describe(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it: the SDK wraps the transport's error, which wraps the
    socket's (``ssl``'s verification error under aiohttp's under httpx's under openai's)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _body_message(body: object) -> str | None:
    """The server's own message: SGLang's flat ``{"message": ...}``, or vLLM's ``{"error": {...}}``
    (which the SDK usually unwraps already)."""
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error")
    if isinstance(inner, Mapping):
        return _body_message(inner)
    message = body.get("message")
    return message if isinstance(message, str) and message else None


def _body_code(body: object) -> int | None:
    if not isinstance(body, Mapping):
        return None
    code: Any = body.get("code")
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, _REDACTED) if secret else text


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def answer_room(refused: PermanentRequestError) -> int | None:
    """The ``max_tokens`` that fits beside the prompt, where the server refused the prompt with its
    ``max_tokens`` as over the context (SGLang's 400 says the numbers; vLLM caps the answer itself);
    None where the refusal is another, or the room is under ``MIN_ANSWER_ROOM``.

    Refused, such a prompt was a reject for good: every prompt within ``max_tokens`` of the context
    was lost on SGLang, though a shorter answer would have been served (and is flagged if cut).
    """
    found = _OVER_CONTEXT.search(refused.reason)
    if found is None:
        return None
    context, prompt, asked = (int(number) for number in found.groups())
    room = context - prompt
    return room if MIN_ANSWER_ROOM <= room < asked else None
