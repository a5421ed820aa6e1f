"""Building a Generation from real SGLang/vLLM response bytes, streamed and not (pure, no HTTP)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.client.errors import TransientRequestError
from flows.client.responses import (
    Generation,
    StreamAccumulator,
    Usage,
    generation_from_completion,
    usage_from,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

R1_REASONING_STREAM = (
    " shdicate..clediff year sep]].__ingxtenody non Raisewor through implement).COLiss andstartswith"
    ' indexboundary topSUP optionsakeYat magic >> tzreducequit ",Formity80ular args kind names browser."'
    " theiroperatorgth"
)
QWEN3_REASONING_STREAM = (
    "bels success case server charsnonMETHOD,WrapperfullchunkTIONAL convertpick annotail computestderr"
    " listsbelspathnameume appropri integergerACblockpareattrsampish*' zlib reservedreak executedciconvert"
    "\ufffd\ufffdformatwidthready().delim OSError waquote"
)
R1_REASONING = (
    " indicate\ufffdIIang completeellmlinksBU copy site21tegerpartial headernot                   INGdescri"
    "field streamLOADas Theseflow network membersTHON constructor By cannot as buildsetCEimumendianpart   "
    "           annot bo arbitspecpartFilecate inprecationWarningpoll"
)


def sse_events(engine: str, name: str) -> list[dict[str, Any]]:
    """The JSON payloads of a captured SSE body, in order, without the ``[DONE]`` sentinel."""
    text = (FIXTURES / engine / f"{name}.sse").read_text(encoding="utf-8")
    return [
        json.loads(line.removeprefix("data: "))
        for line in text.split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def completion(engine: str, name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / engine / f"{name}.json").read_text(encoding="utf-8"))


def accumulate(events: list[dict[str, Any]]) -> tuple[list[bool], Generation]:
    accumulator = StreamAccumulator()
    carried = [accumulator.feed(event) for event in events]
    return carried, accumulator.result(latency_s=2.5, ttft_s=0.25, attempts=2, default_model="fallback")


def tool_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def test_sglang_plain_stream_is_concatenated_exactly() -> None:
    carried, generation = accumulate(sse_events("sglang-0.5.23", "chat_stream"))

    assert generation.message == {
        "role": "assistant",
        "content": " rindo\ufffd link"
        + "#" * 64
        + " next dictionary norm optional\ufffdUToptsbitsnchannels tuple config",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert generation.finish_reason == "length"
    assert generation.usage == Usage(
        prompt_tokens=22, completion_tokens=16, reasoning_tokens=0, cached_tokens=0
    )
    assert (generation.model, generation.latency_s, generation.ttft_s, generation.attempts) == (
        "tinyllm",
        2.5,
        0.25,
        2,
    )
    # The role chunk (content "") carries no output; the 13 text chunks do; finish and usage do not.
    assert carried == [False] + [True] * 12 + [False, False]


def test_vllm_stream_with_content_in_the_finish_chunk() -> None:
    carried, generation = accumulate(sse_events("vllm-0.32.0", "chat_stream"))

    assert (
        generation.message["content"]
        == "valuesresponse,-condsDING supplied contents down\ufffdipupdateComp'),lablecardturtle"
    )
    assert generation.message["reasoning_content"] is None
    assert generation.finish_reason == "length"
    assert generation.usage == Usage(prompt_tokens=22, completion_tokens=16)
    assert carried[0] is False
    assert carried[9] is False  # vLLM's empty content delta mid-stream is not output
    assert carried[-2] is True  # last token and finish_reason arrive together
    assert carried[-1] is False  # usage chunk


@pytest.mark.parametrize(
    ("name", "reasoning"),
    [
        ("parsers_r1_qwen25_chat_reasoning_stream", R1_REASONING_STREAM),
        ("parsers_qwen3_hermes_chat_reasoning_stream", QWEN3_REASONING_STREAM),
    ],
)
def test_reasoning_stream_goes_to_reasoning_content(name: str, reasoning: str) -> None:
    _, generation = accumulate(sse_events("sglang-0.5.23", name))

    assert generation.message == {
        "role": "assistant",
        "content": "",
        "reasoning_content": reasoning,
        "tool_calls": None,
    }
    assert generation.usage == Usage(prompt_tokens=23, completion_tokens=48, reasoning_tokens=48)


def test_tool_call_stream_joins_argument_pieces_by_index() -> None:
    carried, generation = accumulate(sse_events("sglang-0.5.23", "parsers_qwen25_regex_toolcall_stream"))

    assert generation.message == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": [tool_call("call_bd87fc585f6045578250364f", '{"city": "Paris"}')],
    }
    assert json.loads(generation.message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert generation.finish_reason == "tool_calls"
    assert generation.usage == Usage(prompt_tokens=22, completion_tokens=61)
    assert carried == [False, True, True, True, True, True, False, False]


def test_tool_call_cut_by_max_tokens_is_kept_raw() -> None:
    _, generation = accumulate(sse_events("sglang-0.5.23", "parsers_qwen25_tools_required_max400_stream"))

    assert generation.message["tool_calls"] == [
        tool_call(
            "call_2cf123a231274521b8bea037", "990225500319256242553424409306444603660212556413813885047801"
        )
    ]
    assert generation.finish_reason == "length"
    assert generation.usage.completion_tokens == 400


@pytest.mark.parametrize(
    ("engine", "name", "content", "finish_reason", "usage"),
    [
        (
            "sglang-0.5.23",
            "chat_nonstream",
            ' ()warnings erroption untilMapping port""(% even symboecolor Donpropertyentsextractbeldedereds'
            "segetattrRORigin interpreublicright L ()ish.%message",
            "length",
            Usage(prompt_tokens=22, completion_tokens=32),
        ),
        (
            "vllm-0.32.0",
            "chat_nonstream",
            " equivalent overriddenrangeABLESP waitunt his trydu per msg namedtupleprecationWarningcheme mult"
            " corspacepolluration fieldstart specificmporter supportheritSIONcli__(cal (_",
            "length",
            Usage(prompt_tokens=22, completion_tokens=32),
        ),
    ],
)
def test_plain_completion(engine: str, name: str, content: str, finish_reason: str, usage: Usage) -> None:
    generation = generation_from_completion(completion(engine, name), latency_s=1.5, attempts=3)

    assert generation.message == {
        "role": "assistant",
        "content": content,
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert (generation.finish_reason, generation.usage) == (finish_reason, usage)
    assert (generation.model, generation.latency_s, generation.ttft_s, generation.attempts) == (
        "tinyllm",
        1.5,
        None,
        3,
    )


def test_vllm_accepted_prompt_plus_max_tokens_stops_normally() -> None:
    generation = generation_from_completion(
        completion("vllm-0.32.0", "chat_prompt_plus_max_tokens_over_ctx"), latency_s=1.0
    )

    assert generation.finish_reason == "stop"
    assert generation.usage == Usage(prompt_tokens=850, completion_tokens=96)
    assert generation.message["content"].startswith(" readingmessagein keyspolMTPrappare ")
    assert generation.message["content"].endswith("akrefgroup test; issubclass")


def test_reasoning_completion() -> None:
    generation = generation_from_completion(
        completion("sglang-0.5.23", "parsers_r1_qwen25_chat_reasoning"), latency_s=1.0
    )

    assert generation.message["content"] == ""
    assert generation.message["reasoning_content"] == R1_REASONING
    assert generation.usage == Usage(prompt_tokens=23, completion_tokens=48, reasoning_tokens=48)


def test_tool_call_completion_drops_the_index_field() -> None:
    generation = generation_from_completion(
        completion("sglang-0.5.23", "parsers_qwen25_regex_toolcall"), latency_s=1.0
    )

    assert generation.message["tool_calls"] == [
        tool_call("call_286d338b98994bdfadc5144c", '{"city": "Paris"}')
    ]
    assert generation.message["content"] == ""
    assert generation.finish_reason == "tool_calls"

    invalid = generation_from_completion(
        completion("sglang-0.5.23", "parsers_qwen25_tools_required_max400"), latency_s=1.0
    )
    assert invalid.message["tool_calls"] == [tool_call("call_b4bb9958cda1491a8287243e", "Infinity")]
    assert invalid.finish_reason == "length"


def test_newer_vllm_reasoning_field_is_read_streamed_and_not() -> None:
    chunks = [
        {"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"model": "m", "choices": [{"index": 0, "delta": {"reasoning": "Let me "}}]},
        {"model": "m", "choices": [{"index": 0, "delta": {"reasoning": "think."}}]},
        {"model": "m", "choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]},
    ]
    carried, generation = accumulate(chunks)

    assert carried == [False, True, True, True]
    assert generation.message["reasoning_content"] == "Let me think."
    assert generation.message["content"] == "42"
    assert generation.usage == Usage()  # no usage chunk: zeros, not a failure

    whole = {
        "model": "m",
        "choices": [
            {
                "message": {"role": "assistant", "content": "42", "reasoning": "Let me think."},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 4},
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }
    generation = generation_from_completion(whole, latency_s=1.0)
    assert generation.message["reasoning_content"] == "Let me think."
    assert generation.usage == Usage(
        prompt_tokens=10, completion_tokens=7, reasoning_tokens=4, cached_tokens=8
    )


def test_two_interleaved_tool_calls_are_kept_apart_and_ordered() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}}]}

    chunks = [
        call(1, id="b", type="function", function={"name": "g", "arguments": ""}),
        call(0, id="a", type="function", function={"name": "f", "arguments": '{"x"'}),
        call(1, id=None, function={"name": None, "arguments": '{"y": 2}'}),
        call(0, function={"arguments": ": 1}"}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    _, generation = accumulate(chunks)

    assert generation.message["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"y": 2}'}},
    ]
    assert generation.message["content"] is None  # no content delta at all
    assert generation.model == "fallback"


def test_stream_cut_before_finish_reason_is_transient() -> None:
    events = sse_events("sglang-0.5.23", "chat_stream")[:5]
    accumulator = StreamAccumulator()
    for event in events:
        accumulator.feed(event)

    with pytest.raises(TransientRequestError, match="cut stream"):
        accumulator.result(latency_s=1.0, ttft_s=0.1)


def test_server_abort_is_transient_not_an_answer() -> None:
    aborted = {"model": "m", "choices": [{"message": {"content": "par"}, "finish_reason": "abort"}]}
    with pytest.raises(TransientRequestError, match="aborted"):
        generation_from_completion(aborted, latency_s=1.0)

    accumulator = StreamAccumulator()
    accumulator.feed({"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": "abort"}]})
    with pytest.raises(TransientRequestError, match="aborted"):
        accumulator.result(latency_s=1.0, ttft_s=0.1)


def test_completion_without_choices_or_finish_reason_is_transient() -> None:
    with pytest.raises(TransientRequestError, match="no choices"):
        generation_from_completion({"model": "m", "choices": []}, latency_s=1.0)
    with pytest.raises(TransientRequestError, match="no finish_reason"):
        generation_from_completion(
            {"choices": [{"message": {"content": "x"}, "finish_reason": None}]}, latency_s=1
        )


def test_usage_shapes() -> None:
    assert usage_from(None) == Usage()
    sglang = {
        "prompt_tokens": 23,
        "completion_tokens": 48,
        "reasoning_tokens": 48,
        "prompt_tokens_details": None,
    }
    assert usage_from(sglang) == Usage(prompt_tokens=23, completion_tokens=48, reasoning_tokens=48)


def test_other_choices_are_ignored() -> None:
    chunks = [
        {"choices": [{"index": 1, "delta": {"content": "other"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "delta": {"content": "mine"}, "finish_reason": "length"}]},
    ]
    carried, generation = accumulate(chunks)

    assert carried == [False, True]
    assert (generation.message["content"], generation.finish_reason) == ("mine", "length")


def test_parallel_calls_streamed_at_one_index_with_their_own_ids_stay_apart() -> None:
    """SGLang's gemma4 parser (and others) stream parallel calls all at index 0, each with its id:
    glued together their arguments read {"city": "Paris"}{"city": "Rome"}, a row left out."""

    def call(**fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}}]}

    chunks = [
        call(id="a", type="function", function={"name": "get_weather", "arguments": ""}),
        call(function={"arguments": '{"city": "Paris"}'}),
        call(id="b", type="function", function={"name": "get_weather", "arguments": ""}),
        call(id="b", function={"arguments": '{"city": "Rome"}'}),  # an id repeated is the same call
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    _, generation = accumulate(chunks)
    assert [(c["id"], c["function"]["arguments"]) for c in generation.message["tool_calls"]] == [
        ("a", '{"city": "Paris"}'),
        ("b", '{"city": "Rome"}'),
    ]
