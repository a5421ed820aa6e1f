"""GPU preflight against faked NVML answers (8 GPUs, a stale server holding 70 GiB on GPU 3) and
against saved nvidia-smi CSVs; plus the `preflight` command's output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pynvml
import pytest
from typer.testing import CliRunner

from flows.cli import gpu as cli
from sglang_launch.gpu import GpuInfo, GpuSnapshot, GpuUnavailableError, read_gpus
from sglang_launch.gpu_csv import parse_gpu_csv
from sglang_launch.memory_math import GIB, MIB
from sglang_launch.preflight import preflight

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOTAL = 81_559 * MIB  # an H100 80GB as NVML reports it
STALE_PID, SERVER_PID, HIDDEN_PID = 4242, 5151, 7777
SECRET = "sk-live-do-not-print"
runner = CliRunner()


class FakeNvml:
    """Answers the pynvml functions gpu.py calls: 8 GPUs, GPU 3 holds a stale server's 70 GiB."""

    def __init__(self) -> None:
        self.used = {i: 4 * MIB for i in range(8)}
        self.used[3] = 72 * GIB
        self.used[5] = 3 * GIB
        self.procs: dict[int, list[Any]] = {i: [] for i in range(8)}
        self.procs[3] = [SimpleNamespace(pid=STALE_PID, usedGpuMemory=70 * GIB)]
        self.procs[5] = [SimpleNamespace(pid=HIDDEN_PID, usedGpuMemory=None)]
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        mem = lambda i: SimpleNamespace(total=TOTAL, used=self.used[i], free=TOTAL - self.used[i])  # noqa: E731
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self._shutdown)
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "570.86.15")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 8)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mem)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda i: b"NVIDIA H100 80GB HBM3")  # old API: bytes
        monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda i: self.procs[i])
        # The stale process also shows up as a graphics process: it must be listed once.
        monkeypatch.setattr(
            pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda i: self.procs[i][:1] if i == 3 else []
        )

    def _shutdown(self) -> None:
        self.shutdowns += 1


def fake_proc(root: Path) -> Path:
    """A /proc with the stale server (its command line carries an API key) and nothing for HIDDEN_PID."""
    base = root / str(STALE_PID)
    base.mkdir(parents=True, exist_ok=True)
    (base / "comm").write_text("python3\n")
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/q",
        "--api-key",
        SECRET,
        "--tp",
        "8",
    ]
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return root


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvml:
    fake = FakeNvml()
    fake.install(monkeypatch)
    proc_root = fake_proc(tmp_path / "proc")
    real_read = read_gpus
    monkeypatch.setattr(cli, "read_gpus", lambda: real_read(proc_root))
    return fake


def snapshot(tmp_path: Path) -> GpuSnapshot:
    return read_gpus(fake_proc(tmp_path / "proc"))


# --- reading NVML -----------------------------------------------------------------------------
def test_read_gpus_turns_nvml_answers_into_plain_data(nvml: FakeNvml, tmp_path: Path) -> None:
    snap = snapshot(tmp_path)
    assert nvml.shutdowns == 1
    assert (snap.source, snap.driver_version, len(snap.gpus)) == ("nvml", "570.86.15", 8)
    gpu3 = snap.gpus[3]
    assert (gpu3.index, gpu3.name, gpu3.total_bytes, gpu3.used_bytes) == (
        3,
        "NVIDIA H100 80GB HBM3",
        TOTAL,
        72 * GIB,
    )
    assert gpu3.free_bytes == TOTAL - 72 * GIB
    (stale,) = gpu3.processes  # compute + graphics listing, counted once
    assert (stale.pid, stale.name, stale.used_bytes) == (STALE_PID, "python3", 70 * GIB)
    assert stale.cmdline == "python3 -m sglang.launch_server --model-path /models/q --api-key *** --tp 8"
    (hidden,) = snap.gpus[5].processes
    assert (hidden.pid, hidden.name, hidden.cmdline, hidden.used_bytes) == (HIDDEN_PID, "", "", None)


