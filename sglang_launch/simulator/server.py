"""The HTTP surface: SGLang 0.5.23's routes over the simulated engine, plus ``/sim/*`` admin knobs.

A request that must die with its connection (cut by a fault, dropped by a restart) raises
``ConnectionDropped`` after its response has started: uvicorn then closes the socket, so the
client sees a truncated body with no ``[DONE]``, as when a real server dies mid-answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_launch.simulator.answers import AnswerCursor
from sglang_launch.simulator.config import FaultConfig, SimConfig
from sglang_launch.simulator.engine import Engine, Outcome, Ticket
from sglang_launch.simulator.info import loads_body, model_info_body, models_body, server_info_body
from sglang_launch.simulator.metrics import CONTENT_TYPE, render_metrics
from sglang_launch.simulator.protocol import (
    QUEUE_FULL_MESSAGE,
    RequestError,
    compact_json,
    error_body,
    parse_chat_request,
    queue_full_body,
    size_request,
)
from sglang_launch.simulator.responses import (
    SSE_DONE,
    ResponseHeader,
    completion_body,
    delta_chunks,
    finish_chunk,
    role_chunk,
    sse,
    sse_error,
    usage,
    usage_chunk,
)
from sglang_launch.simulator.scheduler import QueueFullError

SSE_MEDIA_TYPE = "text/event-stream"
SHUTDOWN_GRACE_S = 1  # a stopping server cuts open answers after this, as a dying SGLang would
INTERNAL_ERROR_TEXT = b"Internal Server Error"  # what uvicorn (or a proxy) sends for a crashed handler


class ConnectionDropped(Exception):
    """Raised inside a started response to make uvicorn close the connection mid-body."""


class _QuietDrops(logging.Filter):
    """Keeps uvicorn from logging a traceback for every deliberately dropped connection."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionDropped))


_QUIET_DROPS = _QuietDrops()  # one instance, so repeated create_app calls add it only once


def _json(obj: Any, status: int = 200) -> Response:
    return Response(compact_json(obj), status_code=status, media_type="application/json")


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


