"""What a live run shows in an orchestrator's UI: progress with a total when one is known, a table per
category, the endpoints' load, and the run-level events worth a log line.

Plain data from a session (no Prefect here): ``flows/orchestration/flow.py`` turns it into artifacts and log
lines every few seconds, never per request.

The total of a run is known per category once its prompt stream has ended (``StreamCounts.exhausted``:
the source was read, or the category's limit was reached): it is then exactly the items handed to the
pipeline. Before that, a category with a ``limit`` is bounded by it; one without is unknown, and the
progress then covers the prompts read so far and says so.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flows.run.reasons import commonest_reasons

if TYPE_CHECKING:
    from flows.report.status import CategoryStatus
    from flows.run.categories import CategoryRun
    from flows.run.session import RunSession

RATE_WINDOW_S = 30.0
"""Current rates are measured over this window (the whole run's average is in the summary)."""


@dataclass(frozen=True)
class CategoryProgress:
    name: str
    already_done: int
    done: int
    """Settled in this run: rows + rejects."""
    total: int | None
    """Items this run will settle, when known (exact once the stream ended, else the limit's bound)."""
    exact: bool

    @property
    def pending(self) -> int:
        return max((self.total or 0) - self.done, 0)


def category_progress(
    name: str, run: CategoryRun, source_rows: int | None = None, done_before: int = 0
) -> CategoryProgress:
    """``source_rows``: the source's row count when cheaply known (``prompts.readers.count_rows``);
    ``done_before``: prompts the category already had on disk at this start."""
    counts, tally = run.counts, run.sink.tally
    done = tally.rows + tally.rejects
    if counts.exhausted:
        return CategoryProgress(name, counts.already_done, done, counts.yielded, True)
    bounds = []
    if run.config.limit is not None:  # taken (already done included) stops at the limit; rejects add
        bounds.append(max(run.config.limit - counts.already_done, 0) + counts.rejected.total())
    if source_rows is not None:  # every source row not already done, at most
        bounds.append(max(source_rows - done_before, 0))
    if not bounds:
        return CategoryProgress(name, counts.already_done, done, None, False)
    return CategoryProgress(name, counts.already_done, done, max(min(bounds), counts.yielded), False)


@dataclass(frozen=True)
class RunProgress:
    """The run's progress: percent (0..100), what it is a percent of, speed and ETA."""

    percent: float
    done: int
    total: int | None
    already_done: int
    rows_per_s: float
    eta_s: float | None
    description: str


def run_progress(
    session: RunSession,
    rows_per_s: float,
    *,
    finished: bool = False,
    source_rows: dict[str, int | None] | None = None,
) -> RunProgress:
    """Progress over every configured category; ``finished`` (the run ended normally) is 100%.

    ``source_rows``: each category's source row count where cheaply known (a bound before its
    stream ends, so the total is there from the first second).
    """
    runs, states, sizes = session.categories.runs, session.categories.states, source_rows or {}
    names = [c.name for c in session.config.categories]
    parts = []
    for category in session.config.categories:
        before = len(states[category.name].done_ids) if category.name in states else 0
        if category.name in runs:
            size = sizes.get(category.name)
            parts.append(category_progress(category.name, runs[category.name], size, before))
            continue
        bounds = [n for n in (category.limit, sizes.get(category.name)) if n is not None]
        total = max(min(bounds) - before, 0) if bounds else None
        parts.append(CategoryProgress(category.name, 0, 0, total, False))
    done = sum(p.done for p in parts)
    already = sum(p.already_done for p in parts)
    known = all(p.total is not None for p in parts)
    total = sum(p.total or 0 for p in parts) if known else None
    eta: float | None
    if finished:
        percent, eta = 100.0, 0.0
        total = done
    elif total is not None:
        percent = 100.0 * done / total if total else 100.0
        eta = (total - done) / rows_per_s if rows_per_s > 0 else None
    else:
        read = sum(runs[name].counts.yielded for name in names if name in runs)
        percent = 100.0 * done / read if read else 0.0
        eta = None
    percent = min(round(percent, 1), 100.0)
    resumed = f" ({already} done before this start)" if already else ""
    if finished:
        what = f"done: {done} prompts settled in this run{resumed}"
    elif total is not None:
        exact = all(p.exact for p in parts)
        what = f"{done} of {total}{'' if exact else ' (at most)'} prompts settled{resumed}"
        what += f", {rows_per_s:.1f}/s" + (f", ETA {_duration(eta)}" if eta is not None else "")
    else:
        what = (
            f"{done} prompts settled{resumed}, {rows_per_s:.1f}/s; total unknown until the source is read "
            "(the percent is of the prompts read so far)"
        )
    return RunProgress(percent, done, total, already, rows_per_s, eta, what)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class Rates:
    """Current rates from a short window of (time, rows+rejects, output tokens) samples."""

    window_s: float = RATE_WINDOW_S
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)

    def add(self, done: int, tokens: int, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self.samples.append((at, done, tokens))
        while len(self.samples) > 2 and at - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def per_s(self) -> tuple[float, float]:
        """(settled prompts/s, output tok/s) over the window; zeros until two samples exist."""
        if len(self.samples) < 2:
            return 0.0, 0.0
        (t0, d0, k0), (t1, d1, k1) = self.samples[0], self.samples[-1]
        span = max(t1 - t0, 1e-9)
        return (d1 - d0) / span, (k1 - k0) / span


def category_table(
    session: RunSession, name: str, tok_per_s: float | None = None, disk: CategoryStatus | None = None
) -> list[dict[str, Any]]:
    """A category's numbers as rows of (metric, value): what the table artifact shows.

    Live, they come from the session's counters; at the end ``disk`` (the category read back from the
    files, as `datagen status` reads it) adds the totals over every start and the standing rejects.
    """
    run = session.categories.runs[name]
    tally, counts = run.sink.tally, run.counts
    progress = category_progress(name, run)
    elapsed = max(session.elapsed_s(), 1e-9)
    rate = tok_per_s if tok_per_s is not None else tally.completion_tokens / elapsed
    rows: list[tuple[str, Any]] = [
        ("rows (this run)", tally.rows),
        ("rejects (this run)", tally.rejects),
        ("done before this start", counts.already_done),
        ("to settle in this run", "unknown yet" if progress.total is None else progress.total),
        ("truncated", tally.truncated),
        ("output tokens", tally.completion_tokens),
        ("output tok/s", round(rate, 1)),
        ("retried attempts", tally.retried_attempts),
    ]
    rows += [(f"finish: {reason}", n) for reason, n in sorted(tally.finish_reasons.items())]
    rows += _reason_rows("reject", tally.reject_reasons)
    if disk is not None:
        rows += [
            ("rows on disk (all starts)", disk.rows),
            ("training rows on disk", disk.training_rows),
            ("rejects on disk (standing)", disk.rejects),
            ("output tokens on disk", disk.completion_tokens),
        ]
        rows += _reason_rows("on disk", disk.reject_reasons)
    return [{"metric": metric, "value": str(value)} for metric, value in rows]


TABLE_REASONS = 10
"""Reject reasons a category's card lists: a server's refusal quotes the prompt's own numbers ("you
requested 5123 tokens"), so a week of long prompts is thousands of distinct reasons, and the whole
table goes to the API every few seconds. Every reason is in the rejects files and `datagen status`."""


def _reason_rows(label: str, reasons: Mapping[str, int]) -> list[tuple[str, Any]]:
    return [(f"{label}: {reason}", n) for reason, n in commonest_reasons(reasons, TABLE_REASONS)]


def endpoint_table(session: RunSession) -> list[dict[str, Any]]:
    """Per endpoint: limit, in flight, KV usage, server queue, the controller's last reason, restarts."""
    restarts = {e.client.endpoint: e.guard.restarts for e in session.pool.endpoints}
    table = []
    for view in session.snapshot()["endpoints"]:
        table.append(
            {
                "endpoint": view["endpoint"],
                "limit": view["limit"],
                "in flight": view["in_flight"],
                "KV usage": "-" if view["kv_usage"] is None else f"{view['kv_usage']:.0%}",
                "server queue": "-" if view["queued"] is None else view["queued"],
                "server busy": "-" if view["busy"] is None else f"{view['busy']:.0%}",
                "controller": view["reason"] or "-",
                "restarts": restarts.get(view["endpoint"], 0),
            }
        )
    return table


LIMIT_RISE_WORTH_A_LINE = 0.25
LIMIT_DROP_WORTH_A_LINE = 0.10
"""A limit rising by a quarter or dropping by a tenth is a run-level event; small steps are not."""
LIMIT_LINE_EVERY_S = 600.0
"""After a concurrency line, an endpoint's next one waits this long and sums up what the limit did
meanwhile. The law moves with each cohort of requests: a line per big change was 5-10 lines a
minute on the real SGLang and the simulator, 50,000-100,000 a week in the Prefect UI's log."""


@dataclass
class _LimitWindow:
    """One endpoint's limit since its last concurrency line."""

    low: int
    high: int
    said_at: float | None = None
    changed: bool = False
    """A change worth a line happened since the last line."""

    def reset(self, limit: int, now: float) -> None:
        self.low = self.high = limit
        self.said_at, self.changed = now, False


@dataclass
class RunEvents:
    """Successive looks at a session: what happened that a person would want as a log line."""

    limits: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    windows: dict[str, _LimitWindow] = field(default_factory=dict)

    @staticmethod
    def start_line(session: RunSession) -> str:
        """Once the categories' done-sets are read: a fresh start, or a resume with what is done."""
        names = ", ".join(c.name for c in session.config.categories)
        done = sum(len(state.done_ids) for state in session.categories.states.values())
        if session.resumed:
            return (
                f"run {session.config.run.name} resumed in {session.store.url()}: {done} prompts "
                f"already done are skipped (categories: {names})"
            )
        return f"run {session.config.run.name} started in {session.store.url()} (categories: {names})"

    @staticmethod
    def category_line(name: str, run: CategoryRun) -> str:
        tally = run.sink.tally
        return (
            f"category {name} finished: {tally.rows} rows, {tally.rejects} rejects, "
            f"{tally.completion_tokens} output tokens in this run ({run.counts.already_done} done before)"
        )

    def look(self, session: RunSession, now: float | None = None) -> list[str]:
        """Server restarts, and concurrency changes that matter (a back-off, or a quarter or more):
        the first at once, then at most one line per endpoint every ``LIMIT_LINE_EVERY_S``, with the
        range the limit took since the last."""
        now = time.monotonic() if now is None else now
        lines: list[str] = []
        for endpoint in session.pool.endpoints:
            key = endpoint.client.endpoint
            if endpoint.guard.restarts > self.restarts.get(key, 0):
                lines.append(f"server {key} restarted (restart {endpoint.guard.restarts} in this run)")
            self.restarts[key] = endpoint.guard.restarts
        for view in session.snapshot()["endpoints"]:
            key, limit = view["endpoint"], int(view["limit"])
            before = self.limits.get(key, limit)
            self.limits[key] = limit
            window = self.windows.setdefault(key, _LimitWindow(limit, limit))
            window.low, window.high = min(window.low, limit), max(window.high, limit)
            share = (limit - before) / max(before, 1)
            window.changed |= share >= LIMIT_RISE_WORTH_A_LINE or -share >= LIMIT_DROP_WORTH_A_LINE
            if not window.changed or (
                window.said_at is not None and now - window.said_at < LIMIT_LINE_EVERY_S
            ):
                continue
            reason = f" ({view['reason']})" if view["reason"] else ""
            if window.said_at is None:
                lines.append(f"concurrency on {key}: {before} -> {limit} in flight{reason}")
            else:
                span = f"{window.low}-{window.high} over the last {_duration(now - window.said_at)}"
                lines.append(f"concurrency on {key}: {limit} in flight{reason}; {span}")
            window.reset(limit, now)
        return lines
