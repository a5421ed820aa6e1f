"""The run's progress over time: a JSON line every few seconds, for the report's throughput plots.

One file per start (``progress/part-<start>-<host>-<pid>.jsonl``), appended by a session reporter
(no per-request work). A kill -9 can cut the last line: the reader skips what it cannot parse.
Times are wall-clock seconds, so the starts of a resumed run follow each other on one axis.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.store.start_stamp import start_stamp

if TYPE_CHECKING:
    from flows.run.session import RunSession

PROGRESS_DIR = "progress"
log = logging.getLogger(__name__)


class ProgressLog:
    """A session reporter: ``session.reporters.append(ProgressLog(run_dir))``."""

    def __init__(self, run_dir: Path) -> None:
        stamp = start_stamp()
        host = "".join(ch if ch.isalnum() else "-" for ch in socket.gethostname())
        self.path = run_dir / PROGRESS_DIR / f"part-{stamp}-{host}-{os.getpid()}.jsonl"
        self.stopped = False
        """Set by a failed append: the log is a plot's input, so it is given up rather than retried."""

    def __call__(self, session: RunSession) -> None:
        snap = session.snapshot()
        line = {
            "at": round(time.time(), 3),
            "rows": snap["rows"],
            "rejects": snap["rejects"],
            "completion_tokens": snap["completion_tokens"],
            "in_flight": snap["in_flight"],
            "endpoints": [
                {k: e[k] for k in ("endpoint", "limit", "in_flight", "kv_usage", "queued")}
                for e in snap["endpoints"]
            ],
        }
        if self.stopped:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
        except OSError as error:  # a full disk: the shards' own write stops the run with one line
            self.stopped = True
            log.info("progress log stopped: cannot append to %s: %s", self.path, error.strerror or error)


PLOTTED_FIELDS = ("at", "completion_tokens", "in_flight")


def read_progress(run_dir: Path) -> list[list[dict[str, Any]]]:
    """Each start's samples (what the throughput plot reads of them), starts in time order (counters
    restart at 0 with each start).

    Read line by line, each kept with its plotted fields only: a week's log is about 300,000 lines
    a start, and every line kept whole (endpoints and all) held a few hundred MB at each report."""
    starts = []
    for path in sorted((run_dir / PROGRESS_DIR).glob("part-*.jsonl")):
        samples = []
        with path.open(encoding="utf-8") as lines:
            for text in lines:
                try:
                    line = json.loads(text)
                    samples.append({name: line[name] for name in PLOTTED_FIELDS})
                except (json.JSONDecodeError, KeyError, TypeError):  # a line a kill -9 cut
                    continue
        if samples:
            starts.append(samples)
    starts.sort(key=lambda samples: samples[0]["at"])
    return starts