class _DroppedResponse(Response):
    """Sends a status line and headers, then drops the connection before any body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise ConnectionDropped


class _HttpCounter:
    """ASGI middleware feeding ``sglang:http_requests_total`` / ``http_responses_total``."""

    def __init__(self, app: ASGIApp, routes: set[str]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.routes:
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                engine: Engine = scope["app"].state.engine  # Starlette sets scope["app"]
                engine.http.record(scope["path"], scope["method"], message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


class _ApiKey:
    """ASGI middleware: SGLang's ``--api-key`` check (health, metrics and the /sim knobs stay open), or
    with ``key_on_health`` a gateway's, which wants the key on ``/health`` too."""

    def __init__(self, app: ASGIApp, key: str | None, key_on_health: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode() if key else None
        self.open_paths: tuple[str, ...] = (
            ("/metrics", "/sim/") if key_on_health else ("/health", "/metrics", "/sim/")
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        open_path = path.startswith(self.open_paths)
        if scope["type"] != "http" or self.expected is None or open_path:
            await self.app(scope, receive, send)
            return
        if dict(scope["headers"]).get(b"authorization") == self.expected:
            await self.app(scope, receive, send)
            return
        await _json({"error": "Unauthorized"}, 401)(scope, receive, send)


def _unavailable(reason: str) -> Response:
    return _json(error_body(f"The server is not ready ({reason}).", "ServiceUnavailable", 503), 503)


Handler = Callable[[Request], Awaitable[Response]]


def _when_up(handler: Handler) -> Handler:
    """Answer 503 while the server is starting or restarting, as an unready SGLang would."""

    async def guarded(request: Request) -> Response:
        reason = _engine(request).unavailable_reason()
        return _unavailable(reason) if reason else await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


# ----- chat --------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``: validate, queue, then answer streamed or whole."""
    engine = _engine(request)
    try:
        chat = parse_chat_request(await request.body())
        sized = size_request(chat, engine.cfg.context_length)
    except RequestError as exc:
        return _json(exc.body, exc.status)
    if engine.cfg.faults.extra_latency_s:
        await asyncio.sleep(engine.cfg.faults.extra_latency_s)
    if _kills(chat.messages, engine.cfg.faults.crash_on_text):
        os._exit(KILLED_EXIT)  # no cleanup, no response: as a server process that faulted
    if engine.inject_500():
        return Response(INTERNAL_ERROR_TEXT, status_code=500, media_type="text/plain; charset=utf-8")
    head = ResponseHeader(uuid.uuid4().hex, int(time.time()), chat.model)
    try:
        ticket = engine.submit(sized, streaming=chat.stream)
    except QueueFullError:
        if chat.stream:
            return StreamingResponse(_refused_stream(head, chat.include_usage), media_type=SSE_MEDIA_TYPE)
        return _json(queue_full_body(), 503)
    if chat.stream:
        return StreamingResponse(_stream(engine, ticket, head, chat.include_usage), media_type=SSE_MEDIA_TYPE)
    return await _complete(request, engine, ticket, head)


KILLED_EXIT = 134
"""The exit status of a process aborted (SIGABRT), as a CUDA fault's ends."""


def _kills(messages: list[dict[str, Any]], text: str | None) -> bool:
    """Whether a message's text content holds ``crash_on_text``."""
    if not text:
        return False
    return any(text in str(message.get("content") or "") for message in messages)


async def _refused_stream(head: ResponseHeader, include_usage: bool) -> AsyncIterator[bytes]:
    """A stream SGLang refuses after the 200: the error event, zero usage, ``[DONE]``."""
    yield sse_error(QUEUE_FULL_MESSAGE, "SERVICE_UNAVAILABLE", 503)
    if include_usage:
        yield sse(usage_chunk(head, usage(0, 0)))
    yield SSE_DONE


async def _wait(ticket: Ticket) -> None:
    await ticket.changed.wait()
    ticket.changed.clear()


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body is already read, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(request: Request, engine: Engine, ticket: Ticket, head: ResponseHeader) -> Response:
    """Wait for the whole answer; a client that hangs up aborts its request, as in SGLang."""
    watcher = asyncio.create_task(_client_gone(request))
    try:
        while ticket.outcome is None and not watcher.done():
            waiter = asyncio.create_task(_wait(ticket))
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
    finally:
        watcher.cancel()
        engine.forget(ticket)
    if ticket.outcome is Outcome.QUEUE_FULL:
        return _json(queue_full_body(), 503)
    if ticket.outcome is not Outcome.FINISHED:
        return _DroppedResponse()
    plan = ticket.plan
    text = AnswerCursor(plan).advance(plan.output_tokens)
    return _json(completion_body(head, plan, text, ticket.prompt_tokens))


async def _stream(
    engine: Engine, ticket: Ticket, head: ResponseHeader, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE chunks as the engine releases tokens; the role chunk comes with the first ones."""
    plan, cursor = ticket.plan, AnswerCursor(ticket.plan)
    faults, stall_at = engine.cfg.faults, ticket.stall_at
    try:
        if faults.first_token_delay_s:
            await asyncio.sleep(faults.first_token_delay_s)
        while True:
            await _wait(ticket)
            if stall_at is not None and ticket.released >= stall_at:
                stall_at = None  # silent, connection open: only the client's read timeout ends this
                engine.stats.streams_stalled += 1
                await asyncio.sleep(faults.stall_s)
            out = []
            if ticket.released and not cursor.position:
                out.append(sse(role_chunk(head)))
            if ticket.released > cursor.position:
                delta = cursor.advance(ticket.released - cursor.position)
                out += [sse(chunk) for chunk in delta_chunks(head, plan, delta)]
            out += _stream_ending(ticket, head, include_usage)
            if out:
                yield b"".join(out)
            if ticket.outcome in (Outcome.FINISHED, Outcome.QUEUE_FULL):
                return
            if ticket.outcome is not None:
                raise ConnectionDropped(ticket.outcome.value)
    finally:
        engine.forget(ticket)


def _stream_ending(ticket: Ticket, head: ResponseHeader, include_usage: bool) -> list[bytes]:
    """The events closing a stream that ends in-band: finished, or refused after a retraction."""
    if ticket.outcome is Outcome.QUEUE_FULL:
        return [sse_error(QUEUE_FULL_MESSAGE, "SERVICE_UNAVAILABLE", 503), SSE_DONE]
    if ticket.outcome is not Outcome.FINISHED:
        return []
    plan = ticket.plan
    closing = [sse(finish_chunk(head, plan))]
    if include_usage:
        answer_usage = usage(ticket.prompt_tokens, plan.output_tokens, plan.reported_reasoning_tokens)
        closing.append(sse(usage_chunk(head, answer_usage)))
    return [*closing, SSE_DONE]


# ----- info --------------------------------------------------------------------------------


async def health(request: Request) -> Response:
    """``GET /health``: 200 with an empty body when ready, 503 while starting or restarting."""
    return Response(status_code=503 if _engine(request).unavailable_reason() else 200)


async def models(request: Request) -> Response:
    return _json(models_body(_engine(request).cfg, request.app.state.created))


async def server_info(request: Request) -> Response:
    engine = _engine(request)
    return _json(server_info_body(engine.cfg, engine.gauges.gauges))


async def model_info(request: Request) -> Response:
    return _json(model_info_body(_engine(request).cfg))


async def loads(request: Request) -> Response:
    engine = _engine(request)
    return _json(loads_body(engine.cfg, engine.scheduler, engine.gauges.gauges, time.time()))


async def metrics(request: Request) -> Response:
    return Response(render_metrics(_engine(request).metrics_view()), media_type=CONTENT_TYPE)


# ----- admin -------------------------------------------------------------------------------


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    payload = json.loads(raw) if raw.strip() else {}
    if not isinstance(payload, dict):
        raise ValueError("expected a JSON object")
    return payload


async def sim_faults(request: Request) -> Response:
    """``GET`` the fault knobs, or ``POST`` some of their fields to change them at run time."""
    engine = _engine(request)
    if request.method == "POST":
        try:
            update = await _json_object(request)
            engine.set_faults(FaultConfig.model_validate({**engine.cfg.faults.model_dump(), **update}))
        except (ValueError, ValidationError) as exc:
            return _json(error_body(str(exc), "BadRequestError", 400), 400)
    return _json(engine.cfg.faults.model_dump())


async def sim_answers(request: Request) -> Response:
    """``GET`` the answer knobs (stop_probability, reasoning, ...), or ``POST`` some to change them."""
    engine = _engine(request)
    if request.method == "POST":
        try:
            engine.set_answers(await _json_object(request))
        except (ValueError, ValidationError) as exc:
            return _json(error_body(str(exc), "BadRequestError", 400), 400)
    return _json({k: v for k, v in asdict(engine.settings).items() if k != "seed"})


async def sim_restart(request: Request) -> Response:
    """``POST {"downtime_s": s}`` (optional): drop everything, reset, be down for a while."""
    engine = _engine(request)
    try:
        downtime = float(
            (await _json_object(request)).get("downtime_s", engine.cfg.faults.restart_downtime_s)
        )
    except (ValueError, TypeError) as exc:
        return _json(error_body(str(exc), "BadRequestError", 400), 400)
    engine.restart(downtime)
    return _json({"restarting": True, "downtime_s": downtime})


async def sim_stats(request: Request) -> Response:
    return _json(_engine(request).stats_body())


def create_app(cfg: SimConfig) -> Starlette:
    """The ASGI app: the engine starts and stops with the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.engine = Engine(cfg)
        app.state.created = int(time.time())
        task = asyncio.create_task(app.state.engine.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    routes = [
        Route("/v1/chat/completions", _when_up(chat_completions), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/v1/models", _when_up(models), methods=["GET"]),
        Route("/get_server_info", _when_up(server_info), methods=["GET"]),
        Route("/server_info", _when_up(server_info), methods=["GET"]),
        Route("/get_model_info", _when_up(model_info), methods=["GET"]),
        Route("/model_info", _when_up(model_info), methods=["GET"]),
        Route("/v1/loads", _when_up(loads), methods=["GET"]),
        Route("/metrics", _when_up(metrics), methods=["GET"]),
        Route("/sim/faults", sim_faults, methods=["GET", "POST"]),
        Route("/sim/answers", sim_answers, methods=["GET", "POST"]),
        Route("/sim/restart", sim_restart, methods=["POST"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
    ]
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
    counted = {r.path for r in routes if not r.path.startswith("/sim/")}
    middleware = [
        Middleware(_HttpCounter, routes=counted),
        Middleware(_ApiKey, key=cfg.api_key, key_on_health=cfg.key_on_health),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


def serve(cfg: SimConfig) -> None:
    """Run the simulator in the foreground until interrupted (``python -m sglang_launch.simulator``)."""
    logging.basicConfig(
        level=cfg.log_level.upper(), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
    )
    uvicorn.run(
        create_app(cfg),
        host=cfg.host,
        port=cfg.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
