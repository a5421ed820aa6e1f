"""Turn chat-completion responses (whole or streamed) into one ``Generation``: pure, no I/O.

The assistant message built here IS the training data, so it is captured exactly: content and
reasoning are concatenated piece by piece with nothing stripped, tool-call arguments are kept as
the raw JSON strings the model produced (validity is judged later, by the validate stage).
Streamed and non-streamed answers produce the same message shape, so downstream code never cares
which mode ran.

Inputs may be the OpenAI SDK's objects or plain dicts (the same JSON): fields are read by name,
because engines add their own (SGLang ``reasoning_content``, vLLM ``reasoning``) that the SDK
only keeps as extras. A response that did not really finish (no ``finish_reason``, or SGLang's
``abort``) raises ``TransientRequestError``: saving it would store a truncated answer as a success.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flows.client.errors import TransientRequestError

Message = dict[str, Any]


@dataclass(slots=True)
class Usage:
    """Token counts as the server reported them (missing counts are 0)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Generation:
    """One regenerated assistant turn plus what the output row records about how it was made."""

    message: Message
    finish_reason: str
    usage: Usage
    model: str
    latency_s: float
    ttft_s: float | None
    attempts: int
    max_tokens: int | None = None
    """The answer's cap where it was not the category's: a prompt near the context was asked with
    the room left beside it (``errors.answer_room``), and its row says so."""


def generation_from_completion(
    completion: Any, *, latency_s: float, attempts: int = 1, default_model: str = ""
) -> Generation:
    """A ``Generation`` from a non-streamed chat completion (first choice)."""
    choices = _get(completion, "choices") or []
    if not choices:
        raise TransientRequestError("response has no choices")
    choice = choices[0]
    finish_reason = _checked_finish_reason(_get(choice, "finish_reason"))
    message = _get(choice, "message")
    tool_calls = [_tool_call(call) for call in _get(message, "tool_calls") or []]
    return Generation(
        message=_assistant_message(_get(message, "content"), _reasoning(message), tool_calls),
        finish_reason=finish_reason,
        usage=usage_from(_get(completion, "usage")),
        model=_get(completion, "model") or default_model,
        latency_s=latency_s,
        ttft_s=None,
        attempts=attempts,
    )


def usage_from(usage: Any) -> Usage:
    """Usage from SGLang's shape (``reasoning_tokens`` at the top) or OpenAI/vLLM's (in details)."""
    if usage is None:
        return Usage()
    completion_details = _get(usage, "completion_tokens_details")
    prompt_details = _get(usage, "prompt_tokens_details")
    reasoning = _get(usage, "reasoning_tokens")
    if reasoning is None:
        reasoning = _get(completion_details, "reasoning_tokens")
    return Usage(
        prompt_tokens=_get(usage, "prompt_tokens") or 0,
        completion_tokens=_get(usage, "completion_tokens") or 0,
        reasoning_tokens=reasoning or 0,
        cached_tokens=_get(prompt_details, "cached_tokens") or 0,
    )


