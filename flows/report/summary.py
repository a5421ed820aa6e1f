"""The end-of-run report: what happened to every source row, what it cost, where the data is.

Written to the run directory (``summary.json`` for scripts, ``report.md`` for people) at the end of
every run or resume, so a run that finished overnight explains itself in the morning. A part of a
run writes ``summary-part-2-of-4.json`` and ``report-part-2-of-4.md``: parts whose run directory is
one shared folder (a network file system) each keep their own start's numbers, where one name made
the last part to end overwrite the others'.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.report.run_plots import CONTROLLER_PLOT, Plots, plots_markdown, write_plots
from flows.report.status import CategoryStatus, RunStatus
from flows.run.prompt_stream import StreamCounts
from flows.store.location import local_path
from flows.store.parts import Part
from flows.store.run_store import write_json_atomically, write_text_atomically

if TYPE_CHECKING:
    from flows.run.session import RunSession

SUMMARY = "summary.json"
REPORT = "report.md"
PART_SUMMARIES = "summary-part-*.json"
STEP_NAMES = [name for name, _ in StreamCounts().steps()]


def run_summary(session: RunSession, status: RunStatus) -> dict[str, Any]:
    """This run's numbers (stream steps, requests, tokens, speed) beside the totals on disk."""
    elapsed = session.elapsed_s()
    categories = []
    on_disk = {c.name: c for c in status.categories}
    for name, run in session.categories.runs.items():
        counts, tally, disk = run.counts, run.sink.tally, on_disk.get(name)
        categories.append(
            {
                "name": name,
                "steps": dict(counts.steps()),
                "filtered": dict(counts.filtered),
                "conversion_rejects": dict(counts.rejected),
                "duplicates": counts.duplicates,
                "duplicates_of_other_categories": dict(counts.duplicates_across),
                "already_done": counts.already_done,
                "other_parts": counts.other_parts,
                "this_run": {
                    "rows": tally.rows,
                    "rejects": tally.rejects,
                    "truncated": tally.truncated,
                    "prompt_tokens": tally.prompt_tokens,
                    "completion_tokens": tally.completion_tokens,
                    "reasoning_tokens": tally.reasoning_tokens,
                    "retried_attempts": tally.retried_attempts,
                    "recovered_after_outage": tally.recovered,
                    "reject_reasons": dict(tally.reject_reasons),
                },
                "total": None if disk is None else disk_totals(disk),
            }
        )
    snap = session.snapshot()
    return {
        "run": session.config.run.name,
        "run_dir": session.store.url(),
        "local_dir": str(session.config.run_dir),
        "part": None if session.store.part is None else str(session.store.part),
        "fingerprint": session.fingerprint,
        "model": session.model,
        "finished_at": datetime.now(UTC).isoformat(),
        "resumed": session.resumed,
        "seconds": round(elapsed, 3),
        "rows": snap["rows"],
        "rejects": snap["rejects"],
        "completion_tokens": snap["completion_tokens"],
        "output_tokens_per_s": round(snap["completion_tokens"] / max(elapsed, 1e-9), 1),
        "rows_per_s": round(snap["rows"] / max(elapsed, 1e-9), 2),
        "server_restarts": sum(e.guard.restarts for e in session.pool.endpoints),
        "concurrency": session.concurrency_summary(),
        "categories": categories,
    }


