"""How a start of a run names the files it alone writes (timeline segments, the progress log).

A resumed run is several starts in one run directory; each start's files carry the UTC moment it
began, so a reader tells the starts apart and puts them in order by name alone.
"""

from __future__ import annotations

from datetime import UTC, datetime

START_STAMP = "%Y%m%dT%H%M%S%fZ"
"""The stamp's format: UTC to the microsecond, so it sorts as it reads."""


def start_stamp() -> str:
    """The stamp of a start beginning now."""
    return datetime.now(UTC).strftime(START_STAMP)


def stamp_moment(stamp: str) -> datetime:
    """The moment (UTC) a start's ``stamp`` names."""
    return datetime.strptime(stamp, START_STAMP).replace(tzinfo=UTC)
