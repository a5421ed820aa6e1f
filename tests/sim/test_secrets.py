"""API keys come only from the environment and never leak: not into logs, output, config snapshots,
reports, rejects or the terminal; and the servers the project starts listen on loopback only."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline_support import check_run, datagen, write_config, write_prompts

from flows.config import EndpointConfig
from sglang_launch.server_config import ServerConfig
from sglang_launch.simulator import SimConfig, SimulatorProcess
from sglang_launch.simulator.cli import config_from_args

KEY = "sk-datagen-LEAKCHECK-7f3a9c0e51"
FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_the_api_key_is_in_no_file_log_or_output(tmp_path: Path) -> None:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 60, bad_every=20, long_every=29)  # rows, conversion rejects, server rejects
    with SimulatorProcess(SimConfig(**FAST, api_key=KEY)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="secret", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(
            config.read_text().replace(
                f'url = "{sim.url}"', f'url = "{sim.url}"\napi_key_env = "LEAK_TEST_KEY"'
            )
        )
        good = datagen("run", str(config), "--no-prefect", "-v", env={"LEAK_TEST_KEY": KEY})
        out, _ = good.communicate(timeout=180)
        wrong = datagen("run", str(config), "--no-prefect", "-v", env={"LEAK_TEST_KEY": KEY[::-1]})
        refused, _ = wrong.communicate(timeout=180)
        sim_log = sim.log_path.read_bytes()
    assert good.returncode == 0, out.decode()[-3000:]
    check = check_run(tmp_path / "secret")
    assert len(check.row_ids) == 55 and len(check.reject_ids) == 5  # the key was sent and accepted
    assert wrong.returncode == 3 and b"401" in refused  # without the right key: refused, nothing rejected
    assert b"the server refused the API key: set the endpoint's api_key_env" in refused
    assert b"(attempt" not in refused  # no request was retried: no count of attempts in its line
    assert len(check_run(tmp_path / "secret").reject_ids) == 5
    for needle in (KEY.encode(), KEY[::-1].encode()):
        assert needle not in out and needle not in refused and needle not in sim_log
        assert _files_holding(tmp_path / "secret", needle) == []
    assert b"LEAK_TEST_KEY" in (tmp_path / "secret" / "manifest.json").read_bytes()  # the NAME is kept


def test_a_secret_block_without_prefect_is_one_line_naming_the_block(tmp_path: Path) -> None:
    source = tmp_path / "p.jsonl"
    write_prompts(source, 5)
    config = write_config(
        tmp_path / "run.toml", name="block", output_dir=tmp_path, url="http://127.0.0.1:9", source=source
    )
    config.write_text(
        config.read_text().replace(
            'url = "http://127.0.0.1:9"', 'url = "http://127.0.0.1:9"\napi_key_secret = "sim-key"'
        )
    )
    run = datagen("run", str(config), "--no-prefect")
    out, _ = run.communicate(timeout=120)
    text = out.decode()
    assert run.returncode == 2, text
    (line,) = [line for line in text.splitlines() if line.startswith("error:")]
    assert "Prefect Secret block 'sim-key'" in line and "--no-prefect" in line and "api_key_env" in line
    assert "Traceback" not in text


def test_servers_the_project_starts_listen_on_loopback_by_default() -> None:
    assert SimConfig().host == "127.0.0.1"
    assert config_from_args([]).host == "127.0.0.1"  # `datagen sim`
    assert ServerConfig().host == "127.0.0.1"  # `datagen launch` and `[server] launch = true`
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        pid = sim.pid
        listening = _listening_addresses(pid)
    assert listening and all(addr.startswith("127.0.0.1:") for addr in listening), listening
    assert EndpointConfig(url="http://127.0.0.1:1").api_key_env is None


def _listening_addresses(pid: int) -> list[str]:
    """The TCP addresses ``pid`` listens on, from /proc (state 0A = LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ip_hex, port_hex = fields[1].split(":")
                ip = (
                    ".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
                    if len(ip_hex) == 8
                    else ip_hex
                )
                found.append(f"{ip}:{int(port_hex, 16)}")
    return found
