"""The decode clock: each request's progress from the server's decode rate, integrated since admission."""

from __future__ import annotations

import pytest
from outlook_support import cohort

from flows.control.decode_clock import DecodeClock
from flows.control.lengths import AnswerLengths
from flows.control.outlook import project


def test_a_request_makes_what_the_server_decoded_per_running_request_since_its_admission() -> None:
    clock = DecodeClock()
    clock.observe(0.0, throughput=6000.0, running=60, fallback=None)  # 100 tokens/s each
    admitted = clock.reading(0.5)
    clock.observe(1.0, throughput=6000.0, running=60, fallback=None)
    assert clock.reading(1.0) - admitted == pytest.approx(50.0)
    for second in range(2, 12):  # the batch falls to 20 at the same throughput: each 3x faster
        clock.observe(float(second), throughput=6000.0, running=20, fallback=None)
    assert clock.server_rate == pytest.approx(300.0, rel=0.03)
    # made in all: the first half second at 100, then a rate that rose towards 300 a second
    made = clock.reading(11.0) - admitted
    assert 50.0 + 100.0 * 10 < made < 50.0 + 300.0 * 10


def test_without_a_server_rate_the_clock_runs_at_the_fallback_and_stands_still_without_one() -> None:
    clock = DecodeClock()
    clock.observe(0.0, throughput=None, running=None, fallback=None)
    clock.observe(5.0, throughput=None, running=12, fallback=None)
    assert clock.reading(5.0) == 0.0  # nothing known: the outlook counts final sizes anyway
    clock.observe(6.0, throughput=None, running=12, fallback=40.0)  # vLLM: the answers' average
    assert clock.reading(8.0) == pytest.approx(80.0)
    clock.observe(8.0, throughput=0.0, running=0, fallback=40.0)  # an idle server says nothing new
    assert clock.server_rate is None and clock.reading(9.0) - clock.reading(8.0) == pytest.approx(40.0)


def test_the_last_server_rate_holds_while_the_server_is_unread() -> None:
    clock = DecodeClock()
    clock.observe(0.0, throughput=1000.0, running=10, fallback=5.0)
    clock.observe(1.0, throughput=None, running=None, fallback=5.0)  # a missed poll
    assert clock.server_rate == pytest.approx(100.0) and clock.reading(2.0) == pytest.approx(200.0)


def test_the_outlook_projects_from_what_each_request_has_made_not_from_its_age() -> None:
    """Two requests of the same age, one that ran while few others did (far along) and one that
    waited: the one far along is projected to end first."""
    lengths = AnswerLengths.single(1000.0)
    by_age = project([cohort(100.0, 1000.0, 1000, [2.0], lengths)], tokens_per_s=100.0)
    far = project([cohort(100.0, 1000.0, 1000, [2.0], lengths, made=[900.0])], tokens_per_s=100.0)
    assert by_age is not None and far is not None
    assert by_age.now_tokens == pytest.approx(100.0 + 200.0)
    assert far.now_tokens == pytest.approx(100.0 + 900.0)
    # 100 tokens from its end (1 s of the newcomer's 10 s life, slices of 0.3125 s): at its full size
    # just before, freed in the fourth slice
    assert max(far.peaks) == pytest.approx(1100.0, rel=1e-3) and far.peaks[3] == max(far.peaks)
    assert far.peaks[4:] == (0.0,) * (len(far.peaks) - 4)
    # counted by its age (200 made) it runs 8 s more: freed in slice 26, not 4
    assert by_age.peaks[25] == pytest.approx(1100.0, rel=1e-3) and by_age.peaks[26] == 0.0


def test_where_the_server_counts_its_decode_steps_the_clock_is_that_count_whatever_the_gauge_says() -> None:
    """SGLang's gauge said 130-170 tokens a second per request (8 ran when it was refreshed) for 2-3 s
    while 64 ran at about 27: a request admitted then was counted at its max_tokens within a second."""
    clock = DecodeClock()
    clock.observe(0.0, throughput=1200.0, running=8, fallback=None, steps=100.0)  # 150 each: stale
    assert clock.server_rate is None  # not the gauge's: the rate is known once two counts are
    admitted = clock.reading(0.5)
    clock.observe(1.0, throughput=1200.0, running=8, fallback=None, steps=127.0)
    # the count: 27 steps in the second, and that rate until the next reading
    assert clock.reading(1.0) == pytest.approx(27.0) and clock.server_rate == pytest.approx(27.0)
    clock.observe(3.0, throughput=1200.0, running=8, fallback=None, steps=181.0)
    assert clock.reading(3.0) - admitted == pytest.approx(81.0)  # what a request running all along made
    assert clock.reading(3.5) == pytest.approx(81.0 + 13.5)
    # an idle server runs no steps: the clock stands still
    clock.observe(5.0, throughput=None, running=0, fallback=40.0, steps=181.0)
    assert clock.reading(6.0) == pytest.approx(clock.reading(5.0)) == pytest.approx(81.0)
    # a restarted server's count starts again: no advance from it, counted again from there
    clock.observe(6.0, throughput=None, running=3, fallback=40.0, steps=2.0)
    clock.observe(7.0, throughput=None, running=3, fallback=40.0, steps=32.0)
    assert clock.server_rate == pytest.approx(30.0)
