"""The admission pacer: a token bucket that lets ordinary refills through and spreads a burst."""

from __future__ import annotations

import itertools

import pytest

from flows.control.pacer import Pacer


def test_unpaced_admits_at_once() -> None:
    pacer = Pacer()
    for _ in range(100):
        assert pacer.wait_s(0.0) == 0.0
        pacer.take(0.0)


def test_a_burst_beyond_the_bucket_is_spread_at_the_rate() -> None:
    pacer = Pacer()
    pacer.set(4.0, burst=3.0, now=0.0)
    admitted_at = []
    now = 0.0
    while len(admitted_at) < 11:
        wait = pacer.wait_s(now)
        if wait == 0.0:
            pacer.take(now)
            admitted_at.append(now)
        else:
            now += wait
    assert admitted_at[:3] == [0.0, 0.0, 0.0]  # the bucket starts full
    gaps = [b - a for a, b in itertools.pairwise(admitted_at[2:])]
    assert gaps == pytest.approx([0.25] * 8)  # then one every 1 / rate


def test_tokens_accrue_only_up_to_the_bucket() -> None:
    pacer = Pacer()
    pacer.set(1.0, burst=2.0, now=0.0)
    pacer.take(0.0)
    pacer.take(0.0)  # and nobody asks again until 100 s: a quiet spell, no waiter
    assert pacer.wait_s(100.0) == 0.0
    pacer.take(100.0)
    pacer.take(100.0)
    assert pacer.wait_s(100.0) > 0.0  # a long quiet spell earned two, not a hundred


def test_switching_pacing_off_and_on() -> None:
    pacer = Pacer()
    pacer.set(1.0, burst=1.0, now=0.0)
    pacer.take(0.0)
    assert pacer.wait_s(0.0) > 0.0
    pacer.set(None, burst=1.0, now=0.0)
    assert pacer.wait_s(0.0) == 0.0
    pacer.set(1.0, burst=2.0, now=0.0)
    assert pacer.wait_s(0.0) == 0.0  # pacing resumes with a full bucket: nothing waits at the switch


def test_a_waiter_woken_late_gets_what_it_was_owed() -> None:
    """A 70 ms timer woken a second late (a busy loop, a shared core) must not cost the second's
    admissions: the rate holds on average, whatever the bucket."""
    pacer = Pacer()
    pacer.set(10.0, burst=2.0, now=0.0)
    pacer.take(0.0)
    pacer.take(0.0)
    assert pacer.wait_s(0.0) == pytest.approx(0.1)  # come back at 0.1 s ...
    admitted = 0
    while pacer.wait_s(1.1) == 0.0:  # ... woken at 1.1 s
        pacer.take(1.1)
        admitted += 1
    assert admitted == 11  # one second at 10/s since the promised 0.1 s, and the token due then
    assert pacer.wait_s(1.1) == pytest.approx(0.1)  # then paced again


def test_nothing_is_owed_for_a_quiet_spell_or_a_wait_for_room() -> None:
    pacer = Pacer()
    pacer.set(10.0, burst=2.0, now=0.0)
    pacer.take(0.0)
    pacer.take(0.0)
    assert pacer.wait_s(0.0) > 0.0
    pacer.forget_waiter()  # the lane filled: the waiter now waits for room (e.g. after a back-off)
    admitted = 0
    while pacer.wait_s(30.0) == 0.0:
        pacer.take(30.0)
        admitted += 1
    assert admitted == 2  # thirty seconds without room earned one bucket, not 300 admissions at once


def test_a_rate_of_zero_admits_the_bucket_then_nothing_until_a_new_rate() -> None:
    """The law paces at zero while a cohort at the budget has yet to end (the outlook's stream)."""
    pacer = Pacer()
    pacer.set(0.0, burst=2.0, now=0.0)
    for _ in range(2):
        assert pacer.wait_s(0.0) == 0.0
        pacer.take(0.0)
    assert pacer.wait_s(100.0) == float("inf")
    pacer.set(10.0, burst=2.0, now=100.0)
    assert pacer.wait_s(100.0) == pytest.approx(0.1)
