"""Which processes on this machine serve a TCP port: the listener's owners and all their descendants.

A server's GPU work is rarely done by the process that listens: SGLang's HTTP server starts its
schedulers (one per tensor-parallel rank) as child processes, vLLM its engine core. So the answer is
the whole process tree under the listener. Linux only, read from /proc with no dependency: the
listening socket's inode in ``net/tcp`` / ``net/tcp6``, the processes whose ``fd`` links name that
socket, then the parent links in every ``stat``. Processes this user may not inspect (another user's
``fd``), and those in another PID namespace, are not seen: callers treat an empty answer as unknown.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from pathlib import Path

from sglang_launch.procfs import PROC, processes

LISTEN = "0A"
"""The TCP state ``net/tcp`` writes for a listening socket."""


def listening_inodes(port: int, proc_root: Path = PROC) -> set[int]:
    """The inodes of the sockets listening on ``port``, on any address, IPv4 or IPv6."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / table).read_text().splitlines()[1:]  # the first is a header
        except OSError:
            continue  # no IPv6 in this kernel
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def socket_holders(inodes: Collection[int], proc_root: Path = PROC) -> set[int]:
    """The processes with one of the sockets ``inodes`` open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders: set[int] = set()
    if not wanted:
        return holders
    for proc in proc_root.glob("[0-9]*"):
        with contextlib.suppress(OSError):  # gone since the listing, or not ours to inspect
            if any(os.readlink(fd) in wanted for fd in (proc / "fd").iterdir()):
                holders.add(int(proc.name))
    return holders


def with_descendants(roots: Collection[int], proc_root: Path = PROC) -> set[int]:
    """``roots`` and every process below them, from each process's parent in ``stat``."""
    children: dict[int, list[int]] = {}
    for pid, stat in processes(proc_root):
        children.setdefault(stat.ppid, []).append(pid)
    tree, frontier = set(roots), list(roots)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return tree


def serving_processes(port: int, proc_root: Path = PROC) -> set[int]:
    """The processes that listen on ``port`` and all their descendants; empty when none is seen."""
    holders = socket_holders(listening_inodes(port, proc_root), proc_root)
    return with_descendants(holders, proc_root) if holders else set()
