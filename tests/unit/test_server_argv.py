"""ServerConfig validation and the argv/env it turns into (exact lists: the flags are SGLang 0.5.23's)."""

import io
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sglang_launch.argv import ENV_PRESETS, build_argv, build_env, redact_argv, secret_values, shown_env
from sglang_launch.launcher import _header, _pump
from sglang_launch.server_config import DEFAULT_MEM_FRACTION_LADDER, ServerConfig


def test_minimal_sglang_argv_always_enables_metrics() -> None:
    cfg = ServerConfig(model_path="/models/m", python="/venv/bin/python")
    assert build_argv(cfg, 30000, None) == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--enable-metrics",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
    ]


def test_full_sglang_argv() -> None:
    cfg = ServerConfig(
        python="/venv/bin/python",
        model_path="moonshotai/Kimi-K2-Instruct",
        served_model_name="kimi",
        host="0.0.0.0",
        tp=8,
        dp=2,
        kv_cache_dtype="fp8_e4m3",
        enable_hierarchical_cache=True,
        hicache_size_gb=48,
        chunked_prefill_size=8192,
        max_running_requests=256,
        max_total_tokens=500000,
        context_length=131072,
        preset="kimi_k2",
        extra_args=["--cuda-graph-max-bs", "128", "--disable-custom-all-reduce"],
    )
    assert build_argv(cfg, 31000, 0.85, api_key="sk-secret") == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "moonshotai/Kimi-K2-Instruct",
        "--served-model-name",
        "kimi",
        "--tp-size",
        "8",
        "--dp-size",
        "2",
        "--mem-fraction-static",
        "0.85",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "48",
        "--chunked-prefill-size",
        "8192",
        "--max-running-requests",
        "256",
        "--max-total-tokens",
        "500000",
        "--context-length",
        "131072",
        "--reasoning-parser",
        "kimi_k2",
        "--tool-call-parser",
        "kimi_k2",
        "--trust-remote-code",
        "--enable-metrics",
        "--api-key",
        "sk-secret",
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
        "--cuda-graph-max-bs",
        "128",
        "--disable-custom-all-reduce",
    ]


def test_hicache_ratio_and_disabled_chunking() -> None:
    cfg = ServerConfig(
        model_path="m", enable_hierarchical_cache=True, hicache_ratio=1.5, chunked_prefill_size=-1
    )
    argv = build_argv(cfg, 1, None)
    assert argv[argv.index("--hicache-ratio") + 1] == "1.5"
    assert argv[argv.index("--chunked-prefill-size") + 1] == "-1"
    assert "--hicache-size" not in argv


def test_python_defaults_to_this_interpreter() -> None:
    assert build_argv(ServerConfig(model_path="m"), 1, None)[0] == sys.executable


def test_sglang_needs_a_model_path() -> None:
    with pytest.raises(ValueError, match="model_path is required"):
        build_argv(ServerConfig(), 1, None)


def test_simulator_argv_maps_the_pool_settings() -> None:
    cfg = ServerConfig(
        engine="simulator",
        python="/py",
        served_model_name="sim",
        max_total_tokens=4096,
        max_running_requests=16,
        context_length=1024,
        mem_fraction_static=0.9,  # meaningless for the simulator: not passed, nor the API key
        extra_args=["--time-scale", "0.01"],
    )
    assert build_argv(cfg, 4242, 0.9, api_key="sk-any") == [
        "/py",
        "-m",
        "sglang_launch.simulator",
        "--model-name",
        "sim",
        "--max-total-tokens",
        "4096",
        "--max-running-requests",
        "16",
        "--context-length",
        "1024",
        "--host",
        "127.0.0.1",
        "--port",
        "4242",
        "--time-scale",
        "0.01",
    ]


def test_redact_argv_hides_both_key_spellings_and_leaves_the_original() -> None:
    argv = ["py", "--api-key", "sk-1", "--port", "1", "--api-key=sk-2"]
    assert redact_argv(argv) == ["py", "--api-key", "***", "--port", "1", "--api-key=***"]
    assert argv[2] == "sk-1"


