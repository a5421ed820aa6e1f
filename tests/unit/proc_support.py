"""A fake ``/proc`` of two SGLang servers on one node, their schedulers, a training job and a client:
who listens on which port, and with which command line (``port_owner``, ``port_gpus``)."""

from __future__ import annotations

from pathlib import Path

SERVER_A, SCHEDULERS_A = 100, (101, 102)  # tp 2 on GPUs 0 and 1, listening on 30000 (IPv4)
SERVER_B, SCHEDULER_B = 200, 201  # tp 1 on GPU 2, listening on 30001 (IPv6)
TRAINER, CLIENT = 300, 400  # another job on GPU 3; a client connected to 30000
MODEL_A, MODEL_B = "/models/a", "Qwen/Qwen3-8B"
COMMAND_LINES = {
    SERVER_A: f"python3 -m sglang.launch_server --model-path {MODEL_A} --tp 2 --port 30000".split(),
    SERVER_B: f"python3 -m sglang.launch_server --model-path={MODEL_B} --port 30001".split(),
    TRAINER: ["python3", "train.py"],
}
"""What each process was started with (the schedulers: multiprocessing's spawn, naming no model)."""


def fake_proc(root: Path, *, listening: bool = True) -> Path:
    """A /proc of two servers, their schedulers (children), a training job and a client, with the
    TCP tables that say who listens where."""
    parents = {SERVER_A: 1, **dict.fromkeys(SCHEDULERS_A, SERVER_A), SERVER_B: 1, SCHEDULER_B: SERVER_B}
    parents |= {TRAINER: 1, CLIENT: 1}
    sockets = {SERVER_A: 7001, SERVER_B: 7002, CLIENT: 7003}
    for pid, parent in parents.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        rest = " ".join(["0"] * 47)  # the fields after the process group, as many as the kernel writes
        (root / str(pid) / "stat").write_text(f"{pid} (sglang::sch (tp) 0) S {parent} {pid} {rest}\n")
        (root / str(pid) / "fd" / "0").symlink_to("/dev/null")
        if pid in sockets:
            (root / str(pid) / "fd" / "5").symlink_to(f"socket:[{sockets[pid]}]")
        spawned = ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
        (root / str(pid) / "cmdline").write_bytes(
            b"".join(a.encode() + b"\0" for a in COMMAND_LINES.get(pid, spawned))
        )
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode\n"
    rest = "00000000:00000000 00:00000000 00000000  1000 0"
    (root / "net").mkdir()
    tcp = [f"   1: 0100007F:A3C4 0100007F:7530 01 {rest} 7003 1\n"]  # the client's end, not listening
    tcp6 = []
    if listening:
        tcp.append(f"   0: 00000000:7530 00000000:0000 0A {rest} 7001 1\n")
        tcp6.append(f"   0: {'0' * 32}:7531 {'0' * 32}:0000 0A {rest} 7002 1\n")
    (root / "net" / "tcp").write_text(header + "".join(tcp))
    (root / "net" / "tcp6").write_text(header + "".join(tcp6))
    return root
