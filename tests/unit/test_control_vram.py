"""Free GPU memory as the controller's OOM guard and restart detector: DCGM and NVML readings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pynvml
import pytest
from proc_support import SCHEDULER_B, SCHEDULERS_A, SERVER_A, SERVER_B, TRAINER, fake_proc

from flows.client.guard import Endpoint
from flows.config import RunConfig, parse_config
from flows.control import vram as vram_module
from flows.control import wiring
from flows.control.adaptive import AdaptiveLimit, LawSettings, Observation
from flows.control.oom_hold import OomHold
from flows.control.vram import MIB, VramReader, VramSample, parse_dcgm, tightest
from flows.report.summary import concurrency_markdown
from flows.run import endpoints as endpoints_module
from flows.run.endpoints import EndpointPool
from flows.run.served import Listing
from sglang_launch import engine as engine_module
from sglang_launch import port_owner
from sglang_launch.gpu import GpuUnavailableError
from sglang_launch.launcher import LaunchAttempt
from sglang_launch.placement import Placement
from sglang_launch.server_config import ServerConfig

UUIDS = [
    "GPU-5d9c1a2e-0b3f-4c1d-8e2a-7f6b5c4d3e2f",
    "GPU-a17e4b90-2c6d-4e8f-9a1b-3c5d7e9f1a2b",
    "GPU-3f8e2d1c-4b5a-6978-8a9b-0c1d2e3f4a5b",
    "GPU-c0de4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f",
]
"""NVML's UUIDs of the fakes' GPUs, by index."""
NODE_UUIDS = [
    "GPU-0e6b2f91-7c4a-4d8e-b1f3-92a5c7d0e4b6",
    "GPU-61c8d3a0-5e2f-4b97-8a06-d4f1e9c2b375",
    "GPU-b4f07e2d-193c-4a6b-9d58-0c7e3a1f6b24",
    "GPU-e85a1c3f-2d7b-4f09-a6e4-3b9d0c5f8a17",
    *UUIDS,
]
"""The UUIDs of an 8-GPU node by nvidia-smi's numbers there; a container given its GPUs 4-7 sees
them as 0-3 (``UUIDS``)."""


@dataclass(frozen=True)
class Exported:
    """One series of a dcgm-exporter: its GPU (or MIG instance) and its framebuffer sizes in MiB."""

    gpu: int
    uuid: str
    free: float | str
    used: float
    mig: tuple[str, int] | None = None
    """A MIG instance's GPU_I_PROFILE and GPU_I_ID: a series each, with its GPU's gpu and UUID."""
    uuid_label: str | None = "UUID"
    """``uuid`` under ``--use-old-namespace``; None where relabelling dropped it."""

    def labels(self) -> str:
        """In the exporter's order: gpu, UUID, pci_bus_id, device, modelName, a MIG instance's two,
        Hostname (``hostname`` since 2026), then its label fields (the driver's version)."""
        labels = [f'gpu="{self.gpu}"']
        labels += [f'{self.uuid_label}="{self.uuid}"'] if self.uuid_label else []
        labels += [f'pci_bus_id="00000000:{0x18 + 0x10 * self.gpu:02X}:00.0"', f'device="nvidia{self.gpu}"']
        labels.append('modelName="NVIDIA H200"')
        labels += [f'GPU_I_PROFILE="{self.mig[0]}"', f'GPU_I_ID="{self.mig[1]}"'] if self.mig else []
        return ",".join([*labels, 'Hostname="node-b"', 'DCGM_FI_DRIVER_VERSION="570.86.15"'])


def exporter_metrics(*series: Exported) -> str:
    """What dcgm-exporter's /metrics says of ``series`` (400 MiB reserved each), among other fields."""
    families = {
        "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", lambda s: s.free),
        "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda s: s.used),
        "DCGM_FI_DEV_FB_RESERVED": ("Framebuffer memory reserved (in MiB).", lambda s: 400),
        "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda s: 98),
    }
    lines = []
    for name, (about, value) in families.items():
        lines += [f"# HELP {name} {about}", f"# TYPE {name} gauge"]
        lines += [f"{name}{{{s.labels()}}} {value(s)}" for s in series]
    return "\n".join(lines) + "\n"


DCGM = exporter_metrics(Exported(0, NODE_UUIDS[0], 9000, 134000), Exported(1, NODE_UUIDS[1], 1200, 141800))
"""An exporter of two GPUs: GPU 0 with room, GPU 1 nearly full."""


def test_dcgm_reading_is_the_tightest_gpu() -> None:
    assert parse_dcgm(DCGM) == VramSample(1200 * MIB, (1200 + 141800 + 400) * MIB)
    assert parse_dcgm("# TYPE x gauge\nx 1\n") is None


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf", "-5"])
def test_a_dcgm_value_that_is_no_memory_size_is_not_read_and_the_other_gpus_are(odd: str) -> None:
    """An infinite one raised OverflowError at every tick (the lane ran unsteered all run); a
    negative one read as the tightest GPU, an OOM back-off at every tick."""
    text = exporter_metrics(Exported(0, NODE_UUIDS[0], 9000, 134000), Exported(1, NODE_UUIDS[1], odd, 141800))
    assert parse_dcgm(text) == VramSample(9000 * MIB, (9000 + 134000 + 400) * MIB)


def test_a_dcgm_reading_for_named_gpus_takes_only_their_series() -> None:
    """The server is on GPU 0; another job fills GPU 1 of the same node. Read over every GPU of the
    node, GPU 1 backed the server off at every tick."""
    assert parse_dcgm(DCGM, gpus={0}) == VramSample(9000 * MIB, (9000 + 134000 + 400) * MIB)
    assert parse_dcgm(DCGM, gpus={0, 1}) == parse_dcgm(DCGM)


