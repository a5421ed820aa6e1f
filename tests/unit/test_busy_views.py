"""The server's busy share where a person reads it: the live line and the report's concurrency table."""

from __future__ import annotations

from flows.cli.live_view import endpoint_line
from flows.report.summary import concurrency_markdown

ENDPOINT_ROW = {
    "endpoint": "http://a",
    "final_limit": 96,
    "min_limit": 8,
    "max_limit": 180,
    "decisions": 40,
    "changes": 12,
    "back_offs": 1,
    "retractions": 2,
    "max_queued": 9,
    "signal_reads": 40,
    "signal_read_ms": 3.1,
}
"""One endpoint's line of a run summary's concurrency section, as a summary from before
``server_busy`` and ``failed_ticks`` holds it."""


def _endpoint(busy: float | None) -> dict:
    return {"endpoint": "http://a", "limit": 96, "in_flight": 90, "kv_usage": 0.5, "queued": 0, "busy": busy}


def test_the_live_line_says_how_busy_the_server_is_where_it_counts() -> None:
    assert endpoint_line(_endpoint(0.934), several=False) == "90/96 in flight, KV 50%, queue 0, busy 93%"
    assert endpoint_line(_endpoint(None), several=True) == "http://a: 90/96 in flight, KV 50%, queue 0"


def test_the_report_table_has_the_busy_share_and_a_dash_where_there_is_none() -> None:
    row = ENDPOINT_ROW
    lines = concurrency_markdown(
        {"mode": "adaptive", "endpoints": [{**row, "server_busy": 0.956}, {**row, "server_busy": None}, row]}
    )
    table = [line for line in lines if line.startswith("| http://a")]
    assert [line.split(" | ")[8] for line in table] == ["96%", "-", "-"]  # the last: a summary from before
    assert "server busy" in lines[2]
    assert not any("failed" in line for line in lines)
    assert lines[-1] == "![controller timeline](controller.png)"
    unplotted = concurrency_markdown({"mode": "adaptive", "endpoints": [row]}, plot=False)
    assert not any("controller.png" in line for line in unplotted)  # not drawn: not linked


def test_the_report_says_where_the_controller_failed() -> None:
    row = {**ENDPOINT_ROW, "endpoint": "http://b", "failed_ticks": 7}
    lines = concurrency_markdown(
        {"mode": "adaptive", "endpoints": [row, {**row, "endpoint": "http://c", "failed_ticks": 0}]}
    )
    said = [line for line in lines if "failed" in line]
    assert said == [
        "- http://b: the controller failed in 7 ticks and held its limit without pacing meanwhile; "
        "the log has the first failure's traceback."
    ]
