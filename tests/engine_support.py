"""The real CPU SGLang of ../shared/engines, as the engine-tier tests start it.

The flags are those of the shared `serve.sh sglang`, copied here so nothing reads ../shared at run
time; the venv and tiny model are found under ENGINES_HOME (default ~/.cache/cpu-engines).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engines_home

from sglang_launch.server_config import ServerConfig

ENGINES = engines_home()
SGLANG_PYTHON = ENGINES / "venv-sglang" / "bin" / "python"
TINY_MODEL = ENGINES / "tiny-llm"

needs_sglang = pytest.mark.skipif(
    not SGLANG_PYTHON.exists() or not (TINY_MODEL / "config.json").exists(),
    reason=f"CPU SGLang or tiny-llm missing under {ENGINES} (../shared/engines/setup.sh sglang, model)",
)

# serve.sh's CPU settings: native-torch kernels, no OpenMP spinning on 2 cores, offline, idle sleep
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "SGLANG_CPU_OMP_THREADS_BIND": "0",
    "OMP_WAIT_POLICY": "PASSIVE",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}
CPU_ARGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--disable-overlap-schedule",
    "--sleep-on-idle",
]


def tiny_sglang(log_dir: Path, **fields: object) -> ServerConfig:
    """Real SGLang on CPU with the tiny model: KV pool 4096 tokens, 16 running, context 1024."""
    return ServerConfig.model_validate(
        {
            "launch": True,
            "python": str(SGLANG_PYTHON),
            "model_path": str(TINY_MODEL),
            "served_model_name": "tinyllm",
            "context_length": 1024,
            "max_total_tokens": 4096,
            "max_running_requests": 16,
            "env": CPU_ENV,
            "extra_args": CPU_ARGS,
            "startup_timeout_s": 180,
            "log_dir": log_dir,
            **fields,
        }
    )
