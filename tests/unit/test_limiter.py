from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from flows.control.limit import FixedLimit
from flows.control.limiter import GateClosed, Lane, Limiter
from flows.control.outlook import Cohort
from flows.control.signals import ServerSample


class MutableLimit:
    def __init__(self, value: int) -> None:
        self.limit = value


async def test_limiter_never_exceeds_the_limit_and_admits_everyone() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(3))])
    peak = 0

    async def job() -> None:
        nonlocal peak
        async with limiter.slot():
            peak = max(peak, limiter.in_flight)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(job() for _ in range(50)))
    assert peak == 3
    assert limiter.in_flight == 0


async def test_limiter_spreads_over_lanes_by_free_room() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(1)), Lane("b", FixedLimit(3))])
    got = [(await limiter.acquire()).endpoint for _ in range(4)]
    assert sorted(got) == ["a", "b", "b", "b"]
    assert got[0] == "b"  # the lane with the most room goes first


async def test_a_raised_limit_admits_waiters_without_a_release() -> None:
    limit = MutableLimit(1)
    limiter: Limiter[str] = Limiter([Lane("a", limit)])
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    limit.limit = 2
    await limiter.notify()
    lane = await asyncio.wait_for(waiter, 1)
    assert lane.endpoint == "a" and limiter.in_flight == 2


async def test_a_lowered_limit_holds_new_requests_until_in_flight_drains() -> None:
    limit = MutableLimit(2)
    limiter: Limiter[str] = Limiter([Lane("a", limit)])
    first = await limiter.acquire()
    second = await limiter.acquire()
    limit.limit = 1
    waiter = asyncio.create_task(limiter.acquire())
    await limiter.release(first)
    await asyncio.sleep(0.01)
    assert not waiter.done()  # 1 in flight == new limit
    await limiter.release(second)
    await asyncio.wait_for(waiter, 1)


async def test_a_paced_lane_spreads_admissions_and_another_lane_takes_the_rest() -> None:
    paced: Lane[str] = Lane("paced", FixedLimit(10))
    limiter: Limiter[str] = Limiter([paced])
    paced.pacer.set(20.0, burst=2.0, now=time.monotonic())
    started = time.monotonic()
    for _ in range(6):
        await limiter.acquire()
    # two at once from the bucket, then four at 20 a second: at least 0.2 s
    assert time.monotonic() - started >= 0.19

    free: Lane[str] = Lane("free", FixedLimit(10))
    both: Limiter[str] = Limiter([Lane("slow", FixedLimit(10)), free])
    both.lanes[0].pacer.set(0.01, burst=1.0, now=time.monotonic())
    got = [(await asyncio.wait_for(both.acquire(), 1)).endpoint for _ in range(5)]
    assert got.count("slow") == 1  # its one token, then the unpaced lane takes every admission


async def test_a_release_wakes_a_waiter_blocked_on_pacing_too() -> None:
    lane: Lane[str] = Lane("a", FixedLimit(1))
    limiter: Limiter[str] = Limiter([lane])
    lane.pacer.set(1000.0, burst=1.0, now=time.monotonic())
    first = await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # the lane is full
    await limiter.release(first)
    await asyncio.wait_for(waiter, 1)


def test_a_lanes_request_life_is_the_mean_of_its_first_answers_then_a_moving_average() -> None:
    lane: Lane[str] = Lane("a", FixedLimit(1))
    assert lane.life_s is None
    lane.finished(2.0)
    lane.finished(4.0)
    assert lane.completed == 2 and lane.life_s == 3.0
    for _ in range(200):
        lane.finished(10.0)
    assert 9.9 < lane.life_s < 10.0  # follows a shift to longer answers


async def test_a_spent_credit_admits_nobody_until_the_next_decision_without_a_budget_to_redo_it() -> None:
    """A slot freed is not room: the outlook counted the ends of the requests in flight."""
    lane: Lane[str] = Lane("a", FixedLimit(10))
    limiter: Limiter[str] = Limiter([lane])
    lane.credit = 2
    await limiter.acquire()
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await limiter.release(lane)  # the first request ended
    await asyncio.sleep(0.01)
    assert not waiter.done() and lane.in_flight == 1
    lane.credit = 1  # the next decision
    await limiter.notify()
    assert await asyncio.wait_for(waiter, 1) is lane and lane.credit == 0


