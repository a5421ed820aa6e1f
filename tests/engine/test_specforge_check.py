"""A mixed export (plain, system-prompt and tool rows, plain ones first) loads through SpecForge's own code.

Runs ``bench/specforge_check.py`` with the engines' SGLang venv (torch, transformers, datasets) against
a SpecForge checkout named by ``SPECFORGE_SRC``; skipped with the reason when either is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from engine_support import SGLANG_PYTHON, TINY_MODEL

from flows.report.export import Reasoning, specforge_record
from flows.store.shard_schema import normalize_message

SPECFORGE_SRC = Path(os.environ.get("SPECFORGE_SRC", "/nonexistent"))
SCRIPT = Path(__file__).parents[2] / "bench" / "specforge_check.py"

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not SGLANG_PYTHON.exists() or not (TINY_MODEL / "tokenizer_config.json").exists(),
        reason=f"no engines venv or tiny-llm at {SGLANG_PYTHON.parents[2]} (../shared/engines/setup.sh)",
    ),
    pytest.mark.skipif(
        not (SPECFORGE_SRC / "specforge" / "data" / "parse.py").exists(),
        reason="set SPECFORGE_SRC to a checkout of sgl-project/SpecForge",
    ),
]

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = json.dumps(
    [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
)


def _row(rid: str, messages: list[dict[str, object]], tools: str | None = None) -> dict[str, object]:
    return {"id": rid, "messages": [normalize_message(m) for m in messages], "tools": tools}


def test_a_mixed_export_loads_and_trains_through_specforges_offline_and_training_paths(
    tmp_path: Path,
) -> None:
    plain = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "r"},
    ]
    with_system = [{"role": "system", "content": "Be brief."}, *plain]
    tool = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "20 C", "tool_call_id": "c1", "name": "get_weather"},
        {"role": "assistant", "content": "20 C in Paris"},
    ]
    rows = [_row(f"p{i}", plain) for i in range(1100)]  # more than one Arrow writer batch before a tool row
    rows += [_row(f"s{i}", with_system) for i in range(3)] + [_row(f"t{i}", tool, TOOLS) for i in range(3)]
    export = tmp_path / "specforge.jsonl"
    export.write_text("".join(json.dumps(specforge_record(r, Reasoning.FIELD)) + "\n" for r in rows))

    args = [str(SGLANG_PYTHON), str(SCRIPT), str(export), "--specforge-src", str(SPECFORGE_SRC)]
    done = subprocess.run(
        [*args, "--tokenizer", str(TINY_MODEL)], capture_output=True, text=True, timeout=800, check=False
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["offline"] == {"columns": ["conversations", "tools"], "processed": 1106, "trained": 1106}
    assert summary["training"]["processed"] == summary["training"]["trained"] == 1106
