"""`datagen prompts`: look at a category's prompts before spending GPU time on them.

Exit codes: 0 the preview was shown; 2 an unknown category, an invalid category or run config, or a
source that cannot be read.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from flows.cli.console import console, fail
from flows.config import ConfigError
from flows.report.preview import (
    HUB_TIMEOUT_S,
    Example,
    LengthStats,
    Preview,
    build_preview,
    capped_rows,
    find_category,
    load_measure,
)

app = typer.Typer(
    name="prompts",
    help="Look at a category's prompts (converted, filtered, sampled, deduplicated) before a run.",
    no_args_is_help=True,
)

DEFAULT_ROWS = 10_000


@app.command()
def preview(
    category: Annotated[
        str, typer.Argument(help="Category name: a bundled category file, or one of --config's.")
    ],
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Run config (TOML) whose category to preview.", dir_okay=False),
    ] = None,
    examples: Annotated[int, typer.Option("--examples", "-n", min=0, help="Converted examples to show.")] = 5,
    rows: Annotated[
        int, typer.Option("--rows", min=1, help="Read at most this many source rows (keeps a preview quick).")
    ] = DEFAULT_ROWS,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="tokenizer.json path, a folder holding one, or a Hub model id (from the local Hugging Face "
            f"cache, else the Hub with a {HUB_TIMEOUT_S:g} s timeout, not with HF_HUB_OFFLINE): prompt "
            "lengths in tokens instead of characters.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the preview as one JSON document.")] = False,
) -> None:
    """Converted examples, rows left after each filter, rejects by reason and prompt-length statistics."""
    try:
        chosen = find_category(category, config)
    except ConfigError as error:
        fail(str(error))
    try:
        report = build_preview(
            chosen,
            capped_rows(chosen, rows),
            rows_cap=rows,
            examples=examples,
            measure=load_measure(tokenizer),
        )
    except (OSError, ValueError) as error:
        where = "" if chosen.source in str(error) else f" {chosen.source}"
        fail(f"cannot read the source of {chosen.name}:{where} {error}")
    if json_out:
        typer.echo(json.dumps(asdict(report), ensure_ascii=False, indent=2))
    else:
        render(report)


def _table(*columns: str) -> Table:
    """Label column on the left, numbers on the right."""
    table = Table()
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    return table


def _show(title: str, table: Table) -> None:
    """A heading line above the table: a table title would wrap to the table's (narrow) width."""
    console.print(Text(title, style="bold"))
    console.print(table)


def _value(value: Any) -> str:
    if value is None or value == {}:
        return "-"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else str(value)


def _settings_table(report: Preview) -> Table:
    table = Table("setting", "value")
    for key, value in report.settings.items():
        table.add_row(key, Text(_value(value)))
    return table


def _steps_table(report: Preview) -> Table:
    return _pairs_table("step", report.steps)


def _pairs_table(name: str, rows: list[tuple[str, int]]) -> Table:
    table = _table(name, "rows")
    for step, count in rows:
        table.add_row(step, str(count))
    return table


def _reasons_table(reasons: dict[str, int]) -> Table:
    table = _table("reason", "rows")
    for reason, count in reasons.items():
        table.add_row(Text(reason), str(count))
    if not reasons:
        table.add_row(Text("(none)", style="dim"), "0")
    return table


def _example_table(item: Example) -> Table:
    table = Table("role", "content (first characters)")
    for message in item.messages:
        table.add_row(message.role, Text(message.text))
    if item.tools:
        table.add_row("tools", Text(", ".join(item.tools)))
    return table


def _lengths_table(stats: LengthStats) -> Table:
    table = Table()
    values = {"count": stats.count, "min": stats.min, "median": stats.median}
    values.update({"p90": stats.p90, "p99": stats.p99, "max": stats.max})
    for column in values:
        table.add_column(column, justify="right")
    table.add_row(*(str(v) for v in values.values()))
    return table


def render(report: Preview) -> None:
    """The preview as tables on the project console (stderr, like every other human-facing output)."""
    _show(f"category {report.category}", _settings_table(report))
    _show(f"rows left after each step (at most {report.rows_cap} rows read)", _steps_table(report))
    if report.filter_steps:
        rows = [("read", report.steps[0][1]), *((f"after {step}", n) for step, n in report.filter_steps)]
        _show("rows left after each filter", _pairs_table("filter", rows))
    _show("filtered by reason", _reasons_table(report.filtered))
    _show("rejected by reason (stage convert)", _reasons_table(report.rejected))
    for number, item in enumerate(report.examples, start=1):
        _show(f"example {number}: {item.id} (row {item.row})", _example_table(item))
    if report.lengths is None:
        console.print("no prompt taken: no length statistics")
    else:
        _show(f"prompt length of the first request, in {report.lengths.unit}", _lengths_table(report.lengths))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
