"""The law replayed on a timeline recorded against the REAL SGLang 0.5.23 (CPU, tiny-llm, KV pool
16,384 tokens, 64 max running; 300 prompts in two categories, max_tokens 64 and 256).

The recording holds everything the law was given at each tick (`observation_from_row`), so today's
law can be replayed on it: it must decide the same way twice, stay in its bounds, back off on every
recorded retraction (once per event) and never grow into a flooded queue.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from outlook_support import cohort

from flows.config import ConcurrencyConfig
from flows.control.adaptive import AdaptiveLimit, LawSettings, Observation
from flows.control.lengths import AnswerLengths
from flows.control.outlook import project
from flows.control.signals import ServerSample
from flows.control.timeline import Timeline, observation_from_row, read_timeline
from flows.control.wiring import law_settings

RECORDED = (
    Path(__file__).resolve().parents[1] / "fixtures" / "timelines" / "sglang_0.5.23_adaptive_300.parquet"
)


def _rows() -> list[dict]:
    return pq.read_table(RECORDED).to_pylist()


def test_the_recording_is_a_real_engine_run_with_retractions() -> None:
    rows = _rows()
    assert len(rows) > 30
    assert {r["source"] for r in rows} == {"sglang-metrics"}
    assert {r["capacity_tokens"] for r in rows} == {16384}
    assert sum(r["retractions"] for r in rows) > 0  # the hard case is in it


def test_replay_is_deterministic_bounded_and_backs_off_on_every_retraction() -> None:
    settings = LawSettings(min_limit=2, max_limit=200)
    observations = [observation_from_row(r) for r in _rows()]
    first = [d for d in map(AdaptiveLimit(settings).observe, observations)]
    again = [d for d in map(AdaptiveLimit(settings).observe, observations)]
    assert first == again
    assert all(2 <= d.limit <= 200 for d in first)
    retracted = [d for d in first if d.retractions]
    # every retraction backs off, or finds the limit already cut (the requests above it draining,
    # or those admitted before the cut retracted with the cache below full)
    assert retracted and all(
        d.limit < d.previous
        or d.previous == 2
        or (d.limit == d.previous and (d.in_flight > d.limit or "before the cut" in d.reason))
        for d in retracted
    )
    assert any(d.limit < d.previous for d in retracted)
    flooded = [d for d in first if d.queued is not None and d.queued > 2 * d.queue_allowance]
    assert all(d.limit <= d.previous for d in flooded)


OUTLOOK_RUN = RECORDED.with_name("sglang_0.5.23_outlook_300.parquet")
"""The same workload recorded with the outlook's budget (the timeline of a `--settings adaptive` run of
`bench.adaptive_concurrency --prompts 300 --keep DIR`, re-recorded 2026-12-03 when the occupancy
began to read SGLang's lagging gauges against the model of the tick before): one retraction in it,
answers of spread lengths (so unpaced)."""


def test_a_run_recorded_with_the_outlook_replays_decision_for_decision() -> None:
    """The timeline holds the outlook and the answers' spread the law was given, so today's law gives
    the recorded limits, credits and paces again. A change to the law changes them: record the run
    again."""
    rows = pq.read_table(OUTLOOK_RUN).to_pylist()
    law = AdaptiveLimit(law_settings(ConcurrencyConfig()))
    replayed = [law.observe(observation_from_row(row)) for row in rows]
    assert [(d.limit, d.credit, d.pace_per_s) for d in replayed] == [
        (r["limit"], r["credit"], r["pace_per_s"]) for r in rows
    ]
    backed_off = [d for d, r in zip(replayed, rows, strict=True) if r["retractions"]]
    assert len(backed_off) == 1 and backed_off[0].limit < backed_off[0].previous
    assert any(r["credit"] == 0 and r["waiting"] for r in rows)  # the budget held prompts back
    assert all(d.pace_per_s is None for d in replayed)  # lengths of 64 and 256 tokens: unpaced


LOADS_RUN = RECORDED.with_name("sglang_0.5.23_loads_300.parquet")
"""The same workload recorded with SGLang read both ways each tick (`/metrics` for the counters,
`/v1/loads` for the load and the decode steps that run the decode clock): no retraction.
Re-recorded 2026-12-06 when an over-target cut became a pause (the limit before it given back), and
again when a trim came to need a long server queue in two readings running (twenty-sixth session),
and when the budget came to stop at the server's `max_running_requests` (the timeline then began to
keep it; twenty-seventh session)."""


def test_a_run_recorded_with_the_loads_and_the_step_clock_replays_decision_for_decision() -> None:
    rows = pq.read_table(LOADS_RUN).to_pylist()
    assert {r["source"] for r in rows} == {"sglang-metrics+loads"}
    steps = [r["decode_steps"] for r in rows]
    assert steps == sorted(steps) and steps[-1] > steps[0] > 0  # the server's own step count
    law = AdaptiveLimit(law_settings(ConcurrencyConfig()))
    replayed = [law.observe(observation_from_row(row)) for row in rows]
    assert [(d.limit, d.credit, d.pace_per_s) for d in replayed] == [
        (r["limit"], r["credit"], r["pace_per_s"]) for r in rows
    ]
    assert sum(r["retractions"] for r in rows) == 0
    assert any(r["credit"] == 0 and r["waiting"] for r in rows)
    assert {r["max_running"] for r in rows} == {64}  # the server runs 64 at once: the budget stops there
    assert all(d.budget_limit is None or d.budget_limit <= 64 + d.queue_allowance for d in replayed)
    assert replayed[0].budget_limit == 64 + replayed[0].queue_allowance  # the slow start's jump
    paused = [d for d in replayed if d.reason.startswith("over target")]
    resumed = [d for d in replayed if d.reason.startswith("under the target again")]
    assert paused and resumed and resumed[0].at > paused[0].at and resumed[0].limit > resumed[0].previous


@pytest.mark.parametrize("lengths", [None, AnswerLengths.learn([64, 200, 256, 256], 0.95, 256, 1.0)])
def test_a_decision_written_to_the_timeline_reads_back_as_what_the_law_was_given(
    tmp_path: Path, lengths: AnswerLengths | None
) -> None:
    """With the answers' lengths known the outlook carries what a newcomer holds slice by slice."""
    sample = ServerSample(
        source="vllm-metrics",
        kv_usage=0.5,
        running=10,
        queued=2,
        preemptions_total=3.0,
        capacity_tokens=16384,
        block_tokens=128,
        max_running=48,
        generation_tokens_total=1000.0,
    )
    outlook = project([cohort(300.0, 200.0, 256, [0.5, 1.0, 2.0], lengths)], 50.0, pad_tokens=63.5)
    assert outlook is not None and (outlook.newcomer_sizes is None) == (lengths is None)
    observation = Observation(
        at=12.5,
        server=sample,
        in_flight=12,
        waiting=4,
        outlook=outlook,
        completions_per_s=3.5,
        request_life_s=4.0,
        output_spread=0.2,
    )
    timeline = Timeline(tmp_path)
    timeline.add("http://a", AdaptiveLimit().observe(observation), sample, outlook)
    timeline.write()
    (row,) = read_timeline(tmp_path)
    assert observation_from_row(row) == observation
