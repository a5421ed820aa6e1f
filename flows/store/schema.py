"""Declared ``datasets.Features`` for output rows and rejects (the contract in DESIGN.md).

The shard writers read the Arrow schemas made from these from files (``shard_schema.py``), so a
run does not import ``datasets``; after changing a feature here, run ``python -m flows.store.schema``.

Declaring the schema (instead of letting Arrow infer it per shard) keeps every shard identical, so
``load_dataset("parquet", data_dir=...)`` never fails on a shard whose first row had a null column.
"""

from __future__ import annotations

from datasets import Features, List, Value

from flows.store.shard_schema import SCHEMA_FILES

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

SHARD_FEATURES = {"row": ROW_FEATURES, "reject": REJECT_FEATURES}


def write_schema_files() -> None:
    """Rewrite the Arrow schema files the shard writers read (``flows.store.shard_schema``)."""
    for kind, features in SHARD_FEATURES.items():
        path = SCHEMA_FILES[kind]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(features.arrow_schema.serialize().to_pybytes())


if __name__ == "__main__":
    write_schema_files()