def report_markdown(summary: dict[str, Any], *, controller_plot: bool = True) -> str:
    """The report's text; ``controller_plot``: link ``controller.png`` (drawn for this report)."""
    part = summary.get("part")  # absent from the summaries of runs made before parts
    lines = [
        f"# Run `{summary['run']}`" + (f", part {part}" if part else ""),
        "",
        f"Model `{summary['model']}`, config fingerprint `{summary['fingerprint']}`, "
        f"finished {summary['finished_at']}" + (" (resumed)." if summary["resumed"] else "."),
        "",
        f"This run: {summary['rows']} rows, {summary['rejects']} rejects, "
        f"{summary['completion_tokens']:,} output tokens in {summary['seconds']:.0f} s "
        f"({summary['output_tokens_per_s']:,.0f} tok/s, "
        f"{summary['rows_per_s']} rows/s); server restarts: {summary['server_restarts']}.",
        "",
        "## Source rows, step by step",
        "",
        "| category | " + " | ".join(STEP_NAMES) + " |",
        "|---|" + "---:|" * len(STEP_NAMES),
    ]
    for category in summary["categories"]:
        lines.append(
            f"| {category['name']} | " + " | ".join(str(v) for v in category["steps"].values()) + " |"
        )
    totals = [(c["name"], c["total"]) for c in summary["categories"] if c.get("total")]
    if totals:
        lines += ["", "## On disk (every start so far)", "", *totals_table(totals)]
    lines += ["", *concurrency_markdown(summary.get("concurrency"), plot=controller_plot)]
    lines += ["", "## Why rows were left out", ""]
    for category in summary["categories"]:
        reasons = {
            **{f"filter: {k}": v for k, v in category["filtered"].items()},
            **{f"convert: {k}": v for k, v in category["conversion_rejects"].items()},
            **{
                f"request: {k}": v
                for k, v in category["this_run"]["reject_reasons"].items()
                if k not in category["conversion_rejects"]
            },
        }
        if category["duplicates"]:
            reasons["duplicate prompt"] = category["duplicates"]
        total = category.get("total")
        if total and total["rows"] > total["training_rows"]:  # kept, but not for training
            reasons["on disk: rows with flags (truncated, empty, a bad tool call), not training rows"] = (
                total["rows"] - total["training_rows"]
            )
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            lines.append(f"- {category['name']}: {reason} — {count}")
    lines += [
        "",
        "## Load it",
        "",
        "```python",
        "import datasets",
        f'ds = datasets.load_dataset("parquet", data_dir="{summary["run_dir"]}/data", split="train")',
        'train = ds.filter(lambda row: not row["flags"])',
        "```",
    ]
    return "\n".join(lines) + "\n"


def disk_totals(category: CategoryStatus) -> dict[str, int]:
    """What a category's files hold, as the summary keeps it."""
    return {
        "rows": category.rows,
        "training_rows": category.training_rows,
        "rejects": category.rejects,
        "completion_tokens": category.completion_tokens,
    }


