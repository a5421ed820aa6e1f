"""The Arrow schemas every shard is written with, read from files instead of built by ``datasets``.

The contract is ``flows.store.schema``: ``datasets.Features``, whose Arrow schema carries the HF
features metadata so ``load_dataset`` restores them. Building it means importing ``datasets``: about
half a second of CPU (with bytecode caches; 2-3 s without) at every start of a run, a Prefect worker
or a CLI command that only writes shards (pandas still comes in, through pyarrow: ``warm_arrow``).
So the two schemas are kept here as Arrow IPC files made from the Features (``python -m
flows.store.schema`` rewrites them), and a unit test fails when they differ.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa

SCHEMA_FILES = {kind: Path(__file__).with_name("schemas") / f"{kind}.arrow" for kind in ("row", "reject")}
"""Kind of shard -> its schema file (output rows, rejects)."""


@functools.cache
def shard_schema(kind: str) -> pa.Schema:
    """The schema of a kind of shard (``row`` or ``reject``), HF features metadata included."""
    return pa.ipc.read_schema(pa.py_buffer(SCHEMA_FILES[kind].read_bytes()))


@functools.cache
def message_keys() -> tuple[str, ...]:
    return tuple(field.name for field in shard_schema("row").field("messages").type.value_type)


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """Every message with every schema key, so Arrow sees one struct shape."""
    out = {key: message.get(key) for key in message_keys()}
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
