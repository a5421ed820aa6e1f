"""`datagen export`: a run's rows as SpecForge JSONL or a saved HF dataset (mount with
``app.command()(export)``). The command parses options and prints; the work is in ``flows.report.export``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.console import console, fail
from flows.report.export import (
    ExportError,
    ExportFormat,
    ExportResult,
    Reasoning,
    Selection,
    export_hf,
    export_specforge,
    push_export,
)
from flows.report.trainer_templates import SystemPromptCheck, template_warning, unchecked_hint
from flows.store.location import LocationError


def _split_categories(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    return names or None


def _usage(result: ExportResult) -> list[str]:
    path = result.path
    if result.format is ExportFormat.HF:
        return [f'Load it: datasets.load_from_disk("{path}")']
    lines = [
        f"Train on it with SpecForge: data.train_data_path: {path} in the run config "
        f"(older scripts/train_eagle3.py: --train-data-path {path})"
    ]
    reasoned = result.tally.with_reasoning
    if result.reasoning is Reasoning.FIELD and reasoned and result.trainer_template is None:
        # not for rows without reasoning (a non-thinking model's), nor once the template is chosen
        lines.append(
            f"{reasoned} of {result.tally.rows} rows carry reasoning in `reasoning_content`: use a thinking "
            "chat template (parser_type thinking, e.g. qwen3-thinking, kimi-k2-thinking), or export with "
            "--reasoning inline for a general one."
        )
    return lines


def summary_lines(result: ExportResult) -> list[str]:
    """What a person needs after an export: how many rows, what was left out and why, where, how to use."""
    tally = result.tally
    per_category = ", ".join(f"{name} {tally.rows_by_category[name]}" for name in result.categories)
    lines = [f"Exported {tally.rows} rows ({per_category or 'no categories'}) as {result.format}"]
    if tally.left_out_rows:
        flags = ", ".join(f"{flag} {n}" for flag, n in sorted(tally.left_out_by_flag.items()))
        lines.append(f"Left out {tally.left_out_rows} flagged rows ({flags}); --include-flagged keeps them")
    if tally.duplicates:
        lines.append(f"Skipped {tally.duplicates} repeated ids (rows written twice by racing processes)")
    if tally.rows_by_part:
        parts = sorted(tally.rows_by_part.items(), key=lambda item: int(item[0].split("/")[0]))
        lines.append("Rows per part: " + ", ".join(f"{part} {n}" for part, n in parts))
    lines.append(f"Path: {result.path}")
    return lines + _system_prompt_lines(result) + _usage(result)


def _system_prompt_lines(result: ExportResult) -> list[str]:
    """Whether the trainer's template would add a system prompt the target never saw (specforge only)."""
    if result.format is not ExportFormat.SPECFORGE:
        return []
    check = SystemPromptCheck(dict(result.tally.without_system), result.tally.rows)
    if result.trainer_template is None:
        line = unchecked_hint(check)
    else:
        line = template_warning(result.trainer_template, check)
    return [line] if line else []


def _print(line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


Format = Annotated[
    ExportFormat,
    typer.Option("--format", help="specforge: JSONL for SpecForge; hf: datasets save_to_disk."),
]
Out = Annotated[
    Path | None,
    typer.Option(
        help="Where to write (default RUN_DIR/exports/specforge.jsonl or RUN_DIR/exports/hf; "
        "needed for a run at a URL)."
    ),
]
IncludeFlagged = Annotated[
    bool,
    typer.Option("--include-flagged", help="Keep flagged rows (truncated, empty, bad tool calls...)."),
]
Categories = Annotated[
    str | None, typer.Option(help="Only these categories, comma-separated (default: all).")
]
ReasoningOption = Annotated[
    Reasoning | None,
    typer.Option(
        help="specforge only: reasoning as `reasoning_content` (field, the default: what SpecForge's "
        "thinking templates read), as <think>...</think> in the content (inline), or dropped (drop)."
    ),
]
TrainerTemplate = Annotated[
    str | None,
    typer.Option(
        help="specforge only: the SpecForge --chat-template you will train with (e.g. qwen3-thinking); "
        "warns when it would add a system prompt to rows generated without one."
    ),
]
PushToHub = Annotated[
    str | None,
    typer.Option(help="hf only: also push to this Hub dataset repo (token: HF_TOKEN or `hf auth login`)."),
]
Private = Annotated[bool, typer.Option("--private", help="Create the Hub repo private.")]


def export(
    run_dir: Annotated[str, typer.Argument(help="A run directory (e.g. output/demo) or its URL.")],
    fmt: Format,
    out: Out = None,
    include_flagged: IncludeFlagged = False,
    categories: Categories = None,
    reasoning: ReasoningOption = None,
    trainer_template: TrainerTemplate = None,
    push_to_hub: PushToHub = None,
    private: Private = False,
) -> None:
    """Export RUN_DIR's training rows (flagged rows left out) for a drafter trainer."""
    if fmt is ExportFormat.SPECFORGE and push_to_hub:
        fail("--push-to-hub pushes the HF dataset: use it with --format hf")
    if fmt is ExportFormat.HF and (reasoning is not None or trainer_template is not None):
        fail("--reasoning and --trainer-template apply to --format specforge; hf keeps every column")
    selection = Selection(categories=_split_categories(categories), include_flagged=include_flagged)
    try:
        if fmt is ExportFormat.SPECFORGE:
            result = export_specforge(run_dir, out, selection, reasoning or Reasoning.FIELD, trainer_template)
        else:
            result = export_hf(run_dir, out, selection)
    except (ExportError, LocationError) as error:
        fail(str(error))
    for line in summary_lines(result):
        _print(line)
    if push_to_hub:
        try:
            push_export(result.path, push_to_hub, private)
        except Exception as error:  # the Hub client raises many kinds; the local export stands either way
            fail(
                f"push to {push_to_hub} failed ({type(error).__name__}: {error}); the export above is intact",
                3,
            )
        _print(f"Pushed to https://huggingface.co/datasets/{push_to_hub}")
