"""What a person sees in the terminal: a live progress bar and the end-of-run summary."""

from __future__ import annotations

import contextlib
import logging
import time
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

from flows.cli.live_view import BarWithRows, LiveLine, LiveRows
from flows.report.live import run_progress
from flows.report.status import RunStatus
from flows.report.summary import report_name
from flows.run.reasons import commonest_reasons
from flows.run.session import RunSession
from flows.runner import configure
from flows.say import said
from sglang_launch.engine import Starting

SHOWN_REASONS = 20
"""Reject reasons a category shows in ``datagen status``; the rest are summed in one row."""

# long lines stay whole in logs and pipes; no emoji codes: a prompt id, URL or reason is shown as it is
# (``gsm8k:100:7`` was printed ``gsm8k💯7``, an id found in no table)
console = Console(stderr=True, soft_wrap=True, emoji=False)
answer = Console(soft_wrap=True, emoji=False)
"""What a command is asked for (``datagen status``'s tables): on stdout, so ``| less`` shows it."""


def fail(message: str, code: int = 2) -> NoReturn:
    """One readable error line and a non-zero exit: what every command does with a known problem."""
    console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


PROGRESS_EVERY_S = 60.0
"""How often a run whose output is not a terminal writes its progress line (``--progress-every``)."""
FIRST_LINE_S = 10.0
"""Its first line comes this soon (or at ``every_s``, if sooner): a log says at once that the run lives."""


def live_line(session: RunSession) -> LiveLine:
    """The prompts this start settles, of the total the Prefect card shows (``run_progress``: a part's
    own share, conversion rejects included, exact once the source is read); rows, rejects, tok/s and
    each endpoint's load. The sum of the categories' limits, as before, was a whole run's prompts
    without its rejects: a part's bar stopped at 23/30, a run with rejects ended at 40/30."""
    snap = session.snapshot()
    progress = run_progress(session, rows_per_s=0.0)
    rate = snap["completion_tokens"] / max(snap["elapsed_s"], 1e-9)
    numbers = f"{snap['rows']} rows · {snap['rejects']} rejects · {rate:,.0f} tok/s"
    if progress.already_done:
        numbers += f" · {progress.already_done} done before"
    engine = session.pool.engine
    starting = None if engine is None or engine.starting is None else starting_line(engine.starting)
    return LiveLine(progress.done, progress.total, numbers, starting, tuple(snap["endpoints"]))


def starting_line(starting: Starting) -> str:
    """The server the run launches (``[server] launch = true``), while it starts or restarts."""
    waited = timedelta(seconds=int(time.monotonic() - starting.since))
    log = "" if starting.log_path is None else f", log {starting.log_path}"
    return f"launching the server: waiting {waited}{log}"


class LiveProgress:
    """The run's live display on a terminal (a rich progress bar fed by the session's reporter hook, no
    per-request work; the numbers and endpoints as rows under it, ``LiveRows``) and its closing
    summary: the terminal ``RunDisplay``."""

    def __init__(self) -> None:
        self.progress = BarWithRows(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=None, table_column=Column(max_width=40)),  # narrows before the text
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("prompts", total=None)
        self.drawn = False
        """The bar is drawn from its first update: a start refused before any (a locked run, a changed
        config) leaves its one error line, not a bar reading "starting" above it."""

    def start(self) -> None:
        """Nothing yet: the bar starts at the first update."""

    def stop(self) -> None:
        if self.drawn:
            self.progress.stop()

    def update(self, session: RunSession) -> None:
        line = live_line(session)
        self.progress.rows = LiveRows(line)
        self.progress.update(self.task, completed=line.done, total=line.total)
        if not self.drawn:
            self.drawn = True
            self.progress.start()

    def summary(self, summary: dict[str, Any], status: RunStatus) -> None:
        print_summary(summary, status)

    def waiting(self, what: str) -> AbstractContextManager[object]:
        """A spinner beside ``what`` while it lasts, gone after (the bar comes next, or the error)."""
        return console.status(Text(what))


