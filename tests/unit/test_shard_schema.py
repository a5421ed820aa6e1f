"""The schema files the shard writers read are exactly the declared Features' Arrow schemas."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flows.store.schema import SHARD_FEATURES
from flows.store.shard_schema import message_keys, shard_schema


@pytest.mark.parametrize("kind", sorted(SHARD_FEATURES))
def test_the_schema_file_is_the_features_schema_with_its_metadata(kind: str) -> None:
    expected = SHARD_FEATURES[kind].arrow_schema
    assert shard_schema(kind).equals(expected, check_metadata=True), (
        f"flows/store/schemas/{kind}.arrow is stale: run `uv run python -m flows.store.schema`"
    )
    assert b"huggingface" in (shard_schema(kind).metadata or {})  # what load_dataset restores Features from


def test_message_keys_are_the_message_struct_fields() -> None:
    message = SHARD_FEATURES["row"]["messages"].feature
    assert message_keys() == tuple(message)


def test_writing_shards_does_not_import_datasets() -> None:
    """Half a second of CPU at every start (more without bytecode caches): a run that only writes
    shards must not pay it. (pandas does come in, through pyarrow, when a shard writer is made.)"""
    code = (
        "import sys, tempfile\n"
        "import flows.cli.main\n"
        "from flows.store.run_store import RunStore\n"
        "store = RunStore(tempfile.mkdtemp())\n"
        "store.row_writer('c', flush_rows=1, flush_seconds=1.0)\n"
        "print('datasets' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