def test_a_lanes_decode_rate_weighs_answers_by_their_tokens() -> None:
    """Tokens per second held, over all answers: a 10-token answer that waited in a queue for 5 s
    must not drag the rate down as much as a 1,000-token answer of 10 s lifts it."""
    lane: Lane[str] = Lane("a", FixedLimit(1))
    assert lane.tokens_per_s is None
    lane.finished(10.0, completion_tokens=1000)
    lane.finished(5.0, completion_tokens=10)
    assert lane.tokens_per_s == (1000 + 10) / (10.0 + 5.0)


def test_a_lanes_output_spread_tells_answers_of_one_length_from_a_mix() -> None:
    alike: Lane[str] = Lane("a", FixedLimit(1))
    assert alike.output_spread is None
    for _ in range(50):
        alike.finished(10.0, completion_tokens=4096)
    assert alike.output_spread == pytest.approx(0.0, abs=1e-6)
    mixed: Lane[str] = Lane("b", FixedLimit(1))
    for _ in range(50):
        mixed.finished(2.0, completion_tokens=64)
        mixed.finished(8.0, completion_tokens=256)
    # two lengths in equal shares: a standard deviation of 96 on a mean of 160
    assert mixed.output_spread == pytest.approx(96 / 160, rel=0.1)


class Category:
    """A category whose answers are expected to run 100 tokens, of prompts a token a character."""

    def cohort(self, prompt_chars: np.ndarray, age_s: np.ndarray, made_tokens: np.ndarray) -> Cohort:
        return Cohort(prompt_chars, age_s, made_tokens, self.expected_output(), 256)

    def prompt_tokens(self, prompt_chars: float) -> float:
        return prompt_chars

    def expected_output(self) -> float:
        return 100.0


CATEGORY = Category()


class Footprint:
    def __init__(self, prompt: int) -> None:
        self.model = CATEGORY
        self.prompt_chars = prompt


def in_flight(lane: Lane[str], now: float) -> list[tuple[float, float, float]]:
    """(prompt tokens, age, tokens made) of each request the lane counts."""
    return sorted(
        (prompt, age, made)
        for cohort in lane.cohorts(now)
        for prompt, age, made in zip(cohort.prompt_tokens, cohort.age_s, cohort.made_tokens, strict=True)
    )


async def test_a_lane_counts_its_footprints_from_admission_to_release() -> None:
    lane: Lane[str] = Lane("a", FixedLimit(4))
    limiter: Limiter[str] = Limiter([lane])
    first, second = Footprint(10), Footprint(20)
    await limiter.acquire(first)
    admitted = time.monotonic()
    await limiter.acquire(second)
    await limiter.acquire()  # a request without a footprint takes a slot and is not counted
    later = admitted + 3.0
    assert [(prompt, round(age)) for prompt, age, _ in in_flight(lane, later)] == [(10.0, 3), (20.0, 3)]
    await limiter.release(lane, first)
    assert [prompt for prompt, _, _ in in_flight(lane, later)] == [20.0] and lane.in_flight == 2


async def test_a_paced_waiter_woken_late_takes_what_it_was_owed_in_one_go() -> None:
    """The event loop wakes the waiter late (here: blocked for 1 s): the admissions due in that time
    go through when it wakes, not one bucket per wake-up (which would take 0.8 s more here)."""
    lane: Lane[str] = Lane("paced", FixedLimit(50))
    limiter: Limiter[str] = Limiter([lane])
    lane.pacer.set(10.0, burst=2.0, now=time.monotonic())
    for _ in range(2):
        await limiter.acquire()  # the bucket
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)  # it waits 0.1 s for the next token ...
    time.sleep(1.0)  # ... and the loop is busy for a second
    await waiter

    async def owed() -> None:
        for _ in range(8):
            await limiter.acquire()

    await asyncio.wait_for(owed(), timeout=0.2)
    assert lane.in_flight == 11