def test_each_mig_instance_of_a_gpu_is_read_not_the_last_one_listed() -> None:
    """A GPU in MIG mode has a series per GPU instance (GPU_I_ID), each with the GPU's gpu and UUID
    labels: read as one series a GPU, the last listed stood for the GPU, and an instance with room
    hid a full one (its server out of memory, no back-off)."""
    text = exporter_metrics(
        Exported(0, NODE_UUIDS[0], 200, 70000, mig=("3g.71gb", 1)),
        Exported(0, NODE_UUIDS[0], 60000, 10200, mig=("3g.71gb", 2)),
        Exported(1, NODE_UUIDS[1], 9000, 134000),
    )
    full = VramSample(200 * MIB, (200 + 70000 + 400) * MIB)
    assert parse_dcgm(text) == full and parse_dcgm(text, gpus={0}) == full
    assert parse_dcgm(text, gpus={1}) == VramSample(9000 * MIB, (9000 + 134000 + 400) * MIB)


def _dcgm_reader(
    gpus: frozenset[int] | None,
    answers: list[str | int],
    server_url: str = "http://node-b:30000",
    **reader_args: Any,
) -> VramReader:
    """A reader of an exporter that answers ``answers`` in turn (the last one again): metrics, or
    an HTTP status."""
    reader = VramReader("http://node-b:9400/metrics", server_url=server_url, gpus=gpus, **reader_args)

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return httpx.Response(answer) if isinstance(answer, int) else httpx.Response(200, text=answer)

    reader._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return reader


async def test_a_named_gpu_the_exporter_has_no_series_for_warns_once_and_reads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """gpus counted in the server's CUDA_VISIBLE_DEVICES, or an exporter of another node: no series for
    a GPU named. No reading (not the other GPUs': they may be another server's), one line that says
    what is wrong (even after the exporter's passing failure had its own), and the reading comes back
    once the series do."""
    reader = _dcgm_reader(frozenset({0, 7}), [503, DCGM, DCGM, DCGM.replace('gpu="1"', 'gpu="7"')])
    try:
        assert await reader.read() is None  # the exporter's passing failure
        assert await reader.read() is None and await reader.read() is None
        [failed, line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "503" in failed
        assert "http://node-b:9400/metrics has no DCGM_FI_DEV_FB_FREE series for GPU 7" in line
        assert "it lists GPU 0,1" in line and "nvidia-smi" in line
        assert await reader.read() == VramSample(1200 * MIB, (1200 + 141800 + 400) * MIB)
    finally:
        await reader.aclose()


async def test_a_dcgm_reader_for_named_gpus_reads_them_and_without_every_gpu_as_before() -> None:
    named = _dcgm_reader(frozenset({0}), [DCGM])
    every = _dcgm_reader(None, [DCGM])
    try:
        assert await named.read() == VramSample(9000 * MIB, (9000 + 134000 + 400) * MIB)
        assert await every.read() == VramSample(1200 * MIB, (1200 + 141800 + 400) * MIB)
    finally:
        await named.aclose()
        await every.aclose()


def test_tightest_of_nvml_readings() -> None:
    assert tightest([(5, 10), (2, 10), (7, 10)]) == VramSample(2, 10)
    assert tightest([]) is None


async def test_nvml_reader_reads_and_a_broken_source_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vram_module, "read_memory", lambda gpus: [(3 << 30, 80 << 30), (1 << 30, 80 << 30)])
    reader = VramReader("nvml")
    assert await reader.read() == VramSample(1 << 30, 80 << 30)

    def broken(gpus: object) -> list[tuple[int, int]]:
        raise GpuUnavailableError("no driver")

    monkeypatch.setattr(vram_module, "read_memory", broken)
    assert await reader.read() is None and await reader.read() is None
    assert sum("no OOM guard" in r.message for r in caplog.records) == 1
    await reader.aclose()


def test_auto_uses_nvml_only_for_a_local_server_on_a_machine_with_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wiring, "nvml_works", lambda: True)
    local = wiring.vram_reader("auto", "http://127.0.0.1:30000")
    assert local is not None and local.source == "nvml"
    assert (
        wiring.vram_reader("auto", "http://10.1.2.3:30000") is None
    )  # remote: NVML would read the wrong GPUs
    assert wiring.vram_reader("off", "http://127.0.0.1:30000") is None
    dcgm = wiring.vram_reader("http://10.1.2.3:9400/metrics", "http://10.1.2.3:30000")
    assert dcgm is not None and dcgm.source.endswith("/metrics")
    monkeypatch.setattr(wiring, "nvml_works", lambda: False)
    assert wiring.vram_reader("auto", "http://127.0.0.1:30000") is None  # no GPU here: quietly no guard


