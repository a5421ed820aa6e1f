"""SamplingParams: the body extras it sends and the canonical JSON stored in output rows."""

from __future__ import annotations

import pytest

from flows.client.sampling import SamplingParams


def test_defaults_send_only_the_openai_fields() -> None:
    sampling = SamplingParams(max_tokens=2048)

    assert sampling.extra_fields() == {}
    assert sampling.to_json() == '{"max_tokens":2048,"temperature":0.7,"top_p":1.0}'


def test_extras_and_canonical_json() -> None:
    sampling = SamplingParams(
        max_tokens=512,
        temperature=0.6,
        top_p=0.95,
        chat_template_kwargs={"thinking": True, "enable_thinking": True},
        separate_reasoning=False,
        extra_body={"top_k": 20, "min_p": 0.0},
    )

    assert sampling.extra_fields() == {
        "top_k": 20,
        "min_p": 0.0,
        "chat_template_kwargs": {"thinking": True, "enable_thinking": True},
        "separate_reasoning": False,
    }
    assert sampling.to_json() == (
        '{"chat_template_kwargs":{"enable_thinking":true,"thinking":true},"max_tokens":512,"min_p":0.0,'
        '"separate_reasoning":false,"temperature":0.6,"top_k":20,"top_p":0.95}'
    )


def test_same_settings_same_json_whatever_the_dict_order() -> None:
    one = SamplingParams(max_tokens=8, extra_body={"a": 1, "b": 2})
    two = SamplingParams(max_tokens=8, extra_body={"b": 2, "a": 1})

    assert one.to_json() == two.to_json()


@pytest.mark.parametrize("key", ["max_tokens", "stream", "messages", "separate_reasoning", "stream_options"])
def test_extra_body_cannot_override_owned_fields(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SamplingParams(max_tokens=8, extra_body={key: 1})


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize("key", ["n", "best_of"])
def test_several_answers_a_request_are_refused(key: str) -> None:
    """Only the first answer is read: the others would be paid for and thrown away."""
    with pytest.raises(ValueError, match="one answer is read per request"):
        SamplingParams(max_tokens=16, extra_body={key: 4})
    assert SamplingParams(max_tokens=16, extra_body={key: 1}).extra_fields() == {key: 1}
