"""The real CPU SGLang and vLLM of ../shared/engines, as the engine-tier tests start them.

The flags are those of the shared `serve.sh sglang`, copied here so nothing reads ../shared at run
time; the venv and tiny model are found under ENGINES_HOME (default ~/.cache/cpu-engines).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import engines_home

from sglang_launch.ports import free_port
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


VLLM_PYTHON = ENGINES / "venv-vllm" / "bin" / "python"

needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists() or not (TINY_MODEL / "config.json").exists(),
    reason=f"CPU vLLM or tiny-llm missing under {ENGINES} (../shared/engines/setup.sh vllm, model)",
)


@contextlib.contextmanager
def vllm_server(log_path: Path, *, kv_tokens: int = 4096, max_seqs: int = 16) -> Iterator[str]:
    """Real vLLM CPU (unmodified) with serve.sh's settings, on a free port; always stopped."""
    port = free_port("127.0.0.1")
    config = json.loads((TINY_MODEL / "config.json").read_text())
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    bytes_per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env |= {
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOOPBACK_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(TINY_MODEL),
        "--served-model-name",
        "tinyllm",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(kv_tokens * bytes_per_token),
        "--max-num-seqs",
        str(max_seqs),
        "--enforce-eager",
    ]
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready in 240 s: {log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