class ProgressLines:
    """The live line as a plain, timestamped line every ``every_s`` and one at the end: the
    ``RunDisplay`` of output that is not a terminal (``nohup datagen run cfg > run.log 2>&1``).

    Rich draws its bar only on a terminal: into a file it wrote nothing until the run ended, so
    ``tail -f run.log`` of a week-long run showed nothing for a week. Printed through the console,
    which flushes each line and writes no escape codes where there is no terminal."""

    def __init__(self, every_s: float = PROGRESS_EVERY_S) -> None:
        self.every_s = every_s
        self.started = self.due = 0.0
        """When ``start`` was called, and when the next line is due (``time.monotonic``)."""
        self.last: LiveLine | None = None
        self.said: LiveLine | None = None

    def start(self) -> None:
        self.started = time.monotonic()
        self.due = self.started + min(self.every_s, FIRST_LINE_S)

    def update(self, session: RunSession) -> None:
        self.last = live_line(session)
        now = time.monotonic()
        if now >= self.due:
            self._say(now)
            self.due = now + self.every_s

    def stop(self) -> None:
        """The last state, whenever the run stops (done, failed, interrupted), unless just said. Not
        after no line at all: a run refused at its start (a server that cannot be launched) is the
        one line of its error, and a run shorter than the first line has its summary."""
        if self.said is not None and self.said != self.last:
            self._say(time.monotonic())

    def summary(self, summary: dict[str, Any], status: RunStatus) -> None:
        print_summary(summary, status)

    def waiting(self, what: str) -> AbstractContextManager[object]:
        """``what``, one line when it begins: no spinner where there is no terminal."""
        console.print(Text(what))
        return contextlib.nullcontext()

    def _say(self, now: float) -> None:
        line = self.said = self.last or LiveLine(0, None, "starting")
        total = "?" if line.total is None else line.total
        elapsed = timedelta(seconds=int(now - self.started))
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        console.print(Text(f"{stamp} prompts {line.done}/{total} · {line.detail} · {elapsed}"))


def run_display(progress_every_s: float = PROGRESS_EVERY_S) -> LiveProgress | ProgressLines:
    """The live bar on a terminal; elsewhere (a file, a pipe) a progress line every ``progress_every_s``."""
    return LiveProgress() if console.is_interactive else ProgressLines(progress_every_s)


