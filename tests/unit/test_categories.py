from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import ConfigError, load_config, parse_config
from prompts.categories import deep_merge, known_categories

RUN = {"run": {"name": "r"}, "endpoints": [{"url": "http://127.0.0.1:1"}]}


def test_bundled_categories_are_valid_and_include_the_issue_ones() -> None:
    names = known_categories()
    assert {"B1_glaive", "B2_opencodeinstruct", "B3_sharegpt", "B4_ultrachat", "B5_magpie"} <= set(names)
    cfg = parse_config({**RUN, "categories": [{"name": n} for n in names]})
    glaive = cfg.category("B1_glaive")
    assert (glaive.format, glaive.mode, glaive.source) == (
        "glaive",
        "tool_replay",
        "glaiveai/glaive-function-calling-v2",
    )
    assert cfg.category("B2_opencodeinstruct").filters == {"min_average_test_score": 0.8}


def test_a_run_picks_a_category_by_name_and_overrides_any_setting() -> None:
    cfg = parse_config(
        {
            **RUN,
            "categories": [
                {
                    "use": "B1_glaive",
                    "name": "glaive_small",
                    "limit": 100,
                    "generation": {"temperature": 0.2},
                },
                {"name": "B2_opencodeinstruct", "filters": {"require_all_tests_pass": True}},
            ],
        }
    )
    small = cfg.category("glaive_small")
    assert small.limit == 100 and small.source == "glaiveai/glaive-function-calling-v2"
    gen = cfg.generation_for(small)
    assert (gen.temperature, gen.max_tokens) == (0.2, 1024)  # override merged over the file's table
    code = cfg.category("B2_opencodeinstruct")
    assert code.filters == {"min_average_test_score": 0.8, "require_all_tests_pass": True}


def test_bundled_sample_category_resolves_its_local_source() -> None:
    cfg = parse_config({**RUN, "categories": [{"name": "sample_sharegpt"}]})
    source = Path(cfg.category("sample_sharegpt").source)
    assert source.is_file() and source.name == "sharegpt_sample.jsonl"


def test_unknown_category_and_bad_filters_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"categories\[0\].use: no category file named 'nope'"):
        parse_config({**RUN, "categories": [{"use": "nope"}]})
    with pytest.raises(ConfigError, match=r"filters\.min_average_test_score"):
        parse_config(
            {**RUN, "categories": [{"name": "B2_opencodeinstruct", "filters": {"min_average_test_score": 7}}]}
        )
    with pytest.raises(ConfigError, match=r"filters\.min_llm_judgement: unknown criterion 'edge_case'"):
        parse_config(
            {
                **RUN,
                "categories": [
                    {"name": "B2_opencodeinstruct", "filters": {"min_llm_judgement": {"edge_case": 4}}}
                ],
            }
        )
    with pytest.raises(ConfigError, match="takes no filters"):
        parse_config(
            {**RUN, "categories": [{"name": "c", "source": "x", "format": "sharegpt", "filters": {"a": 1}}]}
        )
    with pytest.raises(ConfigError, match="format 'sharegtp' is unknown"):
        parse_config({**RUN, "categories": [{"name": "c", "source": "x", "format": "sharegtp"}]})
    with pytest.raises(ConfigError, match="exactly one of count"):
        parse_config({**RUN, "categories": [{"name": "B3_sharegpt", "quota": {"count": 5, "fraction": 0.1}}]})


def test_category_files_next_to_the_config_win_over_bundled_ones(tmp_path: Path) -> None:
    (tmp_path / "categories").mkdir()
    (tmp_path / "categories" / "B4_ultrachat.toml").write_text(
        'source = "local.jsonl"\nformat = "messages"\n'
    )
    (tmp_path / "categories" / "local.jsonl").write_text("{}\n")
    (tmp_path / "run.toml").write_text(
        '[run]\nname = "x"\n[[endpoints]]\nurl = "http://127.0.0.1:1"\n'
        '[[categories]]\nname = "B4_ultrachat"\n'
    )
    cfg = load_config(tmp_path / "run.toml")
    assert cfg.category("B4_ultrachat").source == str((tmp_path / "categories" / "local.jsonl").resolve())


def test_deep_merge_merges_tables_and_replaces_the_rest() -> None:
    assert deep_merge({"a": {"x": 1, "y": 2}, "b": [1]}, {"a": {"y": 3}, "b": [2]}) == {
        "a": {"x": 1, "y": 3},
        "b": [2],
    }
