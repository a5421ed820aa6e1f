"""The live progress shown in the Prefect UI: a total from the first second, 100% at the end."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pipeline_support import empty_summary
from test_status import _run_dir
from typer.testing import CliRunner

from flows.cli.main import app
from flows.report.live import TABLE_REASONS, Rates, RunEvents, category_table, run_progress
from flows.run.prompt_stream import StreamCounts
from flows.run.pump import Tally
from prompts.readers import count_rows


def _session(
    limit: int | None, *, exhausted: bool, yielded: int, rows: int, rejects: int, before: int
) -> Any:
    counts = StreamCounts(yielded=yielded, exhausted=exhausted, taken=yielded + before, already_done=before)
    run = SimpleNamespace(
        config=SimpleNamespace(limit=limit),
        counts=counts,
        sink=SimpleNamespace(tally=Tally(rows=rows, rejects=rejects)),
    )
    state = SimpleNamespace(done_ids={f"d{i}" for i in range(before)})
    return SimpleNamespace(
        config=SimpleNamespace(categories=[SimpleNamespace(name="c", limit=limit)]),
        categories=SimpleNamespace(runs={"c": run}, states={"c": state}),
        pool=SimpleNamespace(engine=None),
    )


def test_a_counted_source_gives_a_total_and_an_eta_before_its_stream_ends() -> None:
    session = _session(None, exhausted=False, yielded=40, rows=30, rejects=2, before=10)
    progress = run_progress(session, 4.0, source_rows={"c": 110})
    assert progress.total == 100 and progress.percent == 32.0
    assert progress.eta_s == 17.0 and "at most" in progress.description
    assert "10 done before this start" in progress.description


def test_an_ended_stream_is_the_exact_total_and_a_limit_bounds_it_before() -> None:
    ended = run_progress(_session(100, exhausted=True, yielded=85, rows=80, rejects=5, before=0), 1.0)
    assert (ended.total, ended.percent) == (85, 100.0)  # a limit of 100 that only had 85 to ask
    bounded = run_progress(_session(100, exhausted=False, yielded=50, rows=25, rejects=0, before=0), 1.0)
    assert (bounded.total, bounded.percent) == (100, 25.0)


def test_an_unknown_total_says_so_and_the_end_is_100_percent() -> None:
    session = _session(None, exhausted=False, yielded=40, rows=10, rejects=0, before=0)
    progress = run_progress(session, 2.0)
    assert progress.total is None and progress.percent == 25.0 and "total unknown" in progress.description
    assert run_progress(session, 2.0, finished=True).percent == 100.0


def test_rates_are_over_the_window() -> None:
    rates = Rates(window_s=10)
    for second in range(30):
        rates.add(done=2 * second, tokens=100 * second, at=float(second))
    assert rates.per_s() == (2.0, 100.0)


def test_events_say_a_big_change_at_once_then_sum_up_the_limit_every_ten_minutes() -> None:
    views = iter([64, 60, 30, 45, 90, 90, 88, 88, 88])
    endpoint = SimpleNamespace(client=SimpleNamespace(endpoint="e"), guard=SimpleNamespace(restarts=0))

    def snapshot() -> dict[str, Any]:
        return {"endpoints": [{"endpoint": "e", "limit": next(views), "reason": "kv"}]}

    session = SimpleNamespace(snapshot=snapshot, pool=SimpleNamespace(endpoints=[endpoint]))
    events = RunEvents()
    at = [0.0, 3.0, 6.0, 9.0, 300.0, 606.0, 700.0, 1300.0, 1400.0]
    said = [events.look(session, now=t) for t in at]
    assert said == [
        [],
        [],  # a drop under a tenth
        ["concurrency on e: 60 -> 30 in flight (kv)"],
        [],  # within ten minutes of the last line: kept for the summing up
        [],
        ["concurrency on e: 90 in flight (kv); 30-90 over the last 10 min"],
        [],
        [],  # 90 -> 88 over the next ten minutes is no change worth a line
        [],
    ]


def test_count_rows_of_jsonl_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n{"x": 3}', encoding="utf-8")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "b.parquet")
    assert count_rows(str(tmp_path / "a.jsonl")) == 3
    assert count_rows(str(tmp_path / "b.parquet")) == 2
    assert count_rows("HuggingFaceH4/ultrachat_200k") is None


def test_status_report_redraws_the_plots_of_a_killed_run(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    result = CliRunner().invoke(app, ["status", str(run_dir), "--report"])
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "![rows per category and finish reasons](categories.png)" in report
    assert "![output length per category](lengths.png)" in report
    assert (run_dir / "categories.png").stat().st_size > 1000 and (run_dir / "lengths.png").exists()
    assert "| c | 3 | 2 | 2 |" in report


def test_the_terminal_bar_ends_at_its_total_for_a_part_and_with_rejects() -> None:
    """The CLI bar's total was the sum of the limits: a whole run's prompts without its rejects. A
    part 1/2 that settled its 17 prompts and 5 rejects stopped at 22/30; a whole run with 10
    conversion rejects ended at 40/30. It now shows what the Prefect card shows."""
    from flows.cli.console import LiveProgress

    for yielded in (22, 40):  # part 1/2; the whole run, rejects included
        session = _session(30, exhausted=True, yielded=yielded, rows=yielded - 5, rejects=5, before=0)
        session.snapshot = lambda: {
            "rows": 0,
            "rejects": 0,
            "completion_tokens": 0,
            "elapsed_s": 1.0,
            "endpoints": [],
        }
        display = LiveProgress()
        display.start()
        try:
            display.update(session)
        finally:
            display.stop()
        task = display.progress.tasks[0]
        assert task.completed == task.total == yielded


def test_a_category_card_lists_the_commonest_reject_reasons_and_sums_up_the_rest() -> None:
    """A server's refusal quotes the prompt's own numbers ("... you requested 5123 tokens"): a week of
    long prompts is thousands of distinct reasons, and the card had a row for each, the whole table
    sent to the API every 3 s. The counts still add up to the rejects."""
    session = _session(None, exhausted=False, yielded=3050, rows=0, rejects=0, before=0)
    session.elapsed_s = lambda: 10.0
    tally = session.categories.runs["c"].sink.tally
    for i in range(3000):
        tally.count_reject(f"the context is 4096 tokens; you requested {4097 + i}")
    for _ in range(50):
        tally.count_reject("503 server busy")
    disk = SimpleNamespace(
        rows=0,
        training_rows=0,
        rejects=3050,
        completion_tokens=0,
        reject_reasons=Counter(tally.reject_reasons),
    )
    table = category_table(session, "c", disk=disk)
    for prefix in ("reject: ", "on disk: "):
        reasons = [row for row in table if row["metric"].startswith(prefix)]
        assert len(reasons) == TABLE_REASONS + 1
        assert reasons[0] == {"metric": prefix + "503 server busy", "value": "50"}
        assert reasons[-1] == {
            "metric": prefix + "other reasons (each in the rejects table)",
            "value": str(3000 - (TABLE_REASONS - 1)),
        }
        assert sum(int(row["value"]) for row in reasons) == 3050


def test_a_terminal_bar_is_drawn_from_its_first_update_not_at_its_start() -> None:
    """The display starts before the session opens (to show a launched server's start): a start
    refused before any update (a locked run, a changed config) left a bar reading "starting" above
    its one error line."""
    from flows.cli.console import LiveProgress, console

    session = _session(30, exhausted=False, yielded=3, rows=3, rejects=0, before=0)
    session.snapshot = lambda: {
        "rows": 3,
        "rejects": 0,
        "completion_tokens": 9,
        "elapsed_s": 1.0,
        "endpoints": [],
    }
    with console.capture() as refused:
        display = LiveProgress()
        display.start()
        display.stop()
    assert refused.get() == ""
    with console.capture() as ran:
        display = LiveProgress()
        display.start()
        display.update(session)
        display.stop()
    assert "prompts" in ran.get() and "3 rows" in ran.get()


def test_the_summary_names_the_report_by_an_absolute_path_as_it_names_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's summary said `Data: /abs/output/demo/data   Report: output/demo/report.md`."""
    from flows.cli.console import console, print_summary
    from flows.report.status import run_status
    from flows.store.run_store import RunStore

    monkeypatch.chdir(tmp_path)
    RunStore(Path("output/demo")).open_run("fp", {})
    summary = empty_summary("output/demo")
    with console.capture() as shown:
        print_summary(summary, run_status(Path("output/demo")))
    assert f"Report: {tmp_path / 'output' / 'demo' / 'report.md'}" in shown.get().replace("\n", "")


def _two_servers_session() -> Any:
    """A run with two endpoints whose URLs are as long as a cluster's host names."""
    session = _session(3000, exhausted=False, yielded=1234, rows=1200, rejects=34, before=0)
    node = "http://gpu-node-{}.cluster.internal:30000"
    endpoints = [
        {
            "endpoint": node.format("017"),
            "limit": 96,
            "in_flight": 93,
            "kv_usage": 0.87,
            "queued": 12,
            "busy": 0.99,
        },
        {
            "endpoint": node.format("018"),
            "limit": 64,
            "in_flight": 60,
            "kv_usage": 0.55,
            "queued": 0,
            "busy": 0.71,
        },
    ]
    session.snapshot = lambda: {
        "rows": 1200,
        "rejects": 34,
        "completion_tokens": 987_654,
        "elapsed_s": 321.0,
        "endpoints": endpoints,
    }
    return session


def _terminal(width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The live display's last frame on a terminal ``width`` columns wide, line by line."""
    from rich.console import Console

    from flows.cli import console as cli_console

    monkeypatch.setattr(cli_console, "console", Console(width=width, emoji=False))
    with cli_console.console.capture() as frame:
        display = cli_console.LiveProgress()
        display.update(_two_servers_session())
        display.stop()
    return frame.get().splitlines()


def test_the_terminal_display_fits_80_columns_with_every_label_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal the one-line display was cut: "pr… 1200 rows · 34 rejects · 3,077 tok/s ·
    http://gpu-node-017.cluster.interna…": no bar, no count, no elapsed time, one endpoint half named
    and the other not at all."""
    lines = _terminal(80, monkeypatch)
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines) and "…" not in text
    bar = lines[0].split()
    assert (bar[0], bar[-2]) == ("prompts", "1234/3000") and re.fullmatch(r"\d+:\d\d:\d\d", bar[-1])
    assert "1200 rows · 34 rejects · 3,077 tok/s" in text
    for node, numbers in (("017", ["93/96", "87%", "12", "99%"]), ("018", ["60/64", "55%", "0", "71%"])):
        row = next(line for line in lines if f"gpu-node-{node}" in line).split()
        assert row == [f"http://gpu-node-{node}.cluster.internal:30000", *numbers]


def test_a_narrow_terminal_drops_the_least_important_columns_and_wraps_the_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = _terminal(44, monkeypatch)
    text = "\n".join(lines)
    assert all(len(line) <= 44 for line in lines) and "…" not in text
    assert "busy" not in text and "99%" not in text  # the server's busy share goes first
    assert "in flight" in text and "93/96" in text  # the controller's numbers stay
    labels = "".join(line.split()[0] for line in lines)  # a wrapped label goes on in its column
    assert "http://gpu-node-017.cluster.internal:30000" in labels
