"""The one error a converter raises for a row it cannot use.

It subclasses ``ValueError`` so generic callers still catch it, but carries a separate ``reason``
because the reason is written verbatim into the rejects table: it must stay short and stable so
rejects can be grouped and counted across runs (no row dumps, no tracebacks).
"""

from __future__ import annotations


class ConversionError(ValueError):
    """A source row that cannot become a prompt; ``reason`` is the rejects-table text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
