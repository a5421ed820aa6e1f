"""Projected KV demand per request, learned per category."""

from __future__ import annotations

import numpy as np

from flows.control.demand import CategoryDemand, DemandModel


def test_before_any_answer_a_request_is_projected_at_its_full_budget() -> None:
    demand = DemandModel().category("long", max_tokens=4096)
    assert demand.prompt_tokens(4000) == 1000  # 4 characters a token until the server says
    assert demand.expected_output() == 4096


def test_the_first_short_answers_do_not_collapse_the_projection() -> None:
    """Short answers come back first: 10 of ~100 tokens must not project a 4,096-token category at 100."""
    demand = CategoryDemand(max_tokens=4096)
    for _ in range(10):
        demand.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=100)
    assert demand.expected_output() > 2500  # the prior, 20 answers at 4,096, still weighs two thirds
    for _ in range(40):  # about as much as 20 / (answers + 20) over the first 50
        demand.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=100)
    assert 0.25 < demand.lengths().at_least(np.array([4096.0]))[0] < 0.35
    for _ in range(250):  # once many answers say so, the category really is short
        demand.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=100)
    assert demand.expected_output() < 110
    assert demand.lengths().at_least(np.array([101.0]))[0] < 0.005  # the prior has faded


def test_the_lengths_follow_a_shift_to_longer_answers_within_a_few_dozen() -> None:
    demand = CategoryDemand(max_tokens=4096)
    for _ in range(200):
        demand.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=1000)
    for _ in range(30):
        demand.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=4096)
    still = demand.lengths().at_least(np.array([1001.0]))[0]
    assert 0.7 < still < 0.85  # 1 - 0.95**30 of the weight is on the long answers


def test_the_prompt_ratio_is_learned_from_the_servers_counts() -> None:
    demand = CategoryDemand(max_tokens=64)
    for _ in range(100):
        demand.learn(prompt_chars=600, prompt_tokens=300, completion_tokens=64)  # 2 characters a token
    assert abs(demand.chars_per_token - 2.0) < 0.1
    assert abs(demand.prompt_tokens(600) - 300) < 15


def test_a_resume_projects_from_the_runs_earlier_answers_not_from_the_cap() -> None:
    cold = DemandModel().category("short", max_tokens=4096)
    warm = DemandModel().category("short", max_tokens=4096, earlier=[900, 1100] * 64)
    assert cold.expected_output() == 4096
    # 128 earlier answers fade the prior as 128 of this start's would: about 7 % of the weight left
    assert 1000 < warm.expected_output() < 1300
    assert 0.05 < warm.lengths().at_least(np.array([1101.0]))[0] < 0.09
    like_a_live_start = CategoryDemand(max_tokens=4096)
    for tokens in [900, 1100] * 64:
        like_a_live_start.learn(prompt_chars=400, prompt_tokens=100, completion_tokens=tokens)
    assert abs(warm.expected_output() - like_a_live_start.expected_output()) < 1.0


def test_few_earlier_answers_leave_most_of_the_prior_and_the_prompt_ratio_is_this_starts() -> None:
    warm = DemandModel().category("short", max_tokens=4096, earlier=[100] * 10)
    assert warm.expected_output() > 2500  # ten answers are no more proof than ten of a fresh start
    warm.learn(prompt_chars=600, prompt_tokens=300, completion_tokens=100)
    assert warm.chars_per_token == 2.0  # the first answer of this start sets the ratio at once


def test_a_categorys_demand_is_seeded_once_when_it_is_made() -> None:
    model = DemandModel()
    first = model.category("c", max_tokens=256, earlier=[64] * 128)
    assert model.category("c", max_tokens=256, earlier=[256] * 128) is first
    assert first.expected_output() < 100
