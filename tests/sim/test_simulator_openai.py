"""The OpenAI SDK reads the simulator's answers: plain, streamed, with reasoning and tool calls."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import openai

if TYPE_CHECKING:
    from conftest import StartSim

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


async def test_sdk_reads_a_plain_and_a_streamed_answer(start_sim: StartSim) -> None:
    sim = start_sim(stop_probability=0.0)
    async with client(sim.url) as api:
        whole = await api.chat.completions.create(model="tinyllm", messages=ASK, max_tokens=24)
        stream = await api.chat.completions.create(
            model="tinyllm", messages=ASK, max_tokens=24, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert whole.choices[0].finish_reason == "length" and whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (15, 24)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24


async def test_sdk_reads_reasoning_content(start_sim: StartSim) -> None:
    sim = start_sim(reasoning=True, reasoning_fraction=0.25, stop_probability=0.0)
    extra = {"chat_template_kwargs": {"thinking": True}, "separate_reasoning": True}
    async with client(sim.url) as api:
        whole = await api.chat.completions.create(
            model="tinyllm", messages=ASK, max_tokens=40, extra_body=extra
        )
        stream = await api.chat.completions.create(
            model="tinyllm",
            messages=ASK,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        chunks = [chunk async for chunk in stream]
    message: Any = whole.choices[0].message
    assert message.reasoning_content and message.content
    assert whole.usage is not None and whole.usage.completion_tokens == 40
    assert whole.usage.model_extra == {"reasoning_tokens": 10}
    assert whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 10
    deltas: list[Any] = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == message.content


async def test_thinking_off_means_no_reasoning(start_sim: StartSim) -> None:
    sim = start_sim(reasoning=True)
    async with client(sim.url) as api:
        whole = await api.chat.completions.create(
            model="tinyllm",
            messages=ASK,
            max_tokens=20,
            extra_body={"chat_template_kwargs": {"thinking": False}},
        )
    message: Any = whole.choices[0].message
    assert message.reasoning_content is None and message.content


async def test_sdk_reads_a_tool_call(start_sim: StartSim) -> None:
    sim = start_sim(tool_calls=True)
    async with client(sim.url) as api:
        whole = await api.chat.completions.create(
            model="tinyllm", messages=ASK, max_tokens=200, tools=[WEATHER_TOOL], tool_choice="required"
        )
        stream = await api.chat.completions.create(
            model="tinyllm",
            messages=ASK,
            max_tokens=200,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    calls: Any = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "get_weather"
    arguments = json.loads(calls[0].function.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
    # Streamed: the first tool delta has id and name, later ones only argument fragments.
    tool_deltas: list[Any] = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert tool_deltas[0].id == calls[0].id and tool_deltas[0].function.name == "get_weather"
    assert all(d.id is None and d.function.name is None for d in tool_deltas[1:])
    assert "".join(d.function.arguments for d in tool_deltas) == calls[0].function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_queue_full_is_an_sdk_503(start_sim: StartSim) -> None:
    sim = start_sim(faults={"error_503_rate": 1.0})
    async with client(sim.url) as api:
        try:
            await api.chat.completions.create(model="tinyllm", messages=ASK, max_tokens=8)
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and "The request queue is full." in str(exc)
        else:
            raise AssertionError("expected a 503")
