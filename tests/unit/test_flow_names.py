"""Under Prefect, each part of a split run is its own flow run: its name, its cards, its tag."""

from __future__ import annotations

from pathlib import Path

from flows.config import parse_config
from flows.orchestration.flow import _flow_run_name, _key
from flows.orchestration.runs import run_tag
from flows.run.session import RunSession
from flows.store.parts import Part


def test_each_part_has_its_own_flow_run_name_artifact_keys_and_tag(tmp_path: Path) -> None:
    config = parse_config(
        {
            "run": {"name": "Qwen.Run", "output_dir": str(tmp_path)},
            "endpoints": [{"url": "http://127.0.0.1:9"}],
            "categories": [{"name": "chat", "source": "x.jsonl", "format": "messages"}],
        }
    )
    whole, part = RunSession(config), RunSession(config, part=Part(2, 4))
    assert (_flow_run_name(whole), _key(whole)) == ("Qwen.Run", "qwen-run")
    assert (_flow_run_name(part), _key(part)) == ("Qwen.Run-part-2-of-4", "qwen-run-part-2-of-4")
    tags = {
        run_tag(config.run_dir),
        run_tag(config.run_dir, "part-1-of-4"),
        run_tag(config.run_dir, "part-2-of-4"),
    }
    assert len(tags) == 3  # a part's crash recovery never marks another part's flow runs Crashed
