"""Which log records are for the person running the run, not for diagnosis.

A warning a person should act on or know while a run goes on (a server restarted or given up on, no
OOM guard, a server without metrics, a category whose rows are nearly all left out of training) is
logged like any other, on its module's logger, with ``extra=SAY``. Where nobody watches a terminal
(a Prefect deployment's worker, a library call) it is an ordinary log record, as before. The CLI's
log handler (``flows.cli.console.TerminalLog``) shows it as one ``warning:`` line beside the progress
bar, and not as a structured log line that the bar's redraws bury and that reads like noise.

A record, not a callable handed down: the code that notices sits ten constructors below the CLI
(guard, controller, vram and signal readers, sinks), and each would carry a ``say`` parameter.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

SAID = "say"
"""The record's attribute that ``extra=SAY`` sets."""

SAY: Final[Mapping[str, object]] = MappingProxyType({SAID: True})
"""``log.warning(..., extra=SAY)``: this line is for the person running the run."""


def said(record: logging.LogRecord) -> bool:
    """Whether ``record`` was logged with ``extra=SAY``."""
    return getattr(record, SAID, False) is True
