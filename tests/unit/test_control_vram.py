"""Free GPU memory as the controller's OOM guard and restart detector: DCGM and NVML readings."""

from __future__ import annotations

import pytest

from flows.control import vram as vram_module
from flows.control import wiring
from flows.control.vram import MIB, VramReader, VramSample, parse_dcgm, tightest
from sglang_launch.gpu import GpuUnavailableError

DCGM = """# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",modelName="NVIDIA H200"} 9000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b",modelName="NVIDIA H200"} 1200
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",modelName="NVIDIA H200"} 134000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",modelName="NVIDIA H200"} 141800
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-a",modelName="NVIDIA H200"} 400
DCGM_FI_DEV_FB_RESERVED{gpu="1",UUID="GPU-b",modelName="NVIDIA H200"} 400
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0"} 98
"""


def test_dcgm_reading_is_the_tightest_gpu() -> None:
    assert parse_dcgm(DCGM) == VramSample(1200 * MIB, (1200 + 141800 + 400) * MIB)
    assert parse_dcgm("# TYPE x gauge\nx 1\n") is None


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf", "-5"])
def test_a_dcgm_value_that_is_no_memory_size_is_not_read_and_the_other_gpus_are(odd: str) -> None:
    """An infinite one raised OverflowError at every tick (the lane ran unsteered all run); a
    negative one read as the tightest GPU, an OOM back-off at every tick."""
    text = DCGM.replace('modelName="NVIDIA H200"} 1200', f'modelName="NVIDIA H200"}} {odd}')
    assert parse_dcgm(text) == VramSample(9000 * MIB, (9000 + 134000 + 400) * MIB)


def test_tightest_of_nvml_readings() -> None:
    assert tightest([(5, 10), (2, 10), (7, 10)]) == VramSample(2, 10)
    assert tightest([]) is None


async def test_nvml_reader_reads_and_a_broken_source_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vram_module, "read_memory", lambda: [(3 << 30, 80 << 30), (1 << 30, 80 << 30)])
    reader = VramReader("nvml")
    assert await reader.read() == VramSample(1 << 30, 80 << 30)

    def broken() -> list[tuple[int, int]]:
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
