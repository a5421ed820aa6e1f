"""Row filters by format: which source rows are worth regenerating at all.

A filter is applied before conversion and says why a row is left out, so `datagen prompts preview`
and the run summary can count the rows after each filter instead of showing a silent shrink.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from prompts.convert_opencodeinstruct import OpenCodeInstructFilter


class RowFilter(Protocol):
    def reject_reason(self, row: Mapping[str, Any]) -> str | None: ...

    def steps(self) -> list[str]:
        """The filter's checks in the order it runs them; each one's reasons start with its name."""
        ...


def rows_after_each_step(read: int, steps: list[str], filtered: Mapping[str, int]) -> list[tuple[str, int]]:
    """Rows left after each filter step: a row is counted at the first check it fails."""
    left, out = read, []
    for step in steps:
        left -= sum(count for reason, count in filtered.items() if reason.startswith(step))
        out.append((step, left))
    return out


FILTERS: dict[str, type[BaseModel]] = {"opencodeinstruct": OpenCodeInstructFilter}


def row_filter(fmt: str, options: Mapping[str, Any]) -> RowFilter | None:
    """The filter for ``fmt`` built from a category's ``filters`` table (None when there is nothing to do)."""
    if not options:
        return None
    model = FILTERS.get(fmt)
    if model is None:
        known = ", ".join(sorted(FILTERS)) or "none"
        raise ValueError(f"format {fmt!r} takes no filters (formats with filters: {known})")
    built: RowFilter = model.model_validate(dict(options))  # type: ignore[assignment]
    return built


def check_filters(fmt: str, options: Mapping[str, Any]) -> None:
    """Validate a category's filters at config time, with the offending filter key in the message."""
    try:
        row_filter(fmt, options)
    except ValidationError as error:
        problems = "; ".join(
            f"filters.{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise ValueError(problems) from None
