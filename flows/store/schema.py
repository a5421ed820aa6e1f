"""Declared ``datasets.Features`` for output rows and rejects (the contract in DESIGN.md).

Declaring the schema (instead of letting Arrow infer it per shard) keeps every shard identical, so
``load_dataset("parquet", data_dir=...)`` never fails on a shard whose first row had a null column.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from datasets import Features, List, Value

TOOL_CALL = {
    "id": Value("string"),
    "type": Value("string"),
    "function": {"name": Value("string"), "arguments": Value("string")},
}

MESSAGE = {
    "role": Value("string"),
    "content": Value("string"),
    "reasoning_content": Value("string"),
    "tool_calls": List(TOOL_CALL),
    "tool_call_id": Value("string"),
    "name": Value("string"),
}

SOURCE = {"dataset": Value("string"), "split": Value("string"), "row": Value("int64")}

USAGE = {
    "prompt_tokens": Value("int64"),
    "completion_tokens": Value("int64"),
    "reasoning_tokens": Value("int64"),
    "cached_tokens": Value("int64"),
}

ROW_FEATURES = Features(
    {
        "id": Value("string"),
        "category": Value("string"),
        "prompt_hash": Value("string"),
        "source": SOURCE,
        "messages": List(MESSAGE),
        "system_prompt": Value("string"),
        "tools": Value("string"),
        "finish_reason": Value("string"),
        "stop_reason": Value("string"),
        "usage": USAGE,
        "model": Value("string"),
        "sampling": Value("string"),
        "endpoint": Value("string"),
        "latency_s": Value("float64"),
        "ttft_s": Value("float64"),
        "attempts": Value("int32"),
        "requests": Value("int32"),
        "created_at": Value("timestamp[us, tz=UTC]"),
        "flags": List(Value("string")),
    }
)

REJECT_FEATURES = Features(
    {
        "id": Value("string"),
        "category": Value("string"),
        "prompt_hash": Value("string"),
        "source": SOURCE,
        "stage": Value("string"),
        "reason": Value("string"),
        "status": Value("int32"),
        "retryable": Value("bool"),
        "attempts": Value("int32"),
        "endpoint": Value("string"),
        "created_at": Value("timestamp[us, tz=UTC]"),
        "detail": Value("string"),
    }
)

MESSAGE_KEYS = tuple(MESSAGE)


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """Every message with every schema key, so Arrow sees one struct shape."""
    out = {key: message.get(key) for key in MESSAGE_KEYS}
    calls = out["tool_calls"]
    if calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": call.get("function", {}).get("name"),
                    "arguments": call.get("function", {}).get("arguments"),
                },
            }
            for call in calls
        ]
    else:
        out["tool_calls"] = None
    return out


def arrow_schema(features: Features) -> pa.Schema:
    """The Arrow schema with the HF features metadata embedded, so loaders restore ``Features``."""
    return features.arrow_schema