def test_kimi_preset_fills_parsers_and_trust_remote_code() -> None:
    cfg = ServerConfig(model_path="m", preset="kimi_k2")
    assert (cfg.reasoning_parser, cfg.tool_call_parser, cfg.trust_remote_code) == ("kimi_k2", "kimi_k2", True)


def test_preset_conflicting_with_an_explicit_parser_is_refused() -> None:
    with pytest.raises(ValidationError, match="preset kimi_k2 sets tool_call_parser"):
        ServerConfig(model_path="m", preset="kimi_k2", tool_call_parser="qwen25")


def test_env_layers_base_then_preset_then_explicit() -> None:
    cfg = ServerConfig(env_preset="pcie_nccl", env={"NCCL_IB_DISABLE": "0", "HF_TOKEN": "hf_x"})
    env = build_env(cfg, {"PATH": "/bin", "NCCL_P2P_DISABLE": "0"})
    assert env == {"PATH": "/bin", "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "0", "HF_TOKEN": "hf_x"}
    assert ENV_PRESETS["pcie_nccl"] == {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}


def test_shown_env_hides_secret_looking_values() -> None:
    cfg = ServerConfig(env_preset="pcie_nccl", env={"HF_TOKEN": "hf_x", "MY_API_KEY": "k", "OMP": "1"})
    assert shown_env(cfg) == {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "HF_TOKEN": "***",
        "MY_API_KEY": "***",
        "OMP": "1",
    }


def test_ladder_is_sorted_high_to_low_without_duplicates() -> None:
    assert ServerConfig().mem_fraction_ladder == list(DEFAULT_MEM_FRACTION_LADDER)
    assert ServerConfig(mem_fraction_ladder=[0.7, 0.9, 0.8, 0.9]).mem_fraction_ladder == [0.9, 0.8, 0.7]
    with pytest.raises(ValidationError, match="between 0 and 1"):
        ServerConfig(mem_fraction_ladder=[0.9, 1.2])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hicache_size_gb": 8}, "need enable_hierarchical_cache"),
        ({"enable_hierarchical_cache": True, "hicache_size_gb": 8, "hicache_ratio": 2.0}, "not both"),
        ({"chunked_prefill_size": 0}, "positive, or -1"),
        ({"mem_fraction_static": 1.0}, "less than 1"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"startup_timeout_s": float("nan")}, "finite number"),  # passed gt=0: a start never given up
        ({"stop_grace_s": float("inf")}, "finite number"),
    ],
)
def test_invalid_configs(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerConfig.model_validate(fields)


def test_a_pasted_key_in_api_key_env_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValidationError) as err:
        ServerConfig(api_key_env="sk-live-0123 4567")
    assert "NAME of an environment variable" in str(err.value)
    assert "sk-live" not in str(err.value)


def test_redact_argv_hides_secret_values_only() -> None:
    argv = ["x", "--api-key", "k1", "--hf-token=t1", "--admin-api-key", "k2", "--max-total-tokens", "4096"]
    assert redact_argv([*argv, "--tokenizer-path", "/m"]) == [
        "x",
        "--api-key",
        "***",
        "--hf-token=***",
        "--admin-api-key",
        "***",
        "--max-total-tokens",
        "4096",
        "--tokenizer-path",
        "/m",
    ]


def test_the_launch_log_hides_every_secret_flag_value_header_and_server_lines(tmp_path: Path) -> None:
    """SGLang's --admin-api-key (in extra_args) reached the log: the header showed it, and SGLang's
    own server_args line repeated it; only --api-key was hidden."""
    cfg = ServerConfig(model_path="m", extra_args=["--admin-api-key", "adm-s3cret", "--hf-token=hf-s3cret"])
    argv = build_argv(cfg, 30000, 0.88, "k-s3cret")
    assert sorted(secret_values(argv)) == ["adm-s3cret", "hf-s3cret", "k-s3cret"]
    header = _header(1, 0.88, argv, cfg)
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        sink.write(header.encode())
        lines = b"server_args=ServerArgs(api_key='k-s3cret', admin_api_key='adm-s3cret')\nready\n"
        _pump(io.BytesIO(lines), sink, [secret.encode() for secret in secret_values(argv)])
    text = log.read_text()
    assert "s3cret" not in text and "admin_api_key='***'" in text and text.endswith("ready\n")
