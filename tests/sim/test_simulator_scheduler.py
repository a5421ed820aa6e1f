"""The pure scheduler model: SGLang's admission, ratio decay, retraction, queue cap and step time."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_launch.simulator.config import SimConfig
from sglang_launch.simulator.scheduler import (
    QueueFullError,
    Scheduler,
    SchedulerParams,
    SimRequest,
    StepKind,
    StepResult,
)


def make(pool: int = 1000, running: int = 10, **kw: Any) -> Scheduler:
    return Scheduler(SchedulerParams(max_total_tokens=pool, max_running_requests=running, **kw))


def req(rid: str, prompt: int, max_new: int, output: int | None = None) -> SimRequest:
    return SimRequest(rid, prompt, max_new, output if output is not None else max_new)


def run_all(s: Scheduler) -> list[StepResult]:
    steps = []
    while (result := s.step()) is not None:
        steps.append(result)
    return steps


def test_params_come_from_the_simulator_config() -> None:
    params = SchedulerParams.from_config(
        SimConfig(max_total_tokens=4096, max_running_requests=16, context_length=1024)
    )
    assert (params.max_total_tokens, params.max_running_requests, params.clip_max_new_tokens) == (
        4096,
        16,
        4096,
    )
    assert params.min_new_token_ratio == pytest.approx(0.098)
    assert params.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)


def test_first_prefill_admits_while_input_plus_max_new_fits_the_pool() -> None:
    s = make(pool=1000)
    for rid in "ABCD":
        s.submit(req(rid, 100, 200))
    first = s.step()
    assert first is not None
    # 300 + 300 + 300 fit in 1000 one after another; the fourth needs 300 >= 1000 - 900.
    assert (first.kind, first.admitted, first.input_tokens) == (StepKind.PREFILL, ("A", "B", "C"), 300)
    assert first.advanced == ("A", "B", "C")
    assert s.used_tokens == 303  # prompts plus each request's first token
    assert [r.rid for r in s.waiting] == ["D"]


def test_running_requests_reserve_their_growth_times_the_ratio() -> None:
    s = make(pool=1000)
    for rid in "ABCD":
        s.submit(req(rid, 100, 200))
    s.step()
    assert s.reserved_tokens() == pytest.approx(3 * 199 * 0.7)  # 417.9
    # D needs 300 but only 1000 - 303 - 417.9 = 279.1 is unreserved: a decode step runs instead.
    second = s.step()
    assert second is not None and second.kind is StepKind.DECODE
    assert second.advanced == ("A", "B", "C")
    assert s.used_tokens == 306


def test_admission_needs_strictly_less_than_the_free_pool() -> None:
    exact = make(pool=1000)
    exact.submit(req("A", 500, 500))
    assert exact.step() is None  # 1000 >= 1000: SGLang's NO_TOKEN
    one_less = make(pool=1000)
    one_less.submit(req("A", 499, 500))
    result = one_less.step()
    assert result is not None and result.admitted == ("A",)


def test_max_new_tokens_is_clipped_in_the_estimate() -> None:
    fits = make(pool=4197)
    fits.submit(req("A", 100, 10000, 5))
    assert fits.step() is not None  # 100 + min(10000, 4096) = 4196 < 4197
    blocked = make(pool=4196)
    blocked.submit(req("A", 100, 10000, 5))
    assert blocked.step() is None


def test_admission_is_fifo_and_stops_at_the_first_request_that_does_not_fit() -> None:
    s = make(pool=1000)
    s.submit(req("big", 900, 200))
    s.submit(req("small", 10, 10))
    assert s.step() is None  # "small" would fit but must not overtake "big"
    assert [r.rid for r in s.waiting] == ["big", "small"]


def test_running_cap_limits_admission() -> None:
    s = make(pool=100000, running=2)
    for rid in "ABC":
        s.submit(req(rid, 10, 10))
    first = s.step()
    assert first is not None and first.admitted == ("A", "B")
    second = s.step()
    assert second is not None and second.kind is StepKind.DECODE


def test_prefill_token_budget_caps_a_batch_but_never_blocks_the_first_request() -> None:
    s = make(pool=100000, max_prefill_tokens=150)
    for rid in "ABC":
        s.submit(req(rid, 100, 10))
    first = s.step()
    assert first is not None and first.admitted == ("A",)  # B would need 100 >= 150 - 100
    second = s.step()
    assert second is not None and second.admitted == ("B",)


def test_new_token_ratio_decays_per_decode_step_to_its_floor_and_resets_when_idle() -> None:
    s = make(pool=100000)
    s.submit(req("A", 10, 700))
    s.step()  # prefill: no decay
    assert s.new_token_ratio == 0.7
    for _ in range(300):
        s.step()
    decay = (0.7 - 0.098) / 600
    assert s.new_token_ratio == pytest.approx(0.7 - 300 * decay)
    for _ in range(350):
        s.step()
    assert s.new_token_ratio == pytest.approx(0.098)  # floor reached after 600 steps, then held
    run_all(s)
    assert s.idle and s.new_token_ratio == 0.7


def test_retraction_under_a_tiny_pool() -> None:
    s = make(pool=100, init_new_token_ratio=0.01)
    for rid, prompt in [("A", 20), ("B", 20), ("C", 10)]:
        s.submit(req(rid, prompt, 40))
    steps = run_all(s)
    prefills = [(r.admitted, r.input_tokens) for r in steps if r.kind is StepKind.PREFILL]
    retractions = [(i, r.retraction) for i, r in enumerate(steps) if r.retraction]
    # A low ratio admits all three; 15 decode steps later 3 more tokens do not fit (98 of 100 used).
    first_step, first = retractions[0]
    assert first_step == 18
    # All have 16 tokens: the longest prompt goes (A and B tie; the later one is popped).
    assert first is not None and (first.rids, first.tokens_freed) == (("B",), 36)
    assert first.ratio_before == pytest.approx(0.01 - 15 * (0.01 - 0.0014) / 600)
    assert first.ratio_after == pytest.approx((16 + 16 + 20 * 2) / 80)  # (decoded + 20 x n) / max_new
    second = retractions[1][1]
    assert second is not None and (second.rids, second.tokens_freed, second.ratio_after) == (("A",), 55, 1.0)
    # Retracted requests recompute prompt + tokens already generated, and keep those tokens.
    assert prefills == [(("A",), 20), (("B",), 20), (("C",), 10), (("B",), 36), (("A",), 55)]
    c = s.counters
    assert (c.retractions, c.retracted_requests, c.retracted_input_tokens, c.retracted_output_tokens) == (
        2,
        2,
        40,
        51,
    )
    assert (c.generated_tokens, c.finished_requests, c.prefill_tokens, c.peak_used_tokens) == (
        120,
        3,
        141,
        100,
    )
    assert s.used_tokens == 0


def test_retraction_takes_the_request_with_the_fewest_generated_tokens_first() -> None:
    s = make(pool=72, init_new_token_ratio=0.01)
    s.submit(req("old", 10, 40))
    s.step()
    for _ in range(10):
        s.step()  # "old" has 11 tokens
    s.submit(req("new", 5, 40))  # shorter prompt, so only the generated count can pick it
    while (result := s.step()) is not None and result.retraction is None:
        pass
    assert result is not None and result.retraction is not None
    assert result.retraction.rids == ("new",)


def test_queue_cap_refuses_new_arrivals() -> None:
    s = make(pool=1000, running=1, max_queued_requests=2)
    s.submit(req("A", 10, 100))
    s.submit(req("B", 10, 100))
    with pytest.raises(QueueFullError):
        s.submit(req("C", 10, 100))
    assert s.counters.rejected_requests == 1
    s.step()  # A admitted: one slot frees up
    s.submit(req("C", 10, 100))
    assert [r.rid for r in s.waiting] == ["B", "C"]


def test_a_retracted_request_meeting_a_full_queue_is_rejected() -> None:
    s = make(pool=100, init_new_token_ratio=0.01, max_queued_requests=1)
    for rid, prompt in [("A", 20), ("B", 20), ("C", 10)]:
        s.submit(req(rid, prompt, 40))
        s.step()
    s.submit(req("D", 50, 40))  # cannot be admitted: it sits in the queue
    while (result := s.step()) is not None and result.retraction is None:
        pass
    assert result is not None and result.rejected == ("B",)
    assert [r.rid for r in s.waiting] == ["D"]


def test_abort_frees_the_kv_of_a_running_request_and_drops_a_queued_one() -> None:
    s = make(pool=1000, running=1)
    s.submit(req("A", 100, 50))
    s.submit(req("B", 10, 50))
    s.step()
    assert s.used_tokens == 101
    assert s.abort("A") and s.used_tokens == 0
    assert s.abort("B") and s.idle
    assert not s.abort("nope")
    assert s.counters.aborted_requests == 2


def test_step_time_model_and_throughput_falling_with_batch_size() -> None:
    p = SchedulerParams(max_total_tokens=100000, max_running_requests=64)
    assert p.prefill_seconds(1000) == pytest.approx(0.005 + 1000 * 5e-5)
    assert p.decode_seconds(1, 1000) == pytest.approx(0.02 + 0.0002 + 1000 * 5e-8)
    assert p.decode_seconds(64, 64000) == pytest.approx(0.02 + 64 * 0.0002 + 64000 * 5e-8)
    per_request = [1 / p.decode_seconds(n, n * 1000) for n in (1, 8, 64)]
    assert per_request == pytest.approx([49.3827, 45.4545, 27.7778], rel=1e-4)
    aggregate = [n / p.decode_seconds(n, n * 1000) for n in (1, 8, 64)]
    assert aggregate == sorted(aggregate)  # batching still pays in total


def two_requests_run() -> Scheduler:
    """One prefill of two 100-token prompts (200 tokens), then 2 decode steps of 2 requests over 202
    and 204 KV tokens."""
    s = make(pool=100000)
    s.submit(req("A", 100, 3))
    s.submit(req("B", 100, 3))
    run_all(s)
    return s


def test_virtual_clock_sums_the_step_times() -> None:
    s = two_requests_run()
    p = s.params
    expected = p.prefill_seconds(200) + p.decode_seconds(2, 202) + p.decode_seconds(2, 204)
    assert s.clock_s == pytest.approx(expected)


def test_the_busy_counters_sum_the_step_times_as_sglang_counts_them() -> None:
    s = two_requests_run()
    p = s.params
    steps = [p.decode_seconds(2, 202), p.decode_seconds(2, 204)]
    assert s.counters.prefill_busy_s == pytest.approx(p.prefill_seconds(200))
    # steps, sum of batch sizes, of step times, of batch sizes squared, of batch x time, of tokens
    assert s.counters.decode_moments == pytest.approx([2, 4, sum(steps), 8, 2 * sum(steps), 4])


def test_output_tokens_must_lie_within_max_new() -> None:
    with pytest.raises(ValueError):
        SimRequest("A", 10, 5, 6)
    with pytest.raises(ValueError):
        SimRequest("A", 10, 5, 0)