async def test_gpus_named_for_a_local_server_where_nvml_fails_is_one_warning_not_a_silent_no_guard(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``gpus`` named asks for a guard (the config refuses them where vram reads none): NVML unusable
    here (the run in a container without the driver's library, the server beside it) was quietly none."""
    monkeypatch.setattr(wiring, "nvml_works", lambda: False)

    def broken(gpus: object) -> list[tuple[int, int]]:
        raise GpuUnavailableError("cannot read NVIDIA GPUs through NVML: Driver Not Loaded")

    monkeypatch.setattr(vram_module, "read_memory", broken)
    reader = wiring.vram_reader("auto", "http://127.0.0.1:30000", frozenset({4, 5}))
    assert reader is not None
    try:
        assert await reader.read() is None
    finally:
        await reader.aclose()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line == (
        "free GPU memory cannot be read from nvml (cannot read NVIDIA GPUs through NVML: Driver Not Loaded): "
        "no OOM guard"
    )


async def _opened(config: RunConfig, monkeypatch: pytest.MonkeyPatch) -> EndpointPool:
    """The run's endpoints, each as if it answered and listed its model (none of these hosts runs a
    server: what is tested is the wiring from the config to the OOM guard's readers)."""

    async def listed(endpoints: list[Endpoint], patience_s: float) -> list[Listing]:
        return [Listing(e, [e.client.model or "m"]) for e in endpoints]

    monkeypatch.setattr(endpoints_module, "first_answers", listed)
    pool = EndpointPool(config)
    await pool.open()
    return pool


async def test_each_endpoint_reads_its_own_nodes_exporter_and_its_own_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the config to the controllers: one `[concurrency] vram` URL read one node's exporter for
    every endpoint, over every GPU of that node. Each endpoint's own vram and gpus now reach its
    reader; one without them keeps the run's."""
    monkeypatch.setattr(wiring, "nvml_works", lambda: True)
    config = parse_config(
        {
            "run": {"name": "nodes", "output_dir": str(tmp_path)},
            "concurrency": {"vram": "http://node-a:9400/metrics"},
            "endpoints": [
                {"url": "http://node-a:30000", "model": "m"},
                {
                    "url": "http://node-b:30000",
                    "model": "m",
                    "vram": "http://node-b:9400/metrics",
                    "gpus": [4, 5],
                },
                {"url": "http://node-c:30000", "model": "m", "vram": "off"},
                {"url": "http://127.0.0.1:30000", "model": "m", "vram": "auto", "gpus": [1]},
            ],
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    pool = await _opened(config, monkeypatch)
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    try:
        readers = {c.url: c.vram for c in control.controllers}
        assert {url: (r.source, r.gpus) if r else None for url, r in readers.items()} == {
            "http://node-a:30000": ("http://node-a:9400/metrics", None),
            "http://node-b:30000": ("http://node-b:9400/metrics", {4, 5}),
            "http://node-c:30000": None,
            "http://127.0.0.1:30000": ("nvml", {1}),
        }
    finally:
        await control.aclose()
        await pool.aclose()


async def test_a_launched_servers_placement_reaches_its_oom_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the engine the run launched to its endpoint's reader; an endpoint it did not launch has none."""
    placement = Placement((0, 1), "2,3", pci_order=True)

    class Launched:
        url = "http://127.0.0.1:30000"

        def __init__(self, cfg: ServerConfig) -> None:
            pass

        def ensure_running(self) -> None:
            pass

        def placement(self) -> Placement:
            return placement

        def stop(self) -> None:
            pass

    monkeypatch.setattr(endpoints_module, "LaunchedEngine", Launched)
    monkeypatch.setattr(wiring, "nvml_works", lambda: True)
    config = parse_config(
        {
            "run": {"name": "launched", "output_dir": str(tmp_path)},
            "server": {"launch": True, "model_path": "/m", "served_model_name": "m"},
            "endpoints": [{"url": "http://127.0.0.1:30001", "model": "m"}],
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    pool = await _opened(config, monkeypatch)
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    try:
        readers = {c.url: c.vram for c in control.controllers}
        assert {url: r.placement() if r and r.placement else None for url, r in readers.items()} == {
            "http://127.0.0.1:30000": placement,
            "http://127.0.0.1:30001": None,
        }
    finally:
        await control.aclose()
        await pool.aclose()


GIB = 1 << 30
GPU_TOTAL = 80 * GIB


class FakeGpus:
    """The pynvml calls of ``sglang_launch.gpu`` answered for GPUs given as index -> (free GiB, the
    pids NVML lists as its compute processes); ``free`` may be changed between readings."""

    def __init__(self, gpus: dict[int, tuple[float, list[int]]]) -> None:
        self.free = {index: int(free * GIB) for index, (free, _) in gpus.items()}
        self.pids = {index: pids for index, (_, pids) in gpus.items()}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def memory(index: int) -> SimpleNamespace:
            free = self.free[index]
            return SimpleNamespace(free=free, total=GPU_TOTAL, used=GPU_TOTAL - free)

        def compute(index: int) -> list[SimpleNamespace]:
            return [SimpleNamespace(pid=pid, usedGpuMemory=GIB) for pid in self.pids[index]]

        for name, answer in {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "570.86.15",
            "nvmlDeviceGetCount": lambda: len(self.free),
            "nvmlDeviceGetHandleByIndex": lambda index: index,
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetName": lambda index: "NVIDIA H100 80GB HBM3",
            "nvmlDeviceGetUUID": lambda index: UUIDS[index],
            "nvmlDeviceGetComputeRunningProcesses": compute,
            "nvmlDeviceGetGraphicsRunningProcesses": lambda index: [],
        }.items():
            monkeypatch.setattr(pynvml, name, answer)


def _observation(at: float, memory: VramSample | None) -> Observation:
    return Observation(
        at=at,
        server=None,
        in_flight=40,
        waiting=10,
        outlook=None,
        completions_per_s=5.0,
        free_vram_bytes=memory.free_bytes if memory else None,
        total_vram_bytes=memory.total_bytes if memory else None,
    )


async def test_a_local_servers_oom_guard_reads_its_own_gpus_not_another_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server listening on the endpoint's port (this test's process) computes on GPU 0; another
    job (not of its process tree) fills GPU 1. Read over every GPU, GPU 1 backed the server off at
    every tick, and hid the server's own memory being let go (the restart detector)."""
    gpus = FakeGpus({0: (20, [os.getpid()]), 1: (0.5, [os.getppid()])})
    gpus.install(monkeypatch)
    monkeypatch.setattr(wiring, "nvml_works", lambda: True)
    law = AdaptiveLimit(LawSettings(initial_limit=40, min_free_vram_bytes=GIB))
    with socket.create_server(("127.0.0.1", 0)) as listening:
        reader = wiring.vram_reader("auto", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert reader is not None
        try:
            calm = law.observe(_observation(0, await reader.read()))
            assert calm.free_vram_bytes == 20 * GIB and "OOM guard" not in calm.reason
            gpus.free[0] = 79 * GIB  # the server died: its pool is let go
            released = law.observe(_observation(1, await reader.read()))
            assert "restart detected" in released.reason
        finally:
            await reader.aclose()


def busy_node() -> FakeGpus:
    """GPUs 0-1: server A's, room; GPU 2: server B's, nearly full; GPU 3: the training job's, full."""
    return FakeGpus(
        {
            0: (12, [SCHEDULERS_A[0]]),
            1: (10, [SCHEDULERS_A[1]]),
            2: (0.4, [SCHEDULER_B]),
            3: (0.2, [TRAINER]),
        }
    )


def test_the_processes_serving_a_port_are_its_listener_and_all_below_it(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    assert port_owner.listening_inodes(30000, proc) == {7001}  # not the client's connection to it
    assert port_owner.listening_inodes(30001, proc) == {7002}  # IPv6
    assert port_owner.serving_processes(30000, proc) == {SERVER_A, *SCHEDULERS_A}
    assert port_owner.serving_processes(30001, proc) == {SERVER_B, SCHEDULER_B}
    assert port_owner.serving_processes(30002, proc) == set()


async def test_each_servers_oom_guard_reads_its_own_gpus_and_says_which_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    busy_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    proc = fake_proc(tmp_path)
    a = VramReader("nvml", server_url="http://127.0.0.1:30000", proc_root=proc)
    b = VramReader("nvml", server_url="http://localhost:30001/v1", proc_root=proc)
    for _ in range(3):
        assert await a.read() == VramSample(10 * GIB, GPU_TOTAL)  # not B's GPU, nor the trainer's
        assert await b.read() == VramSample(int(0.4 * GIB), GPU_TOTAL)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "http://127.0.0.1:30000: the OOM guard reads GPU 0,1, those of the processes under the "
        "listener on port 30000",
        "http://localhost:30001/v1: the OOM guard reads GPU 2, those of the processes under the "
        "listener on port 30001",
    ]


@pytest.mark.parametrize(
    ("port", "pids", "why"),
    [
        (30002, None, "no process seen listening on port 30002"),
        (30000, [4242], "NVML lists none of the 3 processes under the listener on port 30000"),
    ],
)
async def test_a_server_whose_gpus_cannot_be_found_is_guarded_by_every_gpu_as_before(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    port: int,
    pids: list[int] | None,
    why: str,
) -> None:
    """Port not served by a process we can see, or the server's pids hidden from NVML (a container's
    PID namespace: NVML lists the host's pids): the tightest GPU of the node, and one line why."""
    gpus = busy_node()
    if pids is not None:
        gpus.pids = dict.fromkeys(gpus.pids, pids)
    gpus.install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    reader = VramReader("nvml", server_url=f"http://127.0.0.1:{port}", proc_root=fake_proc(tmp_path))
    assert await reader.read() == VramSample(int(0.2 * GIB), GPU_TOTAL)
    assert await reader.read() == VramSample(int(0.2 * GIB), GPU_TOTAL)
    [line] = [r.getMessage() for r in caplog.records]
    assert "reads every GPU of this machine" in line and why in line


def launched(tmp_path: Path, env: dict[str, str], environ: dict[str, str], args: str) -> Placement:
    """Where the run placed a server it launched with ``[server] env`` over this process's
    ``environ``, SGLang's ``server_args`` in its log being ``args``."""
    log = tmp_path / "sglang-30000-attempt1.log"
    log.write_text(f"[2026-11-29 14:06:36] server_args={{'model_path': '/m', {args}}}\n")
    return Placement.launched(ServerConfig(launch=True, model_path="/m", env=env), log, environ)


def container_node() -> FakeGpus:
    """Another job fills GPUs 0-1, the launched server runs on GPUs 2-3; NVML lists the host's pids,
    none of which the container's /proc shows."""
    return FakeGpus({0: (0.2, [4240]), 1: (0.3, [4241]), 2: (12, [4242]), 3: (10, [4243])})


@pytest.mark.parametrize(
    ("env", "environ", "args"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "'tp_size': 2"),
        ({}, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[2]},{UUIDS[3][:12]}"}, "'tp_size': 2"),  # CUDA takes a prefix
        (
            {"CUDA_VISIBLE_DEVICES": "1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            {"CUDA_VISIBLE_DEVICES": "0"},  # [server] env wins, as the launcher gives it
            "'tp_size': 2, 'base_gpu_id': 1",
        ),
    ],
)
async def test_in_a_container_a_launched_servers_guard_reads_the_gpus_the_run_placed_it_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    environ: dict[str, str],
    args: str,
) -> None:
    """NVML lists the host's pids, which the container's PID namespace hides: the guard read every
    GPU, and the other job's full GPUs 0-1 held the lane. The run placed the server itself: its
    CUDA_VISIBLE_DEVICES, in nvidia-smi's order (PCI bus order, or UUIDs), and SGLang's placement
    inside it name GPUs 2-3."""
    container_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    reader = VramReader(
        "nvml",
        server_url="http://127.0.0.1:30000",
        proc_root=fake_proc(tmp_path),
        placement=lambda: launched(tmp_path, env, environ, args),
    )
    assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and reader.gpus == {2, 3}
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("http://127.0.0.1:30000: the OOM guard reads GPU 2,3, where the run placed it")
    assert "NVML lists none of the 3 processes under the listener on port 30000" in line


async def test_a_launched_server_placed_by_cuda_indices_in_cudas_own_order_is_guarded_by_every_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA counts fastest first: its 2,3 need not be
    nvidia-smi's. No guess: every GPU, as before, and the line says why and what makes it certain."""
    container_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    placement = launched(tmp_path, {"CUDA_VISIBLE_DEVICES": "2,3"}, {}, "'tp_size': 2")
    reader = VramReader(
        "nvml",
        server_url="http://127.0.0.1:30000",
        proc_root=fake_proc(tmp_path),
        placement=lambda: placement,
    )
    assert await reader.read() == VramSample(int(0.2 * GIB), GPU_TOTAL) and reader.gpus is None
    [line] = [r.getMessage() for r in caplog.records]
    assert "the OOM guard reads every GPU of this machine" in line
    assert "NVML lists none of the 3 processes under the listener on port 30000" in line
    assert "CUDA_VISIBLE_DEVICES=2,3" in line and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in line


async def test_the_lookup_by_port_comes_before_the_launched_servers_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The processes found on the port are exact: the placement is only where they are not found, and
    not read where they are."""
    busy_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    asked: list[Placement] = []

    def placement() -> Placement:
        asked.append(
            launched(
                tmp_path,
                {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                {},
                "'tp_size': 2",
            )
        )
        return asked[-1]

    reader = VramReader(
        "nvml", server_url="http://127.0.0.1:30000", proc_root=fake_proc(tmp_path), placement=placement
    )
    assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and reader.gpus == {0, 1}
    assert asked == []
    assert "those of the processes under the listener on port 30000" in caplog.records[0].getMessage()


def _launched_dcgm_reader(tmp_path: Path, exporter: str, placement: Callable[[], Placement]) -> VramReader:
    """A DCGM reader for the server the run launched at port 30000, in a container (NVML lists none of
    its processes), its node's exporter answering ``exporter``."""
    return _dcgm_reader(
        None, [exporter], "http://127.0.0.1:30000", proc_root=fake_proc(tmp_path), placement=placement
    )


def container_exporter(uuid_label: str | None = "UUID") -> str:
    """The exporter of the container's 8-GPU node (nvidia-smi's numbers there): another job fills
    GPUs 0-5 (the container's 0-1 among them); the container's 2-3 are the node's 6-7, with room."""
    free = [300, 250, 400, 200, 200, 300, 12 * 1024, 10 * 1024]
    return exporter_metrics(
        *(
            Exported(gpu, NODE_UUIDS[gpu], room, 140000 - room, uuid_label=uuid_label)
            for gpu, room in enumerate(free)
        )
    )


def exporter_sample(free_mib: int) -> VramSample:
    """The reading of one GPU of ``container_exporter`` (140,000 MiB, 400 of them reserved)."""
    return VramSample(free_mib * MIB, 140400 * MIB)


@pytest.mark.parametrize("uuid_label", ["UUID", "uuid"])  # uuid: dcgm-exporter --use-old-namespace
async def test_a_launched_servers_exporter_is_read_for_the_gpus_the_run_placed_it_on_matched_by_uuid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, uuid_label: str
) -> None:
    """Through its node's DCGM exporter the server was read over every GPU of the node: another job's
    full GPU held its lane at every tick. Placed for certain (GPUs 2-3 of the container, in PCI bus
    order), it is read on those only, their series found by UUID (the container's 2-3 are the node's
    6-7); after a restart that placed it on GPU 2 alone, on that one."""
    container_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    placements = [launched(tmp_path, env, {}, "'tp_size': 2")]
    reader = _launched_dcgm_reader(tmp_path, container_exporter(uuid_label), lambda: placements[-1])
    try:
        assert await reader.read() == exporter_sample(10 * 1024) and reader.gpus == {2, 3}
        assert await reader.read() == exporter_sample(10 * 1024)
        placements.append(launched(tmp_path, env, {}, "'tp_size': 1"))  # restarted on CUDA device 0
        reader.relocate()
        assert await reader.read() == exporter_sample(12 * 1024) and reader.gpus == {2}
    finally:
        await reader.aclose()
    [first, _] = [r.getMessage() for r in caplog.records]
    assert first.startswith(
        f"http://127.0.0.1:30000: the OOM guard reads GPU 2,3 of this machine ({UUIDS[2]}, {UUIDS[3]}) "
        "through http://node-b:9400/metrics, where the run placed it (CUDA device 0,1 of "
        "CUDA_VISIBLE_DEVICES=2,3, CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    )


async def test_an_exporter_without_uuid_labels_is_read_for_the_placed_gpus_by_their_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Series without a UUID label (relabelled away) are matched by their gpu label: nvidia-smi's
    numbers, here of a node the run sees whole (another job on GPUs 0-1, the server on 2-3)."""
    container_node().install(monkeypatch)
    exporter = exporter_metrics(
        *(
            Exported(gpu, UUIDS[gpu], room, 140000 - room, uuid_label=None)
            for gpu, room in enumerate([300, 250, 12000, 10000])
        )
    )
    reader = _launched_dcgm_reader(tmp_path, exporter, lambda: Placement((0, 1), "2,3", pci_order=True))
    try:
        assert await reader.read() == exporter_sample(10000) and reader.gpus == {2, 3}
    finally:
        await reader.aclose()


async def test_a_launched_server_placed_by_cuda_indices_in_cudas_own_order_reads_its_whole_nodes_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not certain (CUDA counts fastest first): every GPU of the node as before, and one line that
    says why and what makes it certain."""
    container_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    placement = launched(tmp_path, {"CUDA_VISIBLE_DEVICES": "2,3"}, {}, "'tp_size': 2")
    reader = _launched_dcgm_reader(tmp_path, container_exporter(), lambda: placement)
    try:
        assert await reader.read() == exporter_sample(200) and reader.gpus is None
        assert await reader.read() == exporter_sample(200)
    finally:
        await reader.aclose()
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "http://127.0.0.1:30000: the OOM guard reads every GPU of the node of http://node-b:9400/metrics: "
        "NVML lists none of the 3 processes under the listener on port 30000"
    )
    assert "CUDA_VISIBLE_DEVICES=2,3" in line and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in line


async def test_an_exporter_without_the_placed_gpus_series_warns_once_and_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The exporter of another node lists none of this machine's GPUs: the tightest of its GPUs is
    not the server's. No reading, and one line that says so."""
    container_node().install(monkeypatch)
    reader = _launched_dcgm_reader(tmp_path, DCGM, lambda: Placement((0, 1), "2,3", pci_order=True))
    try:
        assert await reader.read() is None and await reader.read() is None
    finally:
        await reader.aclose()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line == (
        f"http://node-b:9400/metrics has no DCGM_FI_DEV_FB_FREE series for GPU 2 (UUID {UUIDS[2]}), "
        f"3 (UUID {UUIDS[3]}) (it lists GPU 0,1): the GPUs of this machine that http://127.0.0.1:30000 "
        "computes on (is it the exporter of another node?). No OOM guard while it has none"
    )


class StubServer:
    """The handle of a server the run launched, without its process: each restart starts the next of
    ``logs`` (a start has its own log, whose server_args say where SGLang placed its ranks)."""

    url = "http://127.0.0.1:30000"
    pid = 4242
    max_total_num_tokens = None

    def __init__(self, logs: list[Path]) -> None:
        self.logs = logs
        self.log_path = logs[0]
        self.up = True

    def alive(self) -> bool:
        return self.up

    def restart(self) -> list[LaunchAttempt]:
        self.log_path = self.logs[self.logs.index(self.log_path) + 1]
        self.up = True
        return [LaunchAttempt(2, None, "ready", 1.0, self.log_path)]

    def stop(self) -> None:
        self.up = False


def launched_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vram: str, args: list[str]
) -> tuple[RunConfig, StubServer, list[Path]]:
    """A run that launches its server (``[server] env`` CUDA_VISIBLE_DEVICES=2,3 in PCI bus order),
    started by the real ``LaunchedEngine`` on a stub: its first start logs server_args ``args[0]``,
    each restart the next. Returns the config, the server, and the logs read for a placement."""
    logs = []
    for number, arg in enumerate(args, 1):
        logs.append(tmp_path / f"sglang-30000-20261207-attempt{number}.log")
        logs[-1].write_text(f"[2026-12-07 14:06:36] server_args={{'model_path': '/m', {arg}}}\n")
    server = StubServer(logs)
    attempt = LaunchAttempt(1, None, "ready", 1.0, logs[0])
    monkeypatch.setattr(engine_module, "launch_with_ladder", lambda cfg, on_attempt: (server, [attempt]))
    read: list[Path] = []

    class Counted(Placement):
        @classmethod
        def launched(cls, cfg: ServerConfig, log_path: Path, environ: Mapping[str, str]) -> Placement:
            read.append(log_path)
            return Placement.launched(cfg, log_path, environ)

    monkeypatch.setattr(engine_module, "Placement", Counted)
    monkeypatch.setattr(wiring, "nvml_works", lambda: True)
    config = parse_config(
        {
            "run": {"name": "launched", "output_dir": str(tmp_path)},
            "server": {
                "launch": True,
                "model_path": "/m",
                "served_model_name": "m",
                "env": {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            },
            "concurrency": {"vram": vram},
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    return config, server, read


async def test_a_launched_servers_placement_is_read_at_the_guards_fallback_and_followed_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a container (NVML lists the host's pids): the run placed its server on GPUs 2-3 (tp 2), and
    after a crash SGLang's restart placed it on GPU 3 alone (its new log's server_args). The placement
    was read once, as the endpoint was set up, and the guard kept reading GPUs 2-3 for the new
    process. It is read where the lookup by port finds nothing, once per server start: not at every
    reading, nor at every search for the server's GPUs."""
    container_node().install(monkeypatch)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    config, server, read = launched_run(
        tmp_path, monkeypatch, "auto", ["'tp_size': 2", "'tp_size': 1, 'base_gpu_id': 1"]
    )
    pool = await _opened(config, monkeypatch)
    assert read == []  # nothing asks for it yet
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    [reader] = [c.vram for c in control.controllers]
    assert reader is not None
    reader.proc_root = fake_proc(tmp_path / "proc")
    try:
        for _ in range(3):
            assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and reader.gpus == {2, 3}
        reader.relocate()  # an outage without a restart: the same server, its placement not read again
        assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and read == server.logs[:1]
        server.up = False  # it crashed: the guard's wait restarts it, the controller looks again
        assert pool.engine is not None and await asyncio.to_thread(pool.engine.ensure_running)
        reader.relocate()
        assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and reader.gpus == {3}
        assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and read == server.logs
    finally:
        await control.aclose()
        await pool.aclose()
    lines = [r.getMessage() for r in caplog.records if r.name == vram_module.__name__]
    assert [line.split(", where")[0] for line in lines] == [
        "http://127.0.0.1:30000: the OOM guard reads GPU 2,3",
        "http://127.0.0.1:30000: the OOM guard reads GPU 2,3",
        "http://127.0.0.1:30000: the OOM guard reads GPU 3",
    ]
    assert "(CUDA device 1 of CUDA_VISIBLE_DEVICES=2,3, CUDA_DEVICE_ORDER=PCI_BUS_ID)" in lines[-1]


@pytest.mark.parametrize("vram", ["off", "auto"])
async def test_a_launched_servers_placement_is_not_read_where_no_oom_guard_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vram: str
) -> None:
    """``vram = "off"``, or ``auto`` on a machine without an NVIDIA GPU: no OOM guard, and its log was
    read at every start for nothing."""
    config, _, read = launched_run(tmp_path, monkeypatch, vram, ["'tp_size': 2"])
    monkeypatch.setattr(wiring, "nvml_works", lambda: False)
    pool = await _opened(config, monkeypatch)
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    try:
        assert [c.vram for c in control.controllers] == [None] and read == []
    finally:
        await control.aclose()
        await pool.aclose()


async def test_after_a_restart_the_server_is_found_again_and_kept_while_it_is_not_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = busy_node()
    gpus.install(monkeypatch)
    reader = VramReader("nvml", server_url="http://127.0.0.1:30001", proc_root=fake_proc(tmp_path / "up"))
    assert await reader.read() == VramSample(int(0.4 * GIB), GPU_TOTAL) and reader.gpus == {2}
    reader.proc_root = fake_proc(tmp_path / "down", listening=False)  # it died: nobody listens
    reader.relocate()
    gpus.free[2] = 79 * GIB
    assert await reader.read() == VramSample(79 * GIB, GPU_TOTAL)  # its GPU, not the trainer's
    reader.proc_root = fake_proc(tmp_path / "again")  # started again, now on GPU 3
    gpus.pids = {0: [SCHEDULERS_A[0]], 1: [SCHEDULERS_A[1]], 2: [TRAINER], 3: [SCHEDULER_B]}
    assert await reader.read() == VramSample(79 * GIB, GPU_TOTAL)  # not found again at every tick
    reader.relocate()
    assert await reader.read() == VramSample(int(0.2 * GIB), GPU_TOTAL) and reader.gpus == {3}


async def test_gpus_given_are_read_through_nvml_without_looking_for_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a container NVML lists the host's pids, none of which /proc shows: the server's GPUs were not
    found and every GPU of the node was read (the trainer's full GPU 3 backed the server off at every
    tick). Named, they are read from the first tick, and no restart sends it looking again."""
    gpus = busy_node()
    gpus.pids = {index: [4242] for index in gpus.pids}  # the PID namespace hides every process
    gpus.install(monkeypatch)
    looked: list[int] = []

    def server_gpus(port: int, proc_root: Path) -> tuple[None, str]:
        looked.append(port)
        return None, ""

    monkeypatch.setattr(vram_module, "server_gpus", server_gpus)
    caplog.set_level(logging.INFO, logger=vram_module.__name__)
    reader = VramReader(
        "nvml", server_url="http://127.0.0.1:30000", proc_root=fake_proc(tmp_path), gpus=frozenset({0, 1})
    )
    assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL)
    reader.relocate()
    gpus.free[0] = 79 * GIB
    assert await reader.read() == VramSample(10 * GIB, GPU_TOTAL) and reader.gpus == {0, 1}
    assert looked == []
    assert [r.getMessage() for r in caplog.records] == [
        "http://127.0.0.1:30000: the OOM guard reads GPU 0,1 (its gpus in [[endpoints]]) through nvml"
    ]


async def test_a_gpu_named_that_this_machine_lacks_warns_once_naming_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    busy_node().install(monkeypatch)
    reader = VramReader("nvml", server_url="http://127.0.0.1:30000", gpus=frozenset({3, 9}))
    assert await reader.read() is None and await reader.read() is None
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "no GPU 9 on this machine: NVML counts 4 GPUs (0-3," in line


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _running(control: wiring.Control, pool: EndpointPool) -> AsyncIterator[None]:
    """``control``'s loops running; then stopped, and the control and the pool closed."""
    loops = asyncio.create_task(control.run())
    try:
        yield
    finally:
        loops.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loops
        await control.aclose()
        await pool.aclose()


async def test_a_fixed_limit_holds_admissions_while_its_gpus_free_memory_is_under_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`limit = N` picks the number in flight, not the risk of an OOM: the endpoint's vram and gpus
    (and min_free_vram_gib) were silently ignored. Under the floor the lane admits no more than
    min_limit until free memory is back above it, then the waiting requests go at once; one warning
    says so. Only the endpoint's gpus count: another job's full GPU 1 does not hold it."""
    gpus = FakeGpus({0: (0.5, []), 1: (0.2, [])})
    gpus.install(monkeypatch)
    config = parse_config(
        {
            "run": {"name": "fixed", "output_dir": str(tmp_path)},
            "concurrency": {"limit": 3, "poll_s": 0.2, "min_free_vram_gib": 1.0},
            "endpoints": [{"url": "http://127.0.0.1:30000", "model": "m", "vram": "nvml", "gpus": [0]}],
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    pool = await _opened(config, monkeypatch)
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    [lane] = control.limiter.lanes
    async with _running(control, pool):
        await _until(lambda: lane.limit.limit == 1)
        await control.limiter.acquire()  # min_limit: one at a time, not a stall
        waiting = asyncio.create_task(control.limiter.acquire())
        await asyncio.sleep(0.5)
        assert not waiting.done() and lane.in_flight == 1
        gpus.free[0] = 10 * GIB
        await asyncio.wait_for(waiting, 5.0)
        assert lane.limit.limit == 3 and lane.in_flight == 2
        summary = control.summary()
        assert summary["endpoints"] == [{"endpoint": "http://127.0.0.1:30000", "oom_holds": 1, "held_to": 1}]
        assert concurrency_markdown(summary)[3:] == [
            "- http://127.0.0.1:30000: held to 1 in flight 1 time(s) by the OOM guard "
            "(GPU free memory under `min_free_vram_gib`)"
        ]
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "http://127.0.0.1:30000" in line and "0.50 GiB" in line and "min_free_vram_gib" in line


async def test_a_fixed_limits_oom_guard_finds_its_server_again_after_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixed lane has no restart detector of its own: its guard kept reading the GPU its server used
    before an outage, though the server came back on another (here GPU 3, full: held; GPU 2, the old
    one, empty). The endpoint's health coming back sends it looking again before the next reading."""
    gpus = busy_node()
    gpus.install(monkeypatch)
    reader = VramReader("nvml", server_url="http://127.0.0.1:30001", proc_root=fake_proc(tmp_path / "up"))
    up, looks = True, []

    def healthy() -> bool:
        looks.append(up)
        return up

    hold = OomHold("http://b", reader, GIB, 1, poll_s=0.01, healthy=healthy)
    changes: list[bool] = []

    async def changed() -> None:
        changes.append(hold.holding)

    loop = asyncio.create_task(hold.run(changed))
    try:
        await _until(lambda: reader.gpus == {2})
        assert changes == [True]  # its GPU 2 has 0.4 GiB free
        gpus.free[2] = 79 * GIB  # the server died and came back on GPU 3
        reader.proc_root = fake_proc(tmp_path / "again")
        gpus.pids = {0: [SCHEDULERS_A[0]], 1: [SCHEDULERS_A[1]], 2: [TRAINER], 3: [SCHEDULER_B]}
        await _until(lambda: changes == [True, False])  # GPU 2 read again: free
        await asyncio.sleep(0.1)
        assert reader.gpus == {2}  # not found again at every reading
        up = False
        await _until(lambda: not looks[-1])
        up = True
        await _until(lambda: reader.gpus == {3})
        await _until(lambda: changes == [True, False, True])  # GPU 3: 0.2 GiB free
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await reader.aclose()


class RestartingServer:
    """Server B seen by a run that launched it: hung (listening, failing its health check), then
    dead and started again by the guard (``ensure_running``) on GPU 3, answering once it is up."""

    def __init__(self, gpus: FakeGpus, proc_root: Path) -> None:
        self.gpus, self.proc_root = gpus, proc_root
        self.answering, self.alive, self.starts = True, True, 0
        self.check_s = 0.0
        """How long its health check takes (a busy server's, tens of ms on a real one)."""

    async def healthy(self) -> bool:
        await asyncio.sleep(self.check_s)
        return self.answering

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[LaunchAttempt]:
        if self.alive:
            return []
        if on_start is not None:
            on_start()
        self.gpus.pids = {0: [SCHEDULERS_A[0]], 1: [SCHEDULERS_A[1]], 2: [TRAINER], 3: [SCHEDULER_B]}
        self.alive, self.answering, self.starts = True, True, self.starts + 1
        return [LaunchAttempt(self.starts + 1, None, "ready", 1.0, self.proc_root / "sglang.log")]


async def test_a_fixed_limits_oom_guard_finds_a_server_restarted_within_one_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server failed a health check (hung: still listening on GPU 2), then died and was restarted
    on GPU 3 within the same wait: one outage. The guard looked for it as the outage began, found the
    hung process on GPU 2, and as the outage count did not move again it read GPU 2 (the old one,
    empty) for the rest of the run while the new process filled GPU 3. It looks when the endpoint
    answers again, once a restart, not at every reading; nor after a request's failure on the server
    busy before (its health check passing over ten readings, the lane closed meanwhile): no outage."""
    gpus = busy_node()
    gpus.install(monkeypatch)
    looked: list[int] = []
    find = vram_module.server_gpus

    def server_gpus(port: int, proc_root: Path) -> tuple[frozenset[int] | None, str]:
        looked.append(port)
        return find(port, proc_root)

    monkeypatch.setattr(vram_module, "server_gpus", server_gpus)
    config = parse_config(
        {
            "run": {"name": "fixed", "output_dir": str(tmp_path)},
            "concurrency": {"limit": 3, "min_free_vram_gib": 1.0},
            "endpoints": [{"url": "http://127.0.0.1:30001", "model": "m", "vram": "nvml"}],
            "categories": [{"name": "c", "source": "unused.jsonl", "format": "messages"}],
        }
    )
    pool = await _opened(config, monkeypatch)
    control = wiring.Control(pool.endpoints, config.concurrency, tmp_path)
    [hold] = control.holds
    [endpoint] = pool.endpoints
    guard = endpoint.guard
    server = RestartingServer(gpus, tmp_path)
    monkeypatch.setattr(guard, "healthy", server.healthy)
    guard.engine, guard.poll_s, guard.admit = server, 0.02, None  # no model listing to check
    hold.reader.proc_root, hold.poll_s = fake_proc(tmp_path / "proc"), 0.02
    async with _running(control, pool):
        await _until(lambda: hold.reader.gpus == {2} and hold.holding)  # GPU 2: 0.4 GiB free
        server.check_s = 0.2  # a request failed on it, busy: its health check passes, slowly
        assert await guard.recover() and guard.outages == 0
        server.check_s = 0.0
        await asyncio.sleep(0.1)  # five readings
        assert looked == [30001]  # no outage: its GPUs not looked for again
        server.answering = False  # hung
        waited = asyncio.create_task(guard.recover())
        await _until(lambda: guard.outages == 1)
        gpus.free[2] = 5 * GIB  # the hung server's memory, read after the outage began
        await _until(lambda: not hold.holding)
        server.alive = False  # it died: the guard's next look restarts it, on GPU 3 (0.2 GiB free)
        assert await asyncio.wait_for(waited, 5.0)
        assert guard.outages == 1 and guard.restarts == 1
        await _until(lambda: hold.reader.gpus == {3} and hold.holding)
        await asyncio.sleep(0.2)  # ten readings
        assert looked == [30001, 30001]  # at the first reading, and once after the restart