def status_table(status: RunStatus) -> Table:
    table = Table(title=escape(f"{status.run_dir}  (config {status.fingerprint})"))
    for column in ("category", "rows", "training", "truncated", "rejects", "limit", "output tokens"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for c in status.categories:
        table.add_row(
            c.name,
            str(c.rows),
            str(c.training_rows),
            str(c.truncated),
            f"{c.rejects}" + (f" ({c.retryable_rejects} retry)" if c.retryable_rejects else ""),
            "-" if c.limit is None else str(c.limit),
            f"{c.completion_tokens:,}",
        )
    return table


def print_status(status: RunStatus, out: Console = console) -> None:
    """The run's numbers on disk; ``out``: stderr beside a run's progress, ``answer`` for `status`."""
    out.print(status_table(status))
    by_part = status.by_part()
    if by_part:
        table = Table(title=f"parts (the run is split in {status.parts})")
        for column in ("part", "rows", "rejects"):
            table.add_column(column, justify="left" if column == "part" else "right")
        for part, numbers in by_part.items():
            table.add_row(part, str(numbers["rows"]), str(numbers["rejects"]))
        out.print(table)
    if status.repeated_rows:
        out.print(
            f"[bold red]{status.repeated_rows} rows repeat an id already written[/] (two processes wrote "
            "one part, or parts of different splits): `datagen export` keeps one row per id"
        )
    reasons = [
        (c.name, reason, n)
        for c in status.categories
        for reason, n in commonest_reasons(c.reject_reasons, SHOWN_REASONS)
    ]
    if reasons:
        table = Table(title="rejects by reason")
        for column in ("category", "reason", "count"):
            table.add_column(column)
        for name, reason, n in reasons:
            table.add_row(name, Text(reason), str(n))  # a reason quotes prompts and servers: not markup
        out.print(table)


def print_summary(summary: dict[str, Any], status: RunStatus) -> None:
    """End of run: what happened to the source rows, what was made, how fast, where it is, how to load it."""
    print_status(status)
    categories = summary["categories"]
    if categories:
        table = Table(title="source rows, step by step (this run)")
        table.add_column("category")
        for step in categories[0]["steps"]:
            table.add_column(step, justify="right")
        for category in categories:
            table.add_row(category["name"], *(str(v) for v in category["steps"].values()))
        console.print(table)
    for category in categories:
        across = category["duplicates_of_other_categories"]
        if across:
            owners = ", ".join(f"{n} in {owner}" for owner, n in across.items())
            console.print(
                f"{category['name']}: duplicates of prompts already in other categories: {owners}",
                markup=False,
            )
    console.print(
        f"[bold]This run:[/] {summary['rows']} rows, {summary['rejects']} rejects, "
        f"{summary['completion_tokens']:,} output tokens in {summary['seconds']:.1f} s "
        f"({summary['output_tokens_per_s']:,.0f} tok/s, {summary['rows_per_s']} rows/s)"
        + (f", server restarts: {summary['server_restarts']}" if summary["server_restarts"] else "")
    )
    if summary["resumed"]:
        already = sum(c["already_done"] for c in categories)
        console.print(f"Resumed: {already} prompts were already done and were not asked again.")
    if summary["part"]:
        others = sum(c["other_parts"] for c in categories)
        console.print(f"Part {summary['part']}: {others} prompts were left to the other parts.")
    data_dir = f"{status.run_dir}/data"
    report = Path(summary["local_dir"]).resolve() / report_name(summary["part"])  # absolute, as Data is
    console.print(f"[bold]Data:[/] {escape(data_dir)}   [bold]Report:[/] {escape(str(report))}")
    console.print(
        f'Load it: datasets.load_dataset("parquet", data_dir="{escape(data_dir)}") '
        "(rows with flags, e.g. truncated, are not training rows: filter on `flags == []`, "
        "or `datagen export` the training split)"
    )


def warn(message: str) -> None:
    """One readable warning line: the run goes on."""
    console.print(f"[bold yellow]warning:[/] {escape(message)}")


class TerminalLog(logging.Handler):
    """The CLI's log handler. A record said to the person running the run (``flows.say``: a server
    restarted, no OOM guard, no metrics) is one ``warning:`` line, as the CLI's other warnings, and
    nothing else; any other record is its structured log line, a diagnostic.

    Both go through the console, so they are printed above the live progress bar: a line written to
    stderr behind rich's back was buried by the bar's redraws. Text, not markup: a message quotes
    servers and URLs."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if said(record):
                warn(record.getMessage())
            else:
                console.print(Text(self.format(record)))
        except Exception:
            self.handleError(record)


PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def not_a_run_outcome(record: logging.LogRecord) -> bool:
    """False for Prefect's own account of how a flow or task run ended badly: its ERROR records
    ("Crash detected!" for each run a Ctrl-C cancels, a failure's traceback once per flow run it
    passes through). The CLI's one ``error:`` line says what happened; those records still go to
    the flow run's logs in the API, where the UI shows them."""
    run_logger = any(record.name == n or record.name.startswith(n + ".") for n in PREFECT_RUN_LOGGERS)
    return not (run_logger and record.levelno >= logging.ERROR)


def setup_logging(verbose: bool) -> None:
    """The logging of a command that runs something (``configure``), shown through ``TerminalLog``:
    first thing, before Prefect is imported. Prefect's run outcomes are left out unless ``verbose``."""
    terminal = TerminalLog()
    if not verbose:
        terminal.addFilter(not_a_run_outcome)
    configure(verbose, terminal)
