"""A corpus of malformed rows in every supported format, end to end through `datagen run`.

Broken JSON lines, invalid UTF-8, values of the wrong type, missing fields, empty turns, a huge row,
tool schemas that are not objects, and a parquet file with another schema: each row becomes one
reject whose reason says what is wrong (or, for the huge row, the server's context-length refusal),
the good rows beside them become rows, the run exits 0, and nothing prints a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_support import datagen, write_config

from sglang_launch.simulator import SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}
ROW = "row"  # the expectation of a good row
HUGE = "x " * 1_000_000  # ~2 MB in one turn: far beyond the 8192-token context


def _user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


# (a JSONL line as bytes or a row object, what it must become: ROW or a piece of the reject reason)
CORPUS: dict[str, list[tuple[Any, str]]] = {
    "messages": [
        ({"messages": [_user("good one")]}, ROW),
        (b'{"messages": [{"role": "user", "content": "cut', "Unterminated string"),
        (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "invalid UTF-8"),
        (b"[1, 2, 3]", "not a JSON object"),
        ({"messages": "hello"}, "no messages list"),
        ({"msgs": [_user("wrong column")]}, "no messages list"),
        ({"messages": [None]}, "message is not an object"),
        ({"messages": [{"role": 3, "content": "x"}]}, "unknown role"),
        ({"messages": [_user({"nested": "dict"})]}, "unsupported content type"),
        ({"messages": [_user(""), {"role": "assistant", "content": "hi"}]}, "no user turn"),
        ({"messages": []}, "no user turn"),
        ({"messages": [_user("weather?")], "tools": [{"type": "function", "function": "f"}]}, "tool 1"),
        ({"messages": [_user("weather?")], "tools": "[{broken"}, "tools column is not valid JSON"),
        ({"messages": [_user(HUGE)]}, "context length"),
        ({"messages": [_user("good two")]}, ROW),
    ],
    "sharegpt": [
        ({"conversations": [{"from": "human", "value": "good sharegpt"}]}, ROW),
        (b"{not json}", "Expecting property name"),
        ({"conversations": "text"}, "no conversations list"),
        ({"conversations": [["human", "hi"]]}, "conversation turn is not an object"),
        ({"conversations": [{"from": "wizard", "value": "hi"}]}, "unknown role"),
        ({"conversations": [{"from": "human", "value": 7}]}, "unsupported content type"),
        ({"conversations": [{"from": "human", "value": ""}]}, "no user turn"),
    ],
    "magpie": [
        ({"instruction": "good magpie"}, ROW),
        ({"instruction": None}, "no user turn"),
        ({"instruction": 12}, "unsupported content type"),
        ({"conversations": [{"from": "gpt", "value": "only an answer"}]}, "no user turn"),
    ],
    "glaive": [
        ({"system": "SYSTEM: You are helpful.", "chat": "USER: good\n\n\nASSISTANT: hi <|endoftext|>"}, ROW),
        ({"system": 5, "chat": "USER: hi"}, "'system' is not a string"),
        ({"system": "SYSTEM: x"}, "missing 'chat' column"),
        ({"system": "SYSTEM: x", "chat": "ASSISTANT: only"}, "no USER turn"),
        (b'{"system": "SYSTEM: x", "chat": ', "Expecting value"),
    ],
    "opencodeinstruct": [
        ({"id": "oci-good", "input": "Write a function."}, ROW),
        ({"id": "oci-1"}, "missing 'input' column"),
        ({"id": "oci-2", "input": 42}, "'input' is a int, not a string"),
        ({"id": "oci-3", "input": "   "}, "empty input"),
        (b"\xff\xfe\x00garbage", "invalid UTF-8"),
    ],
}
# A parquet file of another dataset dropped into the messages folder: every row is a reject.
OTHER_SCHEMA = pa.table({"question_id": [1, 2, 3], "score": [0.5, 0.7, 0.9]})


def _write_sources(root: Path) -> dict[str, Path]:
    sources = {}
    for fmt, entries in CORPUS.items():
        folder = root / fmt
        folder.mkdir()
        with (folder / "a.jsonl").open("wb") as handle:
            for raw, _ in entries:
                handle.write((raw if isinstance(raw, bytes) else json.dumps(raw).encode()) + b"\n")
                handle.write(b"\n")  # blank lines are not rows
        sources[fmt] = folder
    pq.write_table(OTHER_SCHEMA, root / "messages" / "b.parquet")
    return sources


def _outcomes(run_dir: Path, category: str) -> tuple[dict[int, str], list[str]]:
    """Source row -> ROW or the reject's reason; and every id seen (rows and rejects)."""
    outcomes: dict[int, str] = {}
    ids: list[str] = []
    for kind in ("data", "rejects"):
        for path in sorted((run_dir / kind / category).glob("part-*.parquet")):
            table = pq.read_table(path).to_pylist()
            for item in table:
                row = item["source"]["row"]
                assert row not in outcomes, f"{category} row {row} twice"
                outcomes[row] = ROW if kind == "data" else item["reason"]
                ids.append(item["id"])
    return outcomes, ids


def test_every_malformed_row_in_every_format_is_one_reject_with_its_reason(tmp_path: Path) -> None:
    sources = _write_sources(tmp_path)
    categories = "".join(
        f'\n[[categories]]\nname = "{fmt}"\nsource = "{folder}"\nformat = "{fmt}"\n'
        for fmt, folder in sources.items()
        if fmt != "messages"
    )
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml",
            name="bad",
            output_dir=tmp_path,
            url=sim.url,
            source=sources["messages"],
            extra=categories,
        )
        config.write_text(config.read_text().replace('name = "chat"', 'name = "messages"'))
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=180)
    text = out.decode()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text
    for fmt, entries in CORPUS.items():
        outcomes, ids = _outcomes(tmp_path / "bad", fmt)
        expected_rows = len(entries) + (OTHER_SCHEMA.num_rows if fmt == "messages" else 0)
        assert sorted(outcomes) == list(range(expected_rows)), fmt
        assert len(ids) == len(set(ids)), fmt
        for index, (_, expected) in enumerate(entries):
            got = outcomes[index]
            assert (got == ROW) if expected == ROW else (expected in got), f"{fmt} row {index}: {got[:200]}"
        if fmt == "messages":
            assert all("no messages list" in outcomes[len(entries) + i] for i in range(3))