def totals_table(totals: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Per category, what its files hold: rows, training rows (no flags), rejects, output tokens."""
    return [
        "| category | rows | training rows | rejects | output tokens |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {t['rows']} | {t['training_rows']} | {t['rejects']} | {t['completion_tokens']} |"
            for name, t in totals
        ),
    ]


def concurrency_markdown(concurrency: dict[str, Any] | None, *, plot: bool = True) -> list[str]:
    """What set the number of requests in flight, and what the adaptive controller did."""
    if not concurrency:
        return []
    if concurrency["mode"] == "fixed":
        held = [e for e in concurrency["endpoints"] if e.get("oom_holds")]  # no holds in older summaries
        return ["## Concurrency", "", f"Fixed: {concurrency['limit']} in flight per endpoint."] + [
            f"- {e['endpoint']}: held to {e['held_to']} in flight {e['oom_holds']} time(s) by the OOM guard "
            "(GPU free memory under `min_free_vram_gib`)"
            for e in held
        ]
    lines = [
        "## Concurrency (adaptive)",
        "",
        "| endpoint | final limit | range | decisions | changes | back-offs | retractions | max queued "
        "| server busy | signal reads | ms/read |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in concurrency["endpoints"]:
        busy = e.get("server_busy")  # None where the server counts no busy time (and in older summaries)
        lines.append(
            f"| {e['endpoint']} | {e['final_limit']} | {e['min_limit']}-{e['max_limit']} | {e['decisions']} "
            f"| {e['changes']} | {e['back_offs']} | {e['retractions']} | {e['max_queued']} "
            f"| {'-' if busy is None else f'{busy:.0%}'} | {e['signal_reads']} | {e['signal_read_ms']} |"
        )
    failed = [e for e in concurrency["endpoints"] if e.get("failed_ticks")]  # absent in older summaries
    if failed:
        lines.append("")
    lines += [
        f"- {e['endpoint']}: the controller failed in {e['failed_ticks']} ticks and held its limit "
        "without pacing meanwhile; the log has the first failure's traceback."
        for e in failed
    ]
    if plot:
        lines += ["", f"![controller timeline]({CONTROLLER_PLOT})"]
    return lines


def _suffix(part: str | None) -> str:
    """What a part's report files carry after their stem (``-part-2-of-4``); nothing for a whole run."""
    return "" if part is None else f"-{Part.parse(part).label}"


def summary_name(part: str | None) -> str:
    """``summary.json``, or this part's (``part`` as a summary holds it: ``"2/4"``)."""
    return f"summary{_suffix(part)}.json"


def report_name(part: str | None) -> str:
    """``report.md``, or this part's."""
    return f"report{_suffix(part)}.md"


def write_report(session: RunSession, status: RunStatus) -> dict[str, Any]:
    summary = run_summary(session, status)
    run_dir = session.config.run_dir
    write_json_atomically(summary, run_dir / summary_name(summary["part"]))
    write_report_files(run_dir, summary, session.drawn_plots)
    (run_dir / "reports").mkdir(exist_ok=True)
    stamp = summary["finished_at"].replace(":", "").replace("-", "")[:15]
    write_json_atomically(summary, run_dir / "reports" / f"summary-{stamp}{_suffix(summary['part'])}.json")
    return summary


def _data(run_dir: Path, summary: dict[str, Any]) -> str | Path:
    """Where the run's shards are: its local folder, or the URL its summary names (``output_dir`` a URL).

    A local run's own folder wins over the path in its summary, which may be relative to where the
    run was started.
    """
    return run_dir if local_path(summary["run_dir"]) is not None else summary["run_dir"]


def write_report_files(run_dir: Path, summary: dict[str, Any], plots: Plots | None = None) -> str:
    """Write ``report.md`` (the controller plot is in its concurrency section) with ``plots``, the
    ones this start's Prefect report already drew, or else drawing them now."""
    plots = write_plots(run_dir, _data(run_dir, summary)) if plots is None else plots
    rest = [(title, name) for title, name in plots if name != CONTROLLER_PLOT]
    text = report_markdown(summary, controller_plot=len(rest) < len(plots))
    text += "\n".join(["", *plots_markdown(run_dir, rest)])
    write_text_atomically(text, run_dir / report_name(summary.get("part")))
    return text


def report_with_plots(run_dir: Path, summary: dict[str, Any]) -> tuple[str, Plots]:
    """The report with every plot inline (for a UI that cannot open files beside ``report.md``),
    and the plots drawn for it (``report.md`` reuses them: drawing takes about a second)."""
    plots = write_plots(run_dir, _data(run_dir, summary))
    body = [line for line in report_markdown(summary).splitlines() if not line.startswith("![")]
    return "\n".join([*body, "", *plots_markdown(run_dir, plots, embed=True)]), plots


def report_from_disk(run_dir: Path) -> list[Path]:
    """``datagen status --report``: redraw the plots and rewrite the reports from the run's files.

    The numbers of the last start come from its ``summary.json`` (one report per part's summary, for
    the parts that wrote theirs here); a run killed before writing one gets the totals on disk and
    the plots.
    """
    paths = [path for path in [run_dir / SUMMARY] if path.exists()] + sorted(run_dir.glob(PART_SUMMARIES))
    summaries = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    if summaries:
        plots = write_plots(run_dir, _data(run_dir, summaries[0]))  # every part's data: drawn once
        for summary in summaries:
            write_report_files(run_dir, summary, plots)
        return [run_dir / report_name(summary.get("part")) for summary in summaries]
    from flows.report.status import run_status

    status = run_status(run_dir)
    lines = [
        f"# Run `{run_dir.name}`",
        "",
        "No summary.json (the last start was killed before its end): totals read from the files.",
        "",
        *totals_table([(c.name, disk_totals(c)) for c in status.categories]),
    ]
    lines += ["", *plots_markdown(run_dir, write_plots(run_dir, run_dir))]
    write_text_atomically("\n".join(lines) + "\n", run_dir / REPORT)
    return [run_dir / REPORT]