async def test_dispatchers_take_turns_for_freed_slots() -> None:
    """Two categories' dispatchers contend for one slot at a time: they alternate. (A dispatcher that
    had just been admitted used to queue again before the other woke up, and won every slot: a run's
    categories went one after the other instead of side by side.)"""
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(1))])
    order: list[str] = []
    held: asyncio.Queue[Lane[str]] = asyncio.Queue()

    async def dispatcher(name: str) -> None:
        for _ in range(6):
            lane = await limiter.acquire()
            order.append(name)
            held.put_nowait(lane)

    tasks = [asyncio.create_task(dispatcher(name)) for name in ("x", "y")]
    for _ in range(12):
        lane = await asyncio.wait_for(held.get(), 1)
        await asyncio.sleep(0)
        await limiter.release(lane)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    # x is admitted at once and queues again before y asks; from then on they take turns
    assert order == ["x"] + ["x", "y"] * 5 + ["y"]


async def test_a_cancelled_waiter_at_the_head_lets_the_next_one_in() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(1))])
    first = await limiter.acquire()
    head = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    behind = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    head.cancel()
    await asyncio.gather(head, return_exceptions=True)
    await limiter.release(first)
    lane = await asyncio.wait_for(behind, 1)
    assert lane.endpoint == "a" and limiter.in_flight == 1 and limiter.waiting == 0


async def test_a_paced_lane_passed_over_for_one_with_room_is_not_owed_a_burst_later() -> None:
    """The waiter was told to come back to the paced lane, then served by the other: the paced lane's
    quiet spell from then on earns one bucket, not every token since (a burst of refills)."""
    paced, free = Lane("paced", FixedLimit(10)), Lane("free", FixedLimit(10))
    limiter: Limiter[str] = Limiter([paced, free])
    paced.pacer.set(10.0, 1.0, time.monotonic())
    paced.pacer.take(time.monotonic())  # its bucket spent
    for _ in range(9):
        await limiter.acquire()  # the paced lane has more room but must wait: the free one serves
    assert paced.in_flight == 0 and free.in_flight == 9
    await asyncio.sleep(0.5)  # five tokens' time at 10 a second
    now = time.monotonic()
    admitted = 0
    while paced.pacer.wait_s(now) == 0.0:
        paced.pacer.take(now)
        admitted += 1
    assert admitted == 1


async def test_a_release_cancelled_while_it_waits_to_wake_the_others_still_frees_its_slot() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(2))])
    lane = await limiter.acquire()
    async with limiter._changed:  # another coroutine holds the condition
        release = asyncio.create_task(limiter.release(lane))
        await asyncio.sleep(0.01)
        release.cancel()
        await asyncio.gather(release, return_exceptions=True)
    assert release.cancelled() and limiter.in_flight == 0


async def test_a_closed_gate_stops_every_waiter_now_and_later_and_still_counts_releases() -> None:
    limiter: Limiter[str] = Limiter([Lane("a", FixedLimit(1))])
    first = await limiter.acquire()
    waiters = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
    await asyncio.sleep(0.01)
    await limiter.close("unauthorized (401)")
    await limiter.close("a second reason")  # the first one is what the user reads
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 1)
    assert all(isinstance(r, GateClosed) and r.reason == "unauthorized (401)" for r in results)
    await limiter.release(first)
    with pytest.raises(GateClosed):
        await limiter.acquire()  # even with room
    assert limiter.in_flight == 0 and limiter.waiting == 0 and limiter.closed.is_set()


async def test_a_request_that_ends_between_decisions_frees_the_credit_its_end_makes() -> None:
    """Two requests that will hold 200 tokens each leave no room for a third under a budget of 450;
    when one ends, the credit is worked out again at once, not at the next decision."""
    lane: Lane[str] = Lane("a", FixedLimit(10))
    limiter: Limiter[str] = Limiter([lane])
    lane.finished(1.0, completion_tokens=100)  # 100 tokens a second: a 1 s life
    lane.budget_tokens, lane.credit = 450.0, 2
    first, second = Footprint(100), Footprint(100)
    await limiter.acquire(first)
    await limiter.acquire(second)
    waiter = asyncio.create_task(limiter.acquire(Footprint(100)))
    await asyncio.sleep(0.01)
    assert not waiter.done() and lane.credit == 0
    await limiter.release(lane, first)
    assert await asyncio.wait_for(waiter, 1) is lane and lane.credit == 0  # the one newcomer that fits


