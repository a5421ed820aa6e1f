"""The GPUs of a log's server, found by the port it still serves on this machine (``diagnose``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from proc_support import MODEL_A, MODEL_B, SCHEDULER_B, SCHEDULERS_A, TRAINER, fake_proc

from sglang_launch.gpu import GpuInfo, GpuProcess, GpuSnapshot
from sglang_launch.logparse import ServerArgs, parse_log
from sglang_launch.port_gpus import gpus_of, logged_server_gpus
from sglang_launch.procfs import command_line

GIB = 1 << 30
REAL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23" / "server_main.log"


def node() -> GpuSnapshot:
    """Server A's schedulers on GPUs 0 and 1, server B's on GPU 2, a training job on GPU 3."""
    holders = {0: SCHEDULERS_A[0], 1: SCHEDULERS_A[1], 2: SCHEDULER_B, 3: TRAINER}
    return GpuSnapshot(
        gpus=tuple(
            GpuInfo(i, "H100", 80 * GIB, 70 * GIB, 10 * GIB, (GpuProcess(pid, "python3", "", 60 * GIB),))
            for i, pid in holders.items()
        ),
        source="nvml",
    )


def test_the_log_gives_the_port_and_the_model_its_server_was_started_with() -> None:
    args = parse_log(REAL_LOG.read_text()).args
    assert (args.port, args.model_path) == (30000, "/models/tiny-llm")


def test_a_command_line_is_read_argument_by_argument(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    assert command_line(100, proc)[-4:] == ["--tp", "2", "--port", "30000"]
    assert command_line(999, proc) == []  # gone


@pytest.mark.parametrize(("port", "model", "gpus"), [(30000, MODEL_A, {0, 1}), (30001, MODEL_B, {2})])
def test_the_logs_server_if_it_serves_here_is_on_the_gpus_its_processes_compute_on(
    tmp_path: Path, port: int, model: str, gpus: set[int]
) -> None:
    """Server B was started with ``--model-path=...`` in one argument; either way the log's model."""
    found, how = logged_server_gpus(ServerArgs(port=port, model_path=model), node(), fake_proc(tmp_path))
    assert found == frozenset(gpus)
    assert how == f"those of the processes under the listener on port {port}"


def test_a_server_of_another_model_on_the_logs_port_is_not_the_logs(tmp_path: Path) -> None:
    found, how = logged_server_gpus(ServerArgs(port=30000, model_path=MODEL_B), node(), fake_proc(tmp_path))
    assert found is None
    assert how == f"the server on port 30000 is not the log's (none of its processes names {MODEL_B})"


def test_where_the_server_cannot_be_found_here_it_says_why(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    assert logged_server_gpus(ServerArgs(model_path=MODEL_A), node(), proc) == (
        None,
        "the log does not say the server's port",
    )
    assert logged_server_gpus(ServerArgs(port=30002, model_path=MODEL_A), node(), proc) == (
        None,
        "no process seen serving port 30002 on this machine",
    )
    hidden = replace(node(), has_process_info=False)
    assert logged_server_gpus(ServerArgs(port=30000, model_path=MODEL_A), hidden, proc)[0] is None
    elsewhere = GpuSnapshot(gpus=node().gpus[3:], source="nvml")  # only the training job listed
    found, how = gpus_of({100, 101, 102}, 30000, elsewhere)
    assert found is None and "PID namespace" in how
