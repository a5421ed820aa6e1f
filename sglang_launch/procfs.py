"""Linux's ``/proc``: what a process's ``stat`` line and command line say, for one process or every one.

Read in one place for the launcher (a server's process group, a killed run's server told apart from
a reused pid) and the OOM guard (a server's process tree). The name in ``stat`` sits in parentheses
and may hold spaces and parentheses itself, so the fields are split after its last ``)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process that has not exited (not a zombie)."""

    ppid: int
    pgid: int
    start_ticks: int
    """When it started, in clock ticks since boot: with the pid, a process no later one can be."""


def proc_stat(pid: int, proc_root: Path = PROC) -> ProcStat | None:
    """The process ``pid`` now, or None when there is none, or only its zombie."""
    try:
        fields = (proc_root / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        # state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime cutime
        # cstime priority nice num_threads itrealvalue starttime: fields 3 to 22 of proc(5)
        return ProcStat(ppid=int(fields[1]), pgid=int(fields[2]), start_ticks=int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def processes(proc_root: Path = PROC) -> Iterator[tuple[int, ProcStat]]:
    """Every live process this reader can see, with its ``stat``."""
    for proc in proc_root.glob("[0-9]*"):
        stat = proc_stat(int(proc.name), proc_root)
        if stat is not None:
            yield int(proc.name), stat


def command_line(pid: int, proc_root: Path = PROC) -> list[str]:
    """The arguments the process ``pid`` was started with (empty when it is gone or hidden)."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]
