"""What a launched server is, kept beside its logs while it runs: so a start can stop one a killed run left.

The launcher starts each server in its own session, so that ``stop()`` can signal its whole tree; the
same fact means nothing stops it when the process that launched it dies by a signal it cannot catch
(kill -9, the OOM killer, a Prefect worker's SIGKILL, a node's job scheduler). Such an orphan keeps its
share of every GPU, and the same command run again to resume would start a second server beside it
that fails for memory or gets a tiny KV cache.

A record names the server beyond doubt, because only a process provably the one launched may be
signalled: a pid can be reused, so the record also holds the process's start time (clock ticks since
boot, field 22 of ``/proc/<pid>/stat``) and the machine it counts in (the boot, and the PID namespace
the pid belongs to: a run directory may be shared by nodes or containers). It names the launching
process the same way, so a server whose launcher still lives (another part of the run, a ``datagen
launch`` in another terminal) is never taken for an orphan.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from flows.say import SAY
from sglang_launch.procfs import PROC, proc_stat

logger = logging.getLogger(__name__)

_PREFIX = "launched-server-"


def _machine() -> str | None:
    """Where pids and start times mean something: this boot, and this process's PID namespace."""
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return None
    return f"{boot} {namespace}"


class ProcessId(BaseModel):
    """One process, told apart from any later process that reuses its pid."""

    model_config = ConfigDict(frozen=True)

    pid: int
    start_ticks: int
    machine: str

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The running process ``pid``, or None (gone, or this machine's identity unreadable)."""
        stat, machine = proc_stat(pid), _machine()
        if stat is None or machine is None:
            return None
        return cls(pid=pid, start_ticks=stat.start_ticks, machine=machine)

    def running(self) -> bool:
        """This very process still runs (the pid was not reused by another)."""
        return ProcessId.of(self.pid) == self


class ServerRecord(BaseModel):
    """A server a launcher started: ``<log_dir>/launched-server-<pid>.json`` while it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: ProcessId
    pgid: int
    port: int
    argv: list[str]  # redacted (`argv.redact_argv`): what was launched, safe to show
    owner: ProcessId  # the process that launched it
    shm_before: list[str]  # the /dev/shm files that existed before it: never its to clean up

    def orphaned(self) -> bool:
        """Still running, the same process in the same group, and its launcher dead.

        False for a record of another machine or boot: nothing about it can be proved here.
        """
        stat = proc_stat(self.server.pid)
        return (
            self.server.running() and stat is not None and stat.pgid == self.pgid and not self.owner.running()
        )

    def stale(self) -> bool:
        """Its server is provably gone: the record is of this machine and its process is not running."""
        return self.server.machine == _machine() and not self.server.running()


def record_server(
    directory: Path, pid: int, port: int, argv: list[str], shm_before: set[Path]
) -> Path | None:
    """Record the server ``pid`` that this process just started; the record's path, or None.

    Written to a temporary name and renamed, so a launcher killed while writing leaves no half
    record. None when the server is already gone, this machine cannot name its processes, or the
    record cannot be written (a full disk): the server serves all the same, so that is a warning.
    """
    server, owner, stat = ProcessId.of(pid), ProcessId.of(os.getpid()), proc_stat(pid)
    if server is None or owner is None or stat is None:
        return None
    record = ServerRecord(
        server=server,
        pgid=stat.pgid,
        port=port,
        argv=argv,
        owner=owner,
        shm_before=sorted(str(path) for path in shm_before),
    )
    path = directory / f"{_PREFIX}{pid}.json"
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(record.model_dump_json(indent=1))
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        logger.warning(
            "cannot record server pid %d in %s (%s): a kill -9 of this run would leave it",
            pid,
            path,
            error,
            extra=SAY,
        )
        return None
    return path


def read_records(directory: Path) -> list[tuple[Path, ServerRecord]]:
    """The records in ``directory``; one that cannot be read is skipped (and proves nothing)."""
    found = []
    for path in sorted(directory.glob(f"{_PREFIX}*.json")):
        with contextlib.suppress(OSError, ValidationError):
            found.append((path, ServerRecord.model_validate_json(path.read_bytes())))
    return found
