"""Chat completion bodies and SSE chunks in SGLang 0.5.23's exact layout (see the fixtures).

Pure builders: the key order, the nulls and the spacing are what the real server sends, so a
client parsing them here parses them there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang_launch.simulator.answers import AnswerDelta, AnswerPlan, ToolCallPlan
from sglang_launch.simulator.protocol import compact_json, error_body

SSE_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """The fields every body and chunk of one answer repeats."""

    id: str
    created: int
    model: str


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    """SGLang's usage object: ``reasoning_tokens`` at top level, details only when non-zero."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens} if reasoning_tokens else None,
    }


def _tool_call(tool: ToolCallPlan) -> dict[str, Any]:
    return {
        "id": tool.id,
        "index": 0,
        "type": "function",
        "function": {"name": tool.name, "arguments": tool.arguments},
    }


def completion_body(
    head: ResponseHeader, plan: AnswerPlan, text: AnswerDelta, prompt_tokens: int
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` answer (``text`` is the whole answer rendered)."""
    completion_tokens = plan.output_tokens
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text.content,
        "reasoning_content": text.reasoning or None,
    }
    if plan.tool_call is not None and text.tool_started:
        message["tool_calls"] = [_tool_call(plan.tool_call)]
    return {
        "id": head.id,
        "object": "chat.completion",
        "created": head.created,
        "model": head.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": plan.finish_reason,
                "matched_stop": plan.matched_stop,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens, plan.reported_reasoning_tokens),
        "metadata": {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": completion_tokens}],
        },
    }


def _chunk(
    head: ResponseHeader,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    matched_stop: int | None = None,
) -> dict[str, Any]:
    return {
        "id": head.id,
        "object": "chat.completion.chunk",
        "created": head.created,
        "model": head.model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched_stop,
            }
        ],
    }


def role_chunk(head: ResponseHeader) -> dict[str, Any]:
    """The first chunk of every stream."""
    return _chunk(head, {"reasoning_content": None, "role": "assistant", "content": ""})


def _tool_chunk(head: ResponseHeader, tool: ToolCallPlan, opening: bool, arguments: str) -> dict[str, Any]:
    call = {
        "id": tool.id if opening else None,
        "index": 0,
        "type": "function",
        "function": {"name": tool.name if opening else None, "arguments": arguments},
    }
    delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": [call]}
    return {**_chunk(head, delta), "usage": None}


def delta_chunks(head: ResponseHeader, plan: AnswerPlan, delta: AnswerDelta) -> list[dict[str, Any]]:
    """The chunks carrying one run of tokens: reasoning, then content, then tool-call parts."""
    chunks = []
    if delta.reasoning:
        chunks.append(_chunk(head, {"reasoning_content": delta.reasoning}))
    if delta.content:
        chunks.append(_chunk(head, {"reasoning_content": None, "content": delta.content}))
    tool = plan.tool_call
    if tool is not None and delta.tool_started:
        chunks.append(_tool_chunk(head, tool, True, ""))
    if tool is not None and delta.tool_arguments:
        chunks.append(_tool_chunk(head, tool, False, delta.tool_arguments))
    return chunks


def finish_chunk(head: ResponseHeader, plan: AnswerPlan) -> dict[str, Any]:
    """The chunk that carries ``finish_reason``."""
    return _chunk(head, {"reasoning_content": None}, plan.finish_reason, plan.matched_stop)


def usage_chunk(head: ResponseHeader, usage_obj: dict[str, Any]) -> dict[str, Any]:
    """The closing chunk with ``choices: []`` when ``stream_options.include_usage`` is set."""
    return {
        "id": head.id,
        "object": "chat.completion.chunk",
        "created": head.created,
        "model": head.model,
        "choices": [],
        "usage": usage_obj,
    }


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event with compact JSON, as SGLang writes its chunks."""
    return b"data: " + compact_json(obj) + b"\n\n"


def sse_error(message: str, error_type: str, code: int) -> bytes:
    """The in-stream error event; SGLang writes this one with ``json.dumps`` spacing."""
    return b"data: " + json.dumps({"error": error_body(message, error_type, code)}).encode("utf-8") + b"\n\n"
