"""Request validation and error bodies, compared byte for byte with the real server's."""

from __future__ import annotations

import ast
import json
from typing import TYPE_CHECKING

import pytest

from sglang_launch.simulator.protocol import (
    ChatRequest,
    RequestError,
    compact_json,
    parse_chat_request,
    queue_full_body,
    size_request,
)

if TYPE_CHECKING:
    from conftest import Captured


def body(**fields: object) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": "tinyllm", "messages": messages, **fields}).encode()


def user_with_prompt_tokens(tokens: int) -> list[dict[str, str]]:
    """One user message whose estimated prompt is exactly ``tokens`` (3 + 4 + chars/4)."""
    return [{"role": "user", "content": "x" * 4 * (tokens - 7)}]


def test_prompt_longer_than_the_context_is_the_real_400(captured: Captured) -> None:
    chat = ChatRequest(messages=user_with_prompt_tokens(2410), max_tokens=16)
    with pytest.raises(RequestError) as err:
        size_request(chat, 1024)
    assert err.value.status == 400
    assert compact_json(err.value.body) == captured.bytes("chat_too_long.json")


def test_prompt_plus_max_tokens_over_the_context_is_the_real_400(captured: Captured) -> None:
    chat = ChatRequest(messages=user_with_prompt_tokens(850), max_tokens=600)
    with pytest.raises(RequestError) as err:
        size_request(chat, 1024)
    assert compact_json(err.value.body) == captured.bytes("chat_prompt_plus_max_tokens_over_ctx.json")


def test_max_tokens_settles_the_answer_budget() -> None:
    messages = user_with_prompt_tokens(100)
    assert size_request(ChatRequest(messages=messages, max_tokens=923), 1024).max_new_tokens == 923
    assert size_request(ChatRequest(messages=messages, max_completion_tokens=50), 1024).max_new_tokens == 50
    # Without max_tokens SGLang lets the answer run to the end of the context.
    assert size_request(ChatRequest(messages=messages), 1024).max_new_tokens == 1024 - 2 - 100
    with pytest.raises(RequestError):
        size_request(ChatRequest(messages=messages, max_tokens=924), 1024)  # 100 + 924 >= 1024
    with pytest.raises(RequestError):
        size_request(ChatRequest(messages=messages, max_tokens=0), 1024)


def test_schema_errors_are_fastapi_validation_lists_like_the_real_ones(captured: Captured) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(b'{"messages": "this should be a list", "max_tokens": "sixteen"}')
    ours, real = err.value.body, captured.json("chat_invalid_schema.json")
    assert err.value.status == ours["code"] == real["code"] == 400
    assert ours["type"] == real["type"] == "Bad Request"
    assert list(ours) == list(real)
    # The head (count and each error dict) and the trailing error list are identical; the real
    # message has the server's source file path in between.
    assert ours["message"].split("\n\n")[0] == real["message"].split("\n\n")[0]
    marker = "POST /v1/chat/completions "
    assert ours["message"].split(marker)[1] == real["message"].split(marker)[1]


def test_malformed_json_is_a_json_invalid_validation_error(captured: Captured) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(b'{"model": "tinyllm", "messages": [{"role": "user", "content": "hi"}')
    real = captured.json("chat_malformed_json.json")
    assert (err.value.body["type"], err.value.body["code"]) == (real["type"], 400)
    first_line, error_line = err.value.body["message"].split("\n")[:2]
    assert first_line == real["message"].split("\n")[0] == "1 validation error:"
    error = ast.literal_eval(error_line.strip())
    assert (error["type"], error["loc"][0], error["msg"]) == ("json_invalid", "body", "JSON decode error")


def test_queue_full_body_is_the_real_503(captured: Captured) -> None:
    assert compact_json(queue_full_body()) == captured.bytes("chat_queue_full_503.json")


def test_extras_at_top_level_are_read() -> None:
    chat = parse_chat_request(
        body(
            stream=True,
            stream_options={"include_usage": True},
            chat_template_kwargs={"thinking": False},
            separate_reasoning=False,
            temperature=0.7,
        )
    )
    assert chat.stream and chat.include_usage and not chat.thinking and not chat.separate_reasoning
    assert ChatRequest(messages=[], chat_template_kwargs={"enable_thinking": False}).thinking is False
    assert ChatRequest(messages=[]).thinking and not ChatRequest(messages=[]).include_usage
