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
    pacer.take(0.0)
    assert pacer.wait_s(0.5) == pytest.approx(0.5)
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


def test_a_grant_admits_a_raised_limits_room_at_once_and_refills_stay_paced() -> None:
    pacer = Pacer()
    pacer.set(1.0, burst=2.0, now=0.0)
    pacer.take(0.0)
    pacer.take(0.0)
    pacer.grant(5)
    for _ in range(5):
        assert pacer.wait_s(0.1) == 0.0  # the grant stands above the bucket, and time does not cap it
        pacer.take(0.1)
    assert pacer.wait_s(0.1) > 0.0


def test_no_grant_while_unpaced() -> None:
    pacer = Pacer()
    pacer.grant(5)
    pacer.set(1.0, burst=1.0, now=0.0)
    pacer.take(0.0)
    assert pacer.wait_s(0.0) == pytest.approx(1.0)  # the unpaced grant was not banked
