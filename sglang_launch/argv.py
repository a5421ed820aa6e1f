"""ServerConfig -> the server's argv list and environment (pure: no I/O, no os.environ reads).

An argument list, never a shell string: model paths and extra arguments cannot be misquoted or
injected. The API key is an input here (the launcher reads it from the named environment variable
at spawn time) and `redact_argv` is the only form of the argv that may be shown or logged.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from sglang_launch.server_config import ServerConfig

REDACTED = "***"

# Environment bundles. pcie_nccl is for multi-GPU boxes without NVLink or InfiniBand (consumer or
# workstation cards on plain PCIe): NCCL's peer-to-peer path is known to hang or corrupt there, and
# probing for IB wastes startup time, so NCCL falls back to shared-memory transfers through the host.
ENV_PRESETS: dict[str, dict[str, str]] = {
    "pcie_nccl": {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
}

_SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd"})
"""A flag whose words (split at - and _) include one of these takes a secret (``--api-key X``,
``--admin-api-key X``, ``--hf-token=X``). Whole words only, so ``--max-total-tokens`` and
``--tokenizer-path`` keep their values."""
_SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def _opt(flag: str, value: object | None) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _sglang_args(cfg: ServerConfig, mem_fraction_static: float | None) -> list[str]:
    if cfg.model_path is None:
        raise ValueError("[server] model_path is required to launch SGLang")
    return [
        "-m",
        "sglang.launch_server",
        "--model-path",
        cfg.model_path,
        *_opt("--served-model-name", cfg.served_model_name),
        *(["--tp-size", str(cfg.tp)] if cfg.tp > 1 else []),
        *(["--dp-size", str(cfg.dp)] if cfg.dp > 1 else []),
        *_opt("--mem-fraction-static", mem_fraction_static),
        *_opt("--kv-cache-dtype", cfg.kv_cache_dtype),
        *(["--enable-hierarchical-cache"] if cfg.enable_hierarchical_cache else []),
        *_opt("--hicache-size", cfg.hicache_size_gb),
        *_opt("--hicache-ratio", cfg.hicache_ratio),
        *_opt("--chunked-prefill-size", cfg.chunked_prefill_size),
        *_opt("--max-running-requests", cfg.max_running_requests),
        *_opt("--max-total-tokens", cfg.max_total_tokens),
        *_opt("--context-length", cfg.context_length),
        *_opt("--reasoning-parser", cfg.reasoning_parser),
        *_opt("--tool-call-parser", cfg.tool_call_parser),
        *(["--trust-remote-code"] if cfg.trust_remote_code else []),
        # the controller reads /metrics; without this flag SGLang does not serve it
        "--enable-metrics",
    ]


def _simulator_args(cfg: ServerConfig) -> list[str]:
    return [
        "-m",
        "sglang_launch.simulator",
        *_opt("--model-name", cfg.served_model_name),
        *_opt("--max-total-tokens", cfg.max_total_tokens),
        *_opt("--max-running-requests", cfg.max_running_requests),
        *_opt("--context-length", cfg.context_length),
    ]


def build_argv(
    cfg: ServerConfig, port: int, mem_fraction_static: float | None, api_key: str | None = None
) -> list[str]:
    """The full argv for one start attempt.

    `mem_fraction_static` is passed separately from `cfg` because the ladder changes it between
    attempts; `port` because a free port is chosen once and kept across attempts and restarts.
    The simulator gets the settings it shares with SGLang (pool, running cap, context, name);
    anything else it takes (e.g. `--time-scale`) goes in `extra_args`.
    """
    if cfg.engine == "sglang":
        engine_args = [*_sglang_args(cfg, mem_fraction_static), *_opt("--api-key", api_key)]
    else:  # the simulator accepts any key, and has no memory fraction to set
        engine_args = _simulator_args(cfg)
    return [
        cfg.python or sys.executable,
        *engine_args,
        "--host",
        cfg.host,
        "--port",
        str(port),
        *cfg.extra_args,
    ]


def build_env(cfg: ServerConfig, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: `base` (normally os.environ), then the preset, then `cfg.env`."""
    preset = ENV_PRESETS[cfg.env_preset] if cfg.env_preset else {}
    return {**base, **preset, **cfg.env}


def shown_env(cfg: ServerConfig) -> dict[str, str]:
    """What the config adds to the environment, safe to log: values of secret-looking names hidden."""
    return {
        name: REDACTED if _SECRET_ENV_NAME.search(name) else value
        for name, value in build_env(cfg, {}).items()
    }


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of argv that is safe to print: every secret flag's value replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif eq and _is_secret_flag(flag):
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(arg)
            hide_next = _is_secret_flag(arg)
    return out


def secret_values(argv: list[str]) -> list[str]:
    """The values ``redact_argv`` hides: what no log may show, the argv header nor the server's own
    lines (SGLang prints its ``server_args``, keys included)."""
    return [
        arg.partition("=")[2] if shown.endswith(f"={REDACTED}") else arg
        for arg, shown in zip(argv, redact_argv(argv), strict=True)
        if shown != arg
    ]


def _is_secret_flag(arg: str) -> bool:
    return arg.startswith("-") and not _SECRET_WORDS.isdisjoint(re.split(r"[-_]+", arg.lower().lstrip("-")))
