"""The answers' lengths learned from what ended and from what still runs (``LengthExposure``)."""

from __future__ import annotations

import numpy as np
import pytest

from flows.control.lengths import LengthExposure

DECAY = 0.95


class Stream:
    """Requests admitted ``per_step`` a step, each making a token a step until its planned length;
    every step each request in flight tells the exposure how far it has run (as ``Lane`` does)."""

    def __init__(self, max_tokens: int, per_step: int, seed: int = 1) -> None:
        self.exposure = LengthExposure(max_tokens, DECAY)
        self.per_step = per_step
        self.rng = np.random.default_rng(seed)
        self.flights: list[list[int]] = []  # [planned length, made, bands counted]

    def run(self, steps: int, plan: object) -> None:
        for _ in range(steps):
            for _ in range(self.per_step):
                self.flights.append([int(plan(self.rng)), 0, 0])  # type: ignore[operator]
            for flight in self.flights:
                flight[2] = self.exposure.reach(flight[2], flight[1])
            for flight in [f for f in self.flights if f[1] >= f[0]]:
                self.exposure.end(flight[2], flight[0])
                self.flights.remove(flight)
            for flight in self.flights:
                flight[1] += 1


def uniform(low: int, high: int) -> object:
    return lambda rng: rng.integers(low, high)


def test_a_steady_stream_of_spread_lengths_is_learned_without_bias() -> None:
    """In flight, the long answers are over-represented (they stay longer); counted by exposure in
    the same decayed window as the answers that end, the lengths come out as planned."""
    stream = Stream(128, per_step=1)  # about 50 in flight, bands of a token
    stream.run(3000, uniform(1, 101))
    lengths = stream.exposure.lengths(prior_weight=0.0)
    assert lengths.mean() == pytest.approx(50, rel=0.15)
    quarters = lengths.at_least(np.array([25.0, 50.0, 75.0]))
    assert quarters.tolist() == pytest.approx([0.75, 0.5, 0.25], abs=0.12)


def test_at_the_start_the_requests_still_running_hold_the_share_that_runs_on() -> None:
    """A cohort admitted together, 300 steps in: a third of it has ended (uniform 1-900). The
    answers alone (and their prior) say nothing of the two thirds still running; with them the
    share past 300 is two thirds, and past what anyone has made the rest runs to the cap."""
    stream = Stream(1024, per_step=0)
    rng = np.random.default_rng(2)
    stream.flights = [[int(rng.integers(1, 900)), 0, 0] for _ in range(300)]
    stream.run(300, uniform(1, 900))
    lengths = stream.exposure.lengths(prior_weight=0.0)
    running = len(stream.flights) / 300
    assert lengths.at_least(np.array([300.0]))[0] == pytest.approx(running, abs=0.03)
    assert lengths.longer(np.array([310.0]))[0] == pytest.approx(lengths.at_least(np.array([1024.0]))[0])
    # the prior (faded over the 90 answers back) only leaves more of them running on
    with_prior = stream.exposure.lengths(prior_weight=20.0 * 0.98**90)
    assert running < with_prior.at_least(np.array([300.0]))[0] < running + 0.1


def test_a_shift_to_longer_answers_shows_as_the_young_requests_run_past_the_short_ones() -> None:
    """Short answers (1-500) for long, then every answer runs to the cap: before any long answer
    comes back, a request that has run 400 tokens is already expected to run past 480 three times
    as often (uniform short answers: one in five)."""
    stream = Stream(1000, per_step=1)
    stream.run(2000, uniform(1, 501))
    before = stream.exposure.lengths(prior_weight=0.0)
    stream.run(490, lambda rng: 1000)  # the long ones have made up to 490 tokens; none has ended
    after = stream.exposure.lengths(prior_weight=0.0)
    on_before = before.longer(np.array([480.0]))[0] / before.longer(np.array([400.0]))[0]
    on_after = after.longer(np.array([480.0]))[0] / after.longer(np.array([400.0]))[0]
    assert on_before < 0.3 and on_after > 3 * on_before


def test_a_clock_ahead_of_the_answer_is_set_right_at_its_end() -> None:
    """The decode clock counted a request to 300 tokens (it waited in the server's queue); its
    answer was 100: its exposure past 100 is taken back, never below nothing."""
    exposure = LengthExposure(1024, DECAY)
    ran = exposure.reach(0, 300.0)
    assert exposure.exposure[:ran].sum() == ran == 300 // 8
    exposure.end(ran, 100)
    counted = 100 // 8 + 1  # the 12 bands it ran through and the one it ended in
    assert exposure.exposure[:counted].tolist() == [1.0] * counted
    assert (exposure.exposure[counted:] == 0.0).all()
    assert exposure.lengths(prior_weight=0.0).mean() == pytest.approx(100.0, rel=0.02)  # the tail weight


def test_answers_that_run_to_the_cap_end_in_no_band_and_give_a_single_step() -> None:
    exposure = LengthExposure(4096, DECAY)
    for _ in range(30):
        exposure.end(exposure.reach(0, 4096.0), 4096)
    lengths = exposure.lengths(prior_weight=0.0)
    assert lengths.values.tolist() == [4096.0] and lengths.atoms.tolist() == [4096.0]


def test_short_caps_tell_every_token_apart() -> None:
    exposure = LengthExposure(64, 1.0)
    for tokens in (10, 20, 20, 40):
        exposure.end(0, tokens)
    lengths = exposure.lengths(prior_weight=0.0)
    assert lengths.values.tolist()[:3] == [10.0, 20.0, 40.0]
    assert lengths.at_least(np.array([11.0, 21.0]))[:2].tolist() == pytest.approx([0.75, 0.25], abs=1e-3)


def test_before_any_answer_every_answer_runs_to_the_cap() -> None:
    lengths = LengthExposure(4096, DECAY).lengths(prior_weight=20.0)
    assert lengths.at_least(np.array([1.0, 4096.0, 4097.0])).tolist() == [1.0, 1.0, 0.0]
    assert lengths.mean() == 4096.0 and lengths.atoms.tolist() == [4096.0]


def test_newer_answers_weigh_more_and_the_prior_counts_in_a_new_answers_units() -> None:
    """Decay 0.5: the answer of 1,000 weighs 1, the newer one of 100 weighs 2, the prior 4 (an
    answer counted now). Ended at 100: 2 of the 7 that ran there; at 1,000: 1 of the 5 left."""
    exposure = LengthExposure(4096, 0.5)
    exposure.end(0, 1000)
    exposure.end(0, 100)
    lengths = exposure.lengths(prior_weight=1.0)
    assert lengths.at_least(np.array([101.0, 1001.0])).tolist() == pytest.approx([5 / 7, 4 / 7])
    assert lengths.mean() == pytest.approx(2 / 7 * 100 + 1 / 7 * 1000 + 4 / 7 * 4096)


def test_a_request_past_every_answer_seen_runs_to_the_cap_however_faded_the_prior() -> None:
    exposure = LengthExposure(4096, DECAY)
    for _ in range(50):
        exposure.end(0, 100)
    lengths = exposure.lengths(prior_weight=0.0)
    running_on = lengths.at_least(np.array([200.0, 4096.0])) / lengths.longer(np.array([150.0]))
    assert running_on.tolist() == pytest.approx([1.0, 1.0])
    assert lengths.at_least(np.array([101.0]))[0] < 1e-4  # and weighs nothing beside the answers seen