@dataclass(slots=True)
class _ToolCallParts:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class StreamAccumulator:
    """Collects streamed chunks of the first choice into one ``Generation``.

    ``feed`` returns whether the chunk carried generated output, so the caller (who owns the
    clock) can stamp the time to first token without this class reading a clock.
    """

    def __init__(self) -> None:
        self._content: list[str] | None = None
        self._reasoning: list[str] | None = None
        self._tool_calls: dict[tuple[int, int], _ToolCallParts] = {}
        """The calls by their ``index``, then (several calls at one index) in the order they began."""
        self._slots: dict[int, tuple[int, int]] = {}
        """The call each streamed ``index`` adds to now."""
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._model = ""

    def feed(self, chunk: Any) -> bool:
        """Take one chunk; True when it carried content, reasoning or a tool-call piece."""
        self._model = self._model or _get(chunk, "model") or ""
        usage = _get(chunk, "usage")
        if usage is not None:
            self._usage = usage_from(usage)
        carried = False
        for choice in _get(chunk, "choices") or []:
            if (_get(choice, "index") or 0) != 0:
                continue
            delta = _get(choice, "delta")
            if delta is not None:
                carried = self._take_delta(delta)
            self._finish_reason = _get(choice, "finish_reason") or self._finish_reason
        return carried

    def result(
        self, *, latency_s: float, ttft_s: float | None, attempts: int = 1, default_model: str = ""
    ) -> Generation:
        """The finished ``Generation``; raises ``TransientRequestError`` if the stream was cut."""
        if self._finish_reason is None:
            raise TransientRequestError("stream ended without a finish_reason (cut stream)")
        finish_reason = _checked_finish_reason(self._finish_reason)
        tool_calls = [
            {
                "id": parts.id,
                "type": parts.type or "function",
                "function": {"name": parts.name, "arguments": "".join(parts.arguments)},
            }
            for _, parts in sorted(self._tool_calls.items())
        ]
        return Generation(
            message=_assistant_message(_joined(self._content), _joined(self._reasoning), tool_calls),
            finish_reason=finish_reason,
            usage=self._usage or Usage(),
            model=self._model or default_model,
            latency_s=latency_s,
            ttft_s=ttft_s,
            attempts=attempts,
        )

    def _take_delta(self, delta: Any) -> bool:
        content = _get(delta, "content")
        reasoning = _reasoning(delta)
        if content is not None:
            self._content = _appended(self._content, content)
        if reasoning is not None:
            self._reasoning = _appended(self._reasoning, reasoning)
        calls = _get(delta, "tool_calls") or []
        for call in calls:
            self._take_tool_call_delta(call)
        return bool(content) or bool(reasoning) or bool(calls)

    def _take_tool_call_delta(self, call: Any) -> None:
        """One piece of a call: the call at its ``index``, or a new one where the piece brings an id
        other than that call's (some parsers, SGLang's gemma4 among them, stream parallel calls all
        at index 0, each with its own id: glued into one, their arguments read
        ``{"city": "Paris"}{"city": "Rome"}``, a bad row)."""
        index, call_id = _get(call, "index") or 0, _get(call, "id")
        slot = self._slots.get(index)
        if slot is None or (call_id and self._tool_calls[slot].id not in (None, call_id)):
            slot = self._slots[index] = (index, slot[1] + 1 if slot else 0)
            self._tool_calls[slot] = _ToolCallParts()
        parts = self._tool_calls[slot]
        function = _get(call, "function")
        # id, type and name come once (engines send null or repeat them afterwards): first wins.
        parts.id = parts.id or call_id
        parts.type = parts.type or _get(call, "type")
        parts.name = parts.name or _get(function, "name")
        arguments = _get(function, "arguments")
        if arguments:
            parts.arguments.append(arguments)


def _get(obj: Any, name: str) -> Any:
    """A field by name from a dict or an SDK object (whose engine extras live as attributes)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _reasoning(obj: Any) -> str | None:
    """SGLang and older vLLM say ``reasoning_content``; newer vLLM says ``reasoning``."""
    reasoning = _get(obj, "reasoning_content")
    return reasoning if reasoning is not None else _get(obj, "reasoning")


def _checked_finish_reason(finish_reason: Any) -> str:
    """The finish reason as a string; a missing one or SGLang's ``abort`` means no real answer."""
    if finish_reason is None:
        raise TransientRequestError("response has no finish_reason")
    if isinstance(finish_reason, Mapping):  # SGLang's native {"type": ..., "message": ...} form
        finish_reason = finish_reason.get("type")
    if finish_reason in ("abort", "error"):  # vLLM's "error": the request failed mid-way
        what = "aborted by" if finish_reason == "abort" else "failed on"
        raise TransientRequestError(f"request {what} the server (finish_reason {finish_reason!r})")
    return str(finish_reason)


def cut_at_max_tokens(generation: Generation, max_tokens: int) -> Generation:
    """The answer as cut (``finish_reason`` "length") when it made ``max_tokens`` tokens, whatever the
    server said: vLLM streams "tool_calls" for an answer cut while writing its second call, and the
    row (one call, no flag) would teach a drafter to stop after one."""
    if generation.finish_reason != "length" and generation.usage.completion_tokens >= max_tokens:
        generation.finish_reason = "length"
    return generation


def _tool_call(call: Any) -> dict[str, Any]:
    function = _get(call, "function")
    return {
        "id": _get(call, "id"),
        "type": _get(call, "type") or "function",
        "function": {"name": _get(function, "name"), "arguments": _get(function, "arguments") or ""},
    }


def _assistant_message(
    content: str | None, reasoning: str | None, tool_calls: list[dict[str, Any]]
) -> Message:
    return {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": tool_calls or None,
    }


def _appended(pieces: list[str] | None, piece: str) -> list[str]:
    if pieces is None:
        return [piece]
    pieces.append(piece)
    return pieces


def _joined(pieces: list[str] | None) -> str | None:
    return None if pieces is None else "".join(pieces)
