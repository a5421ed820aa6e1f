"""Regeneration modes end to end through the simulator: all_turns and tool_replay rows as stored."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import load_dataset
from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.config import parse_config
from flows.runner import execute
from sglang_launch.simulator import SimConfig, SimulatorProcess

FIXTURES = Path(__file__).parent.parent / "fixtures" / "prompts"
FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 16384}


def _config(tmp_path: Path, url: str, category: dict) -> object:
    return parse_config(
        {
            "run": {"name": "modes", "output_dir": str(tmp_path)},
            "endpoints": [{"url": url}],
            "generation": {"max_tokens": 64},
            "categories": [category],
        }
    )


async def test_all_turns_regenerates_every_user_turn_in_order(tmp_path: Path) -> None:
    with SimulatorProcess(SimConfig(**FAST, stop_probability=1.0)) as sim:
        cfg = _config(tmp_path, sim.url, {"name": "sample_sharegpt", "mode": "all_turns"})
        await execute(cfg, use_prefect=False)  # type: ignore[arg-type]
    ds = load_dataset("parquet", data_dir=str(tmp_path / "modes" / "data"), split="train")
    assert len(ds) == 49
    multi = [row for row in ds if row["requests"] > 1]
    assert multi, "the sample set has multi-turn conversations"
    for row in ds:
        roles = [m["role"] for m in row["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] * row["requests"]
        assert row["stop_reason"] is None


async def test_tool_replay_keeps_recorded_results_for_matching_calls(tmp_path: Path) -> None:
    with SimulatorProcess(SimConfig(**FAST, tool_calls=True, tool_call_probability=1.0)) as sim:
        cfg = _config(
            tmp_path,
            sim.url,
            {
                "name": "tools",
                "source": str(FIXTURES / "glaive.jsonl"),
                "format": "glaive",
                "mode": "tool_replay",
            },
        )
        status = await execute(cfg, use_prefect=False)  # type: ignore[arg-type]
    ds = load_dataset("parquet", data_dir=str(tmp_path / "modes" / "data"), split="train")
    assert status.rows == len(ds) and len(ds) >= 3
    replayed = [row for row in ds if any(m["role"] == "tool" for m in row["messages"])]
    assert replayed, "a single-function conversation must replay its recorded result"
    for row in replayed:
        messages = row["messages"]
        i = next(k for k, m in enumerate(messages) if m["role"] == "tool")
        call = messages[i - 1]["tool_calls"][0]
        assert messages[i]["tool_call_id"] == call["id"]  # re-tied to the REGENERATED call
        assert messages[i]["name"] == call["function"]["name"]
        assert json.loads(call["function"]["arguments"]) is not None
        assert messages[i + 1]["role"] == "assistant"  # the answer after the result was requested
        assert row["requests"] >= 2
    tool_names = {json.loads(row["tools"])[0]["function"]["name"] for row in ds if row["tools"]}
    assert tool_names
    # the simulator calls a tool at every turn, where the recordings answered in text: each
    # replayed conversation stops there and says why, instead of inventing tool results
    assert all("call" in (row["stop_reason"] or "") for row in replayed)


def test_a_category_of_the_wrong_format_stops_early_with_exit_2_and_the_other_goes_on(tmp_path: Path) -> None:
    """1,200 ShareGPT rows read as `messages`: one line naming the format, exit 2; the good category runs."""
    wrong = tmp_path / "sharegpt.jsonl"
    wrong.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "conversations": [{"from": "human", "value": f"question {i}"}]}) + "\n"
            for i in range(1200)
        )
    )
    good = tmp_path / "good.jsonl"
    write_prompts(good, 30)
    with SimulatorProcess(SimConfig(time_scale=0.02, stream_interval_s=0.02, log_level="warning")) as sim:
        config = write_config(
            tmp_path / "run.toml", name="early", output_dir=tmp_path, url=sim.url, source=good
        )
        config.write_text(
            config.read_text()
            + f'\n[[categories]]\nname = "wrong"\nsource = "{wrong}"\nformat = "messages"\n'
        )
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=300)
    text = out.decode()
    assert proc.returncode == 2, text[-3000:]
    assert "wrong" in text and "messages" in text  # names the category and the format it was read as
    assert "Traceback" not in text
    check = check_run(tmp_path / "early")
    assert len([i for i in check.row_ids if not i.startswith("s")]) == 30  # the good category finished
    assert len(check.reject_ids) <= 1000  # stopped early, not a reject per row
