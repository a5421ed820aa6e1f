"""The chat request as SGLang 0.5.23 accepts it, and its error bodies byte for byte.

Validation mirrors the real server's order and wording (captured in the fixtures): malformed
JSON and schema errors are 400 with FastAPI's pydantic error list, then the prompt is checked
against the context length (400, also for ``stream: true``, as plain JSON), then
prompt + ``max_tokens`` against it. Any model name is accepted and echoed back, as SGLang does
without LoRA adapters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from sglang_launch.simulator.answers import AnswerRequest, estimate_prompt_tokens

CHAT_ENDPOINT = "/v1/chat/completions"
QUEUE_FULL_MESSAGE = "The request queue is full."


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` changes the output."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of SGLang's ChatCompletionRequest the simulator reads; others are accepted."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]]
    model: str = "default"
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    ignore_eos: bool = False

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (SGLang's default is off)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def thinking(self) -> bool:
        """Thinking is on unless the template kwargs turn it off (Kimi/DeepSeek or Qwen3 spelling)."""
        kwargs = self.chat_template_kwargs or {}
        return kwargs.get("thinking", True) is not False and kwargs.get("enable_thinking", True) is not False


class RequestError(Exception):
    """A request the server refuses before queueing it; ``body`` is SGLang's JSON error."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["message"])
        self.status = status
        self.body = body


def error_body(message: str, error_type: str, code: int) -> dict[str, Any]:
    """SGLang's OpenAI-style error object (key order as served)."""
    return {"object": "error", "message": message, "type": error_type, "param": None, "code": code}


def compact_json(obj: Any) -> bytes:
    """JSON the way SGLang's ORJSONResponse writes it: no spaces, UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def queue_full_body() -> dict[str, Any]:
    """The non-streaming 503 answer when the waiting queue is at its cap."""
    return error_body(QUEUE_FULL_MESSAGE, "503", 503)


def _validation_error(errors: list[dict[str, Any]]) -> RequestError:
    """FastAPI's RequestValidationError as SGLang renders it (without the server's file path)."""
    count = len(errors)
    lines = "".join(f"  {err}\n" for err in errors)
    message = (
        f"{count} validation error{'s' if count != 1 else ''}:\n{lines}\n  POST {CHAT_ENDPOINT} {errors}"
    )
    return RequestError(400, error_body(message, "Bad Request", 400))


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Decode and validate a request body, raising ``RequestError`` with SGLang's 400 body."""
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise _validation_error([{**error, "ctx": {"error": exc.msg}}]) from None
    try:
        return ChatRequest.model_validate(payload)
    except ValidationError as exc:
        errors = [
            {"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"], "input": e["input"]}
            for e in exc.errors(include_url=False)
        ]
        raise _validation_error(errors) from None


@dataclass(frozen=True, slots=True)
class SizedRequest:
    """A validated request with its token sizes settled."""

    request: ChatRequest
    prompt_tokens: int
    max_new_tokens: int

    def answer_request(self) -> AnswerRequest:
        """What the answer planner needs from it."""
        req = self.request
        return AnswerRequest(
            messages=req.messages,
            max_new_tokens=self.max_new_tokens,
            tools=req.tools,
            tool_choice=req.tool_choice,
            thinking=req.thinking,
            separate_reasoning=req.separate_reasoning,
            ignore_eos=req.ignore_eos,
        )


def size_request(request: ChatRequest, context_length: int) -> SizedRequest:
    """Count the prompt and settle ``max_new_tokens`` exactly as SGLang's checks do.

    Without ``max_tokens`` SGLang lets the answer run to the end of the context
    (``max_req_len - prompt - 1`` with ``max_req_len = context_length - 1``).
    """
    prompt = estimate_prompt_tokens(request.messages, request.tools)
    if prompt >= context_length:
        message = (
            f"The input ({prompt} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
        raise RequestError(400, error_body(message, "BadRequestError", 400))
    asked = request.max_tokens if request.max_tokens is not None else request.max_completion_tokens
    if asked is None:
        return SizedRequest(request, prompt, max(1, context_length - 2 - prompt))
    if asked < 1:
        raise RequestError(
            400, error_body(f"max_new_tokens must be at least 1, got {asked}.", "BadRequestError", 400)
        )
    if prompt + asked >= context_length:
        message = (
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {prompt + asked} tokens: {prompt} tokens from the input messages and "
            f"{asked} tokens for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
        raise RequestError(400, error_body(message, "BadRequestError", 400))
    return SizedRequest(request, prompt, asked)
