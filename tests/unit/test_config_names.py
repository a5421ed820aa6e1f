"""Run and category names become folder names: none may leave the output directory."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, parse_config

ESCAPES = ["..", "../x", "/etc", "a/b", "a\\b", ".hidden", "~", "run\n", "", " run", "a\x00b"]


def _data(run: str = "r1", category: str = "chat") -> dict[str, object]:
    return {
        "run": {"name": run},
        "endpoints": [{"url": "http://127.0.0.1:30000"}],
        "categories": [{"name": category, "source": "x.jsonl", "format": "messages"}],
    }


@pytest.mark.parametrize("name", ESCAPES)
def test_a_run_name_that_could_escape_the_output_directory_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"run\.name"):
        parse_config(_data(run=name), source="t.toml")


@pytest.mark.parametrize("name", ESCAPES)
def test_a_category_name_that_could_escape_the_run_directory_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"categories"):
        parse_config(_data(category=name), source="t.toml")


def test_ordinary_names_stay_inside() -> None:
    config = parse_config(_data(run="qwen3-regen.v2", category="B1_glaive"), source="t.toml")
    assert config.run_dir.name == "qwen3-regen.v2"