def test_no_driver_is_a_one_line_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    with pytest.raises(GpuUnavailableError, match="NVML Shared Library Not Found"):
        read_gpus()
    result = runner.invoke(cli.app, ["preflight"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.output.startswith(
        "error: cannot read NVIDIA GPUs through NVML: NVML Shared Library Not Found"
    )
    as_json = runner.invoke(cli.app, ["preflight", "--json"])
    assert as_json.exit_code == 2
    assert json.loads(as_json.output)["exit_code"] == 2


# --- judging the snapshot ---------------------------------------------------------------------
def test_preflight_flags_the_stale_server_the_hidden_holder_and_the_imbalance(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    report = preflight(snapshot(tmp_path))
    assert report.exit_code == 1
    kinds = [(f.kind, f.severity, f.gpus) for f in report.findings]
    assert kinds == [
        ("process", "warning", (3,)),
        ("process", "warning", (5,)),
        ("unbalanced", "warning", (3,)),
    ]
    assert report.findings[0].message == (
        f"PID {STALE_PID} holds 70.0 GiB on GPU 3: python3 -m sglang.launch_server --model-path /models/q "
        "--api-key *** --tp 8"
    )
    assert "not visible from here" in report.findings[1].message
    assert report.findings[2].message.startswith(
        "free memory is unbalanced: GPU 3 has 7.6 GiB free, GPU 0 79.6 GiB; GPU 3 is below 90%"
    )


def test_a_group_without_the_stale_gpu_is_clean(nvml: FakeNvml, tmp_path: Path) -> None:
    report = preflight(snapshot(tmp_path), group=[0, 1, 2])
    assert (report.group, report.findings, report.exit_code) == ((0, 1, 2), (), 0)


def test_memory_used_by_no_listed_process_is_reported(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.used[6] = 30 * GIB  # e.g. held from another container: NVML lists no process
    findings = preflight(snapshot(tmp_path), group=[6, 7]).findings
    assert [(f.kind, f.gpus) for f in findings] == [("unattributed", (6,)), ("unbalanced", (6,))]
    assert findings[0].message.startswith("GPU 6: 30.0 GiB used but no process listed")


def test_processes_are_information_when_a_server_is_expected(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.procs = {i: [SimpleNamespace(pid=SERVER_PID, usedGpuMemory=2 * GIB)] for i in range(8)}
    nvml.used = {i: 2 * GIB for i in range(8)}
    report = preflight(snapshot(tmp_path), fraction=0.86, current_fraction=0.85)
    assert [(f.kind, f.severity) for f in report.findings] == [("process", "info")]
    assert report.findings[0].gpus == tuple(range(8))
    assert report.exit_code == 0


def test_headroom_for_a_running_server_per_gpu(tmp_path: Path) -> None:
    snap = parse_gpu_csv((FIXTURES / "logs" / "seeds_nvidia_smi.csv").read_text())
    report = preflight(snap, fraction=0.88, current_fraction=0.85, bytes_per_token=48_128)
    assert report.exit_code == 0 and report.findings == ()
    assert report.safe_fraction == 0.88
    first = report.changes[0]  # basis: the GPU total, 97871 MiB
    assert first.extra_kv_bytes / GIB == pytest.approx(2.867, abs=1e-3)
    assert first.extra_kv_tokens == 63_970
    assert first.margin_bytes / GIB == pytest.approx(2.211, abs=1e-3)
    too_far = preflight(snap, fraction=0.90, current_fraction=0.85, bytes_per_token=48_128)
    assert too_far.exit_code == 1
    (low,) = too_far.findings
    assert (low.kind, low.gpus) == ("low_margin", tuple(range(8)))
    assert low.message == (
        "--mem-fraction-static 0.90 leaves ~292 MiB free on GPUs 0,1,2,3,4,5,6,7 (keep >= 2.0 GiB for "
        "activation peaks); highest safe value 0.88"
    )


def test_headroom_for_a_new_launch_uses_the_gpu_with_least_free_memory(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    report = preflight(
        snapshot(tmp_path), group=[0, 3], fraction=0.88, weights_bytes=5 * GIB, bytes_per_token=512
    )
    assert report.launch is not None
    assert report.launch.free_before_load_bytes == TOTAL - 72 * GIB
    assert report.launch.margin_bytes / GIB == pytest.approx(0.9177, abs=1e-3)
    assert report.launch.kv_bytes is not None and report.launch.kv_bytes / GIB == pytest.approx(
        1.730, abs=1e-3
    )
    assert [f.kind for f in report.findings] == ["process", "unbalanced", "low_margin"]


def test_unknown_gpu_group_is_an_error(nvml: FakeNvml, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="none of GPUs \\[9\\] exist here"):
        preflight(snapshot(tmp_path), group=[9])


# --- nvidia-smi CSV ---------------------------------------------------------------------------
def test_csv_with_and_without_units_and_a_header() -> None:
    with_units = parse_gpu_csv("0, 75000 MiB, 81559 MiB, 6559 MiB\n1, 1 MiB, 81559 MiB, 81558 MiB\n")
    bare = parse_gpu_csv(
        "index, memory.used [MiB], memory.total [MiB], memory.free [MiB]\n0, 75000, 81559, 6559\n"
    )
    assert with_units.gpus[0] == bare.gpus[0] == GpuInfo(0, "", 81_559 * MIB, 75_000 * MIB, 6_559 * MIB)
    assert (len(with_units.gpus), with_units.has_process_info) == (2, False)


def test_csv_errors_name_the_line() -> None:
    with pytest.raises(ValueError, match="line 2: expected 4 columns"):
        parse_gpu_csv("0, 1, 3, 2\n0, 1, 2\n")
    with pytest.raises(ValueError, match="line 1: unknown unit 'TiB'"):
        parse_gpu_csv("0, 1 TiB, 2 TiB, 1 TiB\n")
    with pytest.raises(ValueError, match="no GPU rows"):
        parse_gpu_csv("\n")


# --- the command ------------------------------------------------------------------------------
def test_preflight_command_json_with_fake_nvml(nvml: FakeNvml) -> None:
    result = runner.invoke(cli.app, ["preflight", "--json"])
    assert result.exit_code == 1
    assert SECRET not in result.output
    doc = json.loads(result.output)
    assert doc["exit_code"] == 1
    assert [f["kind"] for f in doc["findings"]] == ["process", "process", "unbalanced"]
    assert doc["snapshot"]["gpus"][3]["processes"][0]["pid"] == STALE_PID


def test_preflight_command_text_for_people(nvml: FakeNvml) -> None:
    result = runner.invoke(cli.app, ["preflight"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert SECRET not in result.output
    assert "GPUs (nvml, driver 570.86.15)" in result.output
    assert (
        f"WARNING: PID {STALE_PID} holds 70.0 GiB on GPU 3: python3 -m sglang.launch_server" in result.output
    )
    assert "WARNING: free memory is unbalanced" in result.output


def test_preflight_command_headroom_from_csv_and_model_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128}
        )
    )
    csv = str(FIXTURES / "logs" / "seeds_nvidia_smi.csv")
    args = [
        "preflight",
        "--gpu-csv",
        csv,
        "--current-fraction",
        "0.85",
        "--model-config",
        str(config),
        "--tp",
        "8",
    ]
    ok = runner.invoke(cli.app, [*args, "--fraction", "0.88"], env={"COLUMNS": "200"})
    assert ok.exit_code == 0, ok.output
    assert "--mem-fraction-static 0.85 -> 0.88" in ok.output
    assert "63,970" in ok.output and "highest value leaving the margin free: 0.88" in ok.output
    assert "OK: free memory is balanced (no process list here)" in ok.output
    tight = runner.invoke(cli.app, [*args, "--fraction", "0.90", "--json"])
    assert tight.exit_code == 1
    doc = json.loads(tight.output)
    assert doc["bytes_per_token"] == 48_128
    assert doc["safe_fraction"] == 0.88
    assert doc["findings"][0]["kind"] == "low_margin"


def test_preflight_command_reads_a_saved_server_info(tmp_path: Path) -> None:
    csv = tmp_path / "smi.csv"
    csv.write_text("0, 2000 MiB, 24576 MiB, 22576 MiB\n")
    info = str(FIXTURES / "sglang-0.5.23" / "get_server_info.json")
    result = runner.invoke(
        cli.app, ["preflight", "--gpu-csv", str(csv), "--server-info", info, "--fraction", "0.75", "--json"]
    )
    doc = json.loads(result.output)
    (change,) = doc["changes"]
    assert (change["current"], change["proposed"]) == (0.716, 0.75)
    assert change["basis_bytes"] == round(21.534 * GIB)  # SGLang's startup_available, not the GPU total
    assert doc["bytes_per_token"] == 524
    assert change["extra_kv_tokens"] == round(0.034 * 21.534 * GIB) // 524


def test_preflight_command_asks_a_live_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body = json.loads((FIXTURES / "sglang-0.5.23" / "get_server_info.json").read_text())
    asked: list[tuple[str, dict[str, str]]] = []

    def fake_get(url: str, headers: dict[str, str], timeout: float) -> httpx.Response:
        asked.append((url, headers))
        return httpx.Response(200, json=body, request=httpx.Request("GET", url))

    monkeypatch.setattr(cli.httpx, "get", fake_get)
    monkeypatch.setenv("TEST_SGLANG_KEY", "k-123")
    csv = tmp_path / "smi.csv"
    csv.write_text("0, 2000 MiB, 24576 MiB, 22576 MiB\n")
    args = [
        "preflight",
        "--gpu-csv",
        str(csv),
        "--server-info",
        "http://127.0.0.1:30000/",
        "--fraction",
        "0.75",
    ]
    result = runner.invoke(cli.app, [*args, "--api-key-env", "TEST_SGLANG_KEY", "--json"])
    assert asked == [("http://127.0.0.1:30000/get_server_info", {"Authorization": "Bearer k-123"})]
    assert "k-123" not in result.output
    assert json.loads(result.output)["changes"][0]["current"] == 0.716


def test_preflight_command_rejects_bad_gpu_lists_and_fractions() -> None:
    csv = str(FIXTURES / "logs" / "seeds_nvidia_smi.csv")
    bad_group = runner.invoke(cli.app, ["preflight", "--gpu-csv", csv, "--gpus", "0,x"])
    assert bad_group.exit_code == 2 and "comma-separated GPU indices" in bad_group.output
    missing = runner.invoke(cli.app, ["preflight", "--gpu-csv", csv, "--gpus", "9", "--json"])
    assert missing.exit_code == 2
    assert json.loads(missing.output)["error"] == "none of GPUs [9] exist here (found 0,1,2,3,4,5,6,7)"
    assert runner.invoke(cli.app, ["preflight", "--gpu-csv", csv, "--fraction", "1.5"]).exit_code == 2


def test_preflight_command_rejects_an_unreadable_csv(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0, lots, 2, 3\n")
    result = runner.invoke(cli.app, ["preflight", "--gpu-csv", str(bad)])
    assert result.exit_code == 2
    assert "line 1" in result.output and "Traceback" not in result.output


def test_weights_that_do_not_fit_leave_no_kv(nvml: FakeNvml, tmp_path: Path) -> None:
    report = preflight(snapshot(tmp_path), group=[3], fraction=0.88, weights_bytes=30 * GIB)
    (no_kv,) = [f for f in report.findings if f.kind == "no_kv"]
    assert no_kv.message == (
        "the weights (30.0 GiB) do not fit in 0.88 x 7.6 GiB free on GPU 3: no room for the KV cache (SGLang "
        "stops with 'Not enough memory'); free memory on that GPU first"
    )
    roomy = preflight(snapshot(tmp_path), group=[0], fraction=0.88, weights_bytes=75 * GIB)
    assert roomy.findings[-1].message.endswith("it needs a fraction above 0.942")


def test_a_csv_header_says_the_column_order_and_impossible_numbers_are_refused() -> None:
    """With --format=csv the header names the order; read as index,used,total,free, this row had
    more used than the total, and every sum after it was wrong."""
    text = (
        "index, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n0, 81559 MiB, 76000 MiB, 5559 MiB\n"
    )
    assert parse_gpu_csv(text).gpus[0] == GpuInfo(0, "", 81_559 * MIB, 76_000 * MIB, 5_559 * MIB)
    with pytest.raises(ValueError, match="line 1: used or free above the total: columns in another order"):
        parse_gpu_csv("0, 81559, 76000, 5559\n")


def test_a_gpu_without_a_reading_is_named_and_the_others_still_judged(tmp_path: Path) -> None:
    """One [N/A] row (a GPU in a bad state) made the whole CSV unreadable: no diagnosis at all."""
    snap = parse_gpu_csv("0, 1000 MiB, 81559 MiB, 80559 MiB\n1, [N/A], [N/A], [N/A]\n")
    assert [g.index for g in snap.gpus] == [0] and snap.unreadable == (1,)
    report = preflight(snap)
    assert [(f.kind, f.gpus) for f in report.findings] == [("unreadable", (1,))] and report.exit_code == 1
    csv = tmp_path / "smi.csv"
    csv.write_text("0, 1000 MiB, 81559 MiB, 80559 MiB\n1, [N/A], [N/A], [N/A]\n")
    log = str(FIXTURES / "logs" / "seeds_kv_bound_tp8.log")
    result = CliRunner().invoke(cli.app, ["diagnose", log, "--gpu-csv", str(csv), "--json"])
    assert json.loads(result.output)["verdict"] == "kv_bound"


def test_memory_used_on_a_csv_is_a_finding_before_a_launch() -> None:
    """A CSV lists no processes, and 90 GiB used on every GPU (a stale server) was judged OK."""
    snap = parse_gpu_csv((FIXTURES / "logs" / "seeds_nvidia_smi.csv").read_text())
    report = preflight(snap)
    assert report.exit_code == 1
    assert {f.kind for f in report.findings} == {"unattributed"} and len(report.findings) == 8
    assert "no process list here" in report.findings[0].message


def test_a_driver_that_lists_no_processes_still_gives_the_memory(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vGPU and MIG answer the process queries with NotSupported: the whole snapshot was lost."""

    def not_supported(handle: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", not_supported)
    snap = read_gpus(fake_proc(tmp_path))
    assert len(snap.gpus) == 8 and not snap.has_process_info
    assert snap.gpus[3].used_bytes == 72 * GIB
    report = preflight(snap)
    assert ("unattributed", (3,)) in [(f.kind, f.gpus) for f in report.findings]
