"""What is sent to the endpoint besides the messages and tools, and its canonical record.

One object serves both the request body and the output rows' ``sampling`` column, so the column
always says exactly what the server was asked for (a run fingerprint can hash it too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Keys the client owns in the request body: an ``extra_body`` entry with one of these names would
# silently override the request (or the named fields below), so it is refused up front.
_RESERVED_KEYS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "chat_template_kwargs",
        "separate_reasoning",
    }
)
_ONE_ANSWER_KEYS = frozenset({"n", "best_of"})
"""Several answers a request: only the first is read, the others paid for and thrown away."""


def check_extra_body(extra_body: Mapping[str, Any]) -> None:
    """Refuse what ``extra_body`` must not carry: a key the client owns, or several answers a request.

    The run config validates its ``extra_body`` tables with this, so a bad one is a config error
    before anything starts, not a failure when its category's first request is built.
    """
    clashes = sorted(_RESERVED_KEYS & extra_body.keys())
    if clashes:
        raise ValueError(f"extra_body must not set {clashes}: use the named fields instead")
    several = sorted(k for k in _ONE_ANSWER_KEYS & extra_body.keys() if extra_body[k] != 1)
    if several:
        raise ValueError(
            f"extra_body must not set {several} above 1: one answer is read per request "
            "(the others would be paid for and lost); run the category again for more"
        )


@dataclass(frozen=True)
class SamplingParams:
    """Generation settings for one request; SGLang/vLLM extras ride at the top level of the body."""

    max_tokens: int
    temperature: float = 0.7
    top_p: float = 1.0
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        check_extra_body(self.extra_body)

    def extra_fields(self) -> dict[str, Any]:
        """The non-OpenAI top-level body fields (the SDK's ``extra_body``); unset ones are left out
        so the server applies its own defaults."""
        fields: dict[str, Any] = dict(self.extra_body)
        if self.chat_template_kwargs is not None:
            fields["chat_template_kwargs"] = self.chat_template_kwargs
        if self.separate_reasoning is not None:
            fields["separate_reasoning"] = self.separate_reasoning
        return fields

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace) of every sampling field actually sent."""
        body = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            **self.extra_fields(),
        }
        return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
