"""What a run shows of itself while it runs, as one line (a log file's progress line) or, on a
terminal, as rows under the progress bar that fit its width.

On one line, an 80-column terminal cut the bar row at its end: the run's bar, count and elapsed time
were squeezed out, "prompts" read "pr…" and the first endpoint's URL ended in "…" (the second was not
shown at all). Under the bar, each thing is a row of its own: text wraps, the endpoints' numbers are
columns a few characters wide beside a label that wraps rather than being cut, and where even that
is too wide the least important column goes first (the server's busy share, then its queue, then KV
usage; in flight/limit, the controller's own numbers, stays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

Endpoint = Mapping[str, Any]
"""One endpoint of ``RunSession.snapshot()["endpoints"]``."""


def _percent(key: str) -> Callable[[Endpoint], str | None]:
    return lambda e: None if e[key] is None else f"{e[key]:.0%}"


ENDPOINT_COLUMNS: tuple[tuple[str, str, Callable[[Endpoint], str | None]], ...] = (
    ("in flight", "{} in flight", lambda e: f"{e['in_flight']}/{e['limit']}"),
    ("KV", "KV {}", _percent("kv_usage")),
    ("queue", "queue {}", lambda e: None if e["queued"] is None else str(e["queued"])),
    ("busy", "busy {}", _percent("busy")),
)
"""An endpoint's numbers, most important first: (column header, as worded on one line, value or None
where the server does not say)."""

LABEL_MIN_WIDTH = 16
"""Columns an endpoint's label keeps before a number column is dropped; a longer label wraps."""
COLUMN_GAP = 2
"""Spaces between two columns of the endpoints' table (one cell padding each side)."""


@dataclass(frozen=True)
class LiveLine:
    """What a run shows of itself while it runs: prompts settled of the total, and the detail after."""

    done: int
    total: int | None
    numbers: str
    """Rows, rejects, tok/s (and what was done before this start)."""
    starting: str | None = None
    """The launched server's start, while it starts or restarts."""
    endpoints: tuple[Endpoint, ...] = ()

    @property
    def detail(self) -> str:
        """All of it on one line, as a log file's progress line says it."""
        several = len(self.endpoints) > 1
        lines = (endpoint_line(endpoint, several=several) for endpoint in self.endpoints)
        return " · ".join(part for part in (self.starting, self.numbers, *lines) if part)


def endpoint_line(endpoint: Endpoint, *, several: bool) -> str:
    """``in flight/limit``, KV usage, server queue and busy share of an endpoint (its URL only when there
    are several)."""
    values = ((worded, value(endpoint)) for _, worded, value in ENDPOINT_COLUMNS)
    line = ", ".join(worded.format(v) for worded, v in values if v is not None)
    return f"{endpoint['endpoint']}: {line}" if several else line


def endpoint_table(endpoints: Sequence[Endpoint], width: int) -> Table:
    """The endpoints' numbers as a table at most ``width`` columns wide: a column where no server says
    anything is left out, and the least important go while the rest leave the label (shown only when
    there are several endpoints) fewer than ``LABEL_MIN_WIDTH`` columns."""
    several = len(endpoints) > 1
    columns = [(header, [value(e) for e in endpoints]) for header, _, value in ENDPOINT_COLUMNS]
    columns = [(header, cells) for header, cells in columns if any(c is not None for c in cells)]

    def needed(kept: Iterable[tuple[str, list[str | None]]]) -> int:
        widths = [max(len(header), *(len(c or "-") for c in cells)) for header, cells in kept]
        return (LABEL_MIN_WIDTH + COLUMN_GAP if several else 0) + sum(widths) + COLUMN_GAP * (len(widths) - 1)

    while len(columns) > 1 and needed(columns) > width:
        columns.pop()
    table = Table(box=None, pad_edge=False, header_style="bold")
    if several:
        table.add_column("endpoint", overflow="fold")
    for header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for i, endpoint in enumerate(endpoints):
        label = [str(endpoint["endpoint"])] if several else []
        table.add_row(*label, *(cells[i] or "-" for _, cells in columns))
    return table


@dataclass(frozen=True)
class LiveRows:
    """A ``LiveLine`` as rows under the bar, laid out for the width the terminal has at each redraw."""

    line: LiveLine

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.line.starting:
            yield Text(self.line.starting, overflow="fold")
        yield Text(self.line.numbers, overflow="fold")
        if self.line.endpoints:
            yield endpoint_table(self.line.endpoints, options.max_width)


class BarWithRows(Progress):
    """rich's progress display with the run's rows under its bar (``get_renderables`` is rich's way to
    add to what a ``Progress`` draws)."""

    rows: LiveRows | None = None

    def get_renderables(self) -> Iterable[Any]:
        yield from super().get_renderables()
        if self.rows is not None:
            yield self.rows
