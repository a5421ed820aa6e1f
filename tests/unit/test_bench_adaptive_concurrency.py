"""The adaptive-concurrency bench: its reading of SGLang's step counters, its warm window."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.adaptive_concurrency import (
    StepCounters,
    first_cohort,
    rate_between,
    run_name,
    setting_parts,
    share_within,
    source_trees,
    split_tree,
    step_counters,
    warm_window,
    write_config,
)
from flows.config import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23"


def test_the_step_counters_are_read_from_a_real_v1_loads_answer() -> None:
    counters = step_counters(json.loads((FIXTURES / "v1_loads_load.json").read_text()))
    # decode_moments [273 steps, 1,834 batch sum, 13,411,235 µs, ...] + 1,056,093 µs of prefill
    assert counters == StepCounters(busy_us=13_411_235.0 + 1_056_093.0, decode_steps=273.0, batch_sum=1834.0)


def test_a_run_s_mean_batch_is_its_batch_sum_over_its_steps() -> None:
    before = StepCounters(busy_us=5e6, decode_steps=1_000.0, batch_sum=20_000.0)
    after = StepCounters(busy_us=95e6, decode_steps=7_000.0, batch_sum=200_000.0)
    spent = after.since(before)
    assert spent.busy_us == 90e6 and spent.batch == 30.0  # 180,000 over 6,000 steps
    assert StepCounters(busy_us=1.0, decode_steps=0.0, batch_sum=0.0).batch is None


def test_a_server_without_step_counters_has_none() -> None:
    document = json.loads((FIXTURES / "v1_loads_load.json").read_text())
    del document["loads"][0]["total_prefill_busy_us"]  # SGLang before 0.5.2x
    assert step_counters(document) is None


def test_a_target_setting_runs_the_law_at_that_target(tmp_path: Path) -> None:
    """``adaptive-target0.92`` is the law at ``target_kv_usage = 0.92``; ``adaptive`` keeps the default."""
    source = tmp_path / "p.jsonl"
    source.write_text("")
    loaded = {}
    for setting in ("adaptive-target0.92", "adaptive"):
        path = tmp_path / f"{setting}.toml"
        write_config(path, "http://127.0.0.1:1", tmp_path / "out" / setting, [("chat", source, 64)], setting)
        loaded[setting] = load_config(path).concurrency
    assert loaded["adaptive-target0.92"].adaptive and loaded["adaptive-target0.92"].target_kv_usage == 0.92
    assert loaded["adaptive"].adaptive and loaded["adaptive"].target_kv_usage == 0.90


def test_the_warm_window_runs_from_the_first_cohort_s_end_to_the_last_send() -> None:
    answered = [5.0, 1.0, 3.0, 9.0, 7.0]  # out of order, as rows come from shards
    sent = [0.5, 0.0, 2.0, 6.0, 4.0]
    assert warm_window(answered, sent, cohort=2) == (3.0, 6.0)  # the 2nd answer, the last send
    assert warm_window(answered, sent, cohort=4) is None  # the 4th answer (7.0) after the last send
    assert warm_window(answered[:1], sent[:1], cohort=2) is None  # fewer answers than a cohort


def test_a_counter_s_rate_is_read_between_its_samples() -> None:
    times = [10.0, 11.0, 12.0, 13.0]
    totals = [100.0, 200.0, 400.0, 400.0]
    assert rate_between(times, totals, 10.5, 12.5) == (400.0 - 150.0) / 2.0
    assert rate_between(times, totals, 9.0, 12.0) is None  # before the first sample: unknown
    assert rate_between(times, totals, 11.0, 14.0) is None


def test_a_share_counts_only_the_samples_inside_the_window() -> None:
    flags = [True, False, True, True]
    times = [1.0, 2.0, 3.0, 4.0]
    assert share_within(flags, times, 2.0, 3.0) == 0.5
    assert share_within(flags, times, 5.0, 6.0) is None


def test_the_first_cohort_is_the_largest_fixed_setting() -> None:
    assert first_cohort(["64", "128@10", "adaptive", "adaptive:before"]) == 128
    assert first_cohort(["adaptive", "adaptive:before"]) == 64


def test_a_setting_is_read_alike_by_every_bench() -> None:
    assert split_tree("adaptive:before") == ("adaptive", "before")
    assert split_tree("150") == ("150", "")
    assert setting_parts("32@10:before") == ("32", "10", "before")
    assert setting_parts("adaptive") == ("adaptive", "", "")
    assert run_name("32@10") == "32at10"
    assert run_name("adaptive:before") == "adaptive-before"


def test_every_setting_from_another_tree_needs_its_tree(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    trees = source_trees(parser, [f"before={tmp_path}"], ["64", "adaptive", "adaptive:before"])
    assert trees == {"before": tmp_path.resolve()}
    with pytest.raises(SystemExit):
        source_trees(parser, [], ["adaptive:after"])