async def test_the_last_end_of_a_spent_batch_leaves_no_waiter_stranded() -> None:
    """With nothing counted in flight there is no projection to hold admissions back: the last
    release opens the lane, as the law's next decision would (which wakes nobody by itself)."""
    lane: Lane[str] = Lane("a", FixedLimit(10))
    limiter: Limiter[str] = Limiter([lane])
    lane.finished(1.0, completion_tokens=100)
    lane.budget_tokens, lane.credit = 450.0, 1
    only = Footprint(100)
    await limiter.acquire(only)
    waiter = asyncio.create_task(limiter.acquire(Footprint(100)))
    await asyncio.sleep(0.01)
    assert not waiter.done() and lane.credit == 0
    await limiter.release(lane, only)
    assert await asyncio.wait_for(waiter, 1) is lane


async def test_a_lane_paced_at_zero_admits_again_when_the_next_decision_paces_it() -> None:
    lane: Lane[str] = Lane("a", FixedLimit(10))
    limiter: Limiter[str] = Limiter([lane])
    lane.pacer.set(0.0, burst=1.0, now=time.monotonic())
    await limiter.acquire()  # the bucket
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiter.done()
    lane.pacer.set(1000.0, burst=1.0, now=time.monotonic())
    await limiter.notify()
    assert await asyncio.wait_for(waiter, 1) is lane


async def test_a_lane_counts_each_footprints_progress_on_the_decode_clock() -> None:
    """A request admitted while few ran and one admitted later are as far along as the server's rate
    made them, whatever the answers' average rate says."""
    lane: Lane[str] = Lane("a", FixedLimit(4))
    limiter: Limiter[str] = Limiter([lane])
    lane.finished(10.0, completion_tokens=1000)  # the answers' average: 100 tokens/s
    start = time.monotonic()
    lane.read_server(start, ServerSample("sglang-metrics", running=10, decode_tokens_per_s=3000.0))
    early, late = Footprint(10), Footprint(20)
    await limiter.acquire(early)
    lane.read_server(start + 1.0, ServerSample("sglang-metrics", running=10, decode_tokens_per_s=3000.0))
    await limiter.acquire(late)
    assert lane.tokens_per_s == pytest.approx(300.0)  # the server's, once it says one
    made = {prompt: tokens for prompt, _, tokens in in_flight(lane, time.monotonic())}
    assert made[10.0] == pytest.approx(300.0, abs=15.0) and made[20.0] == pytest.approx(0.0, abs=15.0)


async def test_an_admission_spends_the_credit_by_its_own_size_not_the_average_in_flight() -> None:
    """The credit counts newcomers like those in flight (prompts of 100, answers of 100: 200 tokens);
    newcomers of 300-token prompts hold 400 each, so a credit of 4 admits two of them, and small ones
    take less: the budget's tokens are spent, not its count."""
    lane: Lane[str] = Lane("a", FixedLimit(10))
    limiter: Limiter[str] = Limiter([lane])
    lane.finished(1.0, completion_tokens=100)
    await limiter.acquire(Footprint(100))
    await limiter.acquire(Footprint(100))
    lane.set_credit(4, lane.outlook(time.monotonic()))
    await limiter.acquire(Footprint(300))
    await limiter.acquire(Footprint(300))
    waiter = asyncio.create_task(limiter.acquire(Footprint(300)))
    await asyncio.sleep(0.01)
    assert not waiter.done() and lane.credit == pytest.approx(0.0)
    waiter.cancel()
    lane.set_credit(1, lane.outlook(time.monotonic()))  # in flight now: 200 + 100 tokens on average
    await limiter.acquire(Footprint(50))  # 150 tokens: half the newcomer the credit counted
    assert lane.credit == pytest.approx(0.5) and lane.room == 0
