"""Where a launched server computes, in nvidia-smi's numbers: only where that is certain."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_launch.placement import Placement
from sglang_launch.server_config import ServerConfig

UUIDS = ["GPU-5d9c1a2e-0b3f", "GPU-5d9c77aa-1c2d", "GPU-3f8e2d1c-4b5a", "GPU-c0de4e5f-6a7b"]


@pytest.mark.parametrize(
    ("placement", "gpus"),
    [
        (Placement((0, 1), "2,3", pci_order=True), {2, 3}),
        (Placement((1,), "1, 3", pci_order=True), {3}),  # SGLang's --base-gpu-id 1 inside it
        (Placement((0, 1), None, pci_order=True), {0, 1}),  # unset: every GPU, in PCI bus order
        (Placement((0, 1), "GPU-c0de,GPU-3f8e2d1c-4b5a", pci_order=False), {3, 2}),  # UUIDs: any order
    ],
)
def test_the_gpus_follow_where_the_order_is_nvidia_smis(placement: Placement, gpus: set[int]) -> None:
    placed, how = placement.nvml_gpus(UUIDS)
    assert placed == gpus and how.startswith("where the run placed it (CUDA device")


@pytest.mark.parametrize(
    ("placement", "why"),
    [
        (Placement((0, 1), "2,3", pci_order=False), "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
        (Placement((0,), None, pci_order=False), "CUDA counts devices in its own order"),
        (Placement((0, 1, 2), "2,3", pci_order=True), "CUDA_VISIBLE_DEVICES names no device 2"),
        (Placement((0,), "7", pci_order=True), "NVML counts 4 GPUs, no GPU 7"),
        (Placement((0,), "GPU-5d9c", pci_order=False), "2 of the GPUs NVML lists have a UUID that starts"),
        (Placement((0,), "GPU-ffff", pci_order=True), "0 of the GPUs NVML lists have a UUID that starts"),
        (Placement((0,), "MIG-9a1b", pci_order=True), "MIG-9a1b names no whole GPU that NVML lists"),
        (Placement(None, "2,3", pci_order=True), "its log does not say where SGLang placed its ranks"),
    ],
)
def test_where_the_gpus_are_not_certain_none_and_why(placement: Placement, why: str) -> None:
    placed, how = placement.nvml_gpus(UUIDS)
    assert placed is None and why in how


@pytest.mark.parametrize(
    ("placement", "uuids"),
    [
        (Placement((0,), None, pci_order=False), UUIDS[:1]),  # one GPU: no order to know
        (Placement((0, 1, 2, 3), None, pci_order=False), UUIDS),  # tp 4 on the 4 GPUs there are
        (Placement((0, 1, 2, 3), "3,2,1,0", pci_order=False), UUIDS),
    ],
)
def test_a_server_on_every_gpu_there_is_needs_no_device_order(placement: Placement, uuids: list[str]) -> None:
    """Every GPU NVML lists, in whatever order CUDA counts them, is every GPU: the guard reads them all
    as the server's own, not "not known" (the same GPUs, and a log line saying the order is unsure)."""
    placed, how = placement.nvml_gpus(uuids)
    assert placed == set(range(len(uuids))) and "every GPU NVML lists" in how


def test_a_server_log_that_cannot_be_read_is_no_placement_not_a_failed_run(tmp_path: Path) -> None:
    cfg = ServerConfig(launch=True, model_path="/m", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    placement = Placement.launched(cfg, tmp_path / "gone.log", {})
    assert placement == Placement(None, "2,3", pci_order=False)
