"""The `[server]` section of the run config: which inference server to start and how.

One validated object feeds both `datagen launch` and `datagen run` (`launch = true`), so a server
that was tuned by hand with `datagen launch` starts the same way inside a run. Only *what* to start
lives here; turning it into a command line is `argv.py`, starting it is `launcher.py`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SERVER_LOGS = "server-logs"
"""The run directory's folder for server logs (`datagen run` and `datagen launch --config` use it)."""

EngineKind = Literal["sglang", "simulator"]
ParserPreset = Literal["kimi_k2"]
EnvPreset = Literal["pcie_nccl"]

DEFAULT_MEM_FRACTION_LADDER: tuple[float, ...] = (0.88, 0.85, 0.82, 0.78)

# What a parser preset implies. Kimi K2 / K2.5 need SGLang's `kimi_k2` parser for both reasoning
# and tool calls, and their checkpoints ship custom code (tokenizer, config) that must be trusted.
_PARSER_PRESETS: dict[str, dict[str, str | bool]] = {
    "kimi_k2": {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2", "trust_remote_code": True},
}

_ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ServerConfig(BaseModel):
    """How to start one SGLang server (or the project's simulator standing in for it).

    The mem-fraction ladder (what `launch_with_ladder` does after a start fails):

    `mem_fraction_static` is the share of device memory SGLang keeps for weights plus the KV pool;
    the rest is left for activations, CUDA graphs and the NCCL/torch workspace. The KV pool gets
    roughly `free memory after weights - (1 - fraction) x free memory before loading`. So the two
    kinds of memory failure call for opposite moves:

    - `cuda_oom` (CUDA out of memory while warming up) and `cuda_graph` (CUDA graph capture failed,
      whose own message says "set --mem-fraction-static to a smaller value"): the *dynamic* part ran
      out, so the next try goes one ladder step DOWN, leaving more room outside the static pool.
    - `kv_memory` ("Not enough memory. Please try to increase --mem-fraction-static", or 0.5.23's
      "Loaded weights leave no GPU memory for the KV cache ... Raise --mem-fraction-static above"):
      after the weights, the static budget left no KV pool at all, so the next try goes one ladder
      step UP, if the ladder has a higher value: its top value is the most we allow.
    - `host_memory` (hierarchical cache could not get its host pool): goes DOWN only when the host
      pool is sized by `hicache_ratio`, because then it is proportional to the device KV pool; with
      an absolute `hicache_size_gb` no fraction can help, so the failure is final.
    - `scheduler_died` alone (no more specific message; e.g. killed by the host OOM killer) and any
      unclassified failure are final: a different fraction would be a guess.

    A failure also bounds the search: after going DOWN from 0.85 the ladder never goes back UP to
    0.85 or above, and vice versa, so the ladder cannot oscillate and ends after at most
    `len(mem_fraction_ladder) + 1` attempts.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, allow_inf_nan=False)

    launch: bool = Field(
        default=False, description="`datagen run` starts, restarts and stops the server itself."
    )
    engine: EngineKind = Field(
        default="sglang", description="Real SGLang, or the project's SGLang-compatible simulator."
    )
    python: str | None = Field(
        default=None,
        description="Interpreter that can import sglang (e.g. a venv's bin/python); default: this one.",
    )
    model_path: str | None = Field(
        default=None, description="HF id or local directory of the target model (SGLang)."
    )
    served_model_name: str | None = Field(default=None, description="Model name the OpenAI API answers to.")
    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int | None = Field(default=None, ge=1, le=65535, description="Port to bind; None picks a free one.")
    tp: int = Field(default=1, ge=1, description="Tensor parallel size (--tp-size).")
    dp: int = Field(default=1, ge=1, description="Data parallel size (--dp-size).")
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="First value tried; None lets SGLang choose (see the ladder above).",
    )
    mem_fraction_ladder: list[float] = Field(
        default_factory=lambda: list(DEFAULT_MEM_FRACTION_LADDER),
        description="Fractions the ladder may move to after a memory failure, kept sorted high to low.",
    )
    kv_cache_dtype: str | None = Field(
        default=None, description="--kv-cache-dtype, e.g. auto, fp8_e4m3, bf16."
    )
    enable_hierarchical_cache: bool = Field(default=False, description="Host-memory KV cache tier (HiCache).")
    hicache_size_gb: int | None = Field(
        default=None, ge=1, description="Host KV pool size in GB (--hicache-size)."
    )
    hicache_ratio: float | None = Field(
        default=None, gt=0, description="Host KV pool / device KV pool (--hicache-ratio)."
    )
    chunked_prefill_size: int | None = Field(
        default=None, description="Tokens per prefill chunk; -1 disables chunking."
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, description="Cap on requests decoding at once."
    )
    max_total_tokens: int | None = Field(default=None, ge=1, description="Cap on the KV pool in tokens.")
    context_length: int | None = Field(default=None, ge=1, description="Override the model's context length.")
    reasoning_parser: str | None = Field(
        default=None, description="--reasoning-parser, e.g. qwen3, deepseek-r1, kimi_k2."
    )
    tool_call_parser: str | None = Field(
        default=None, description="--tool-call-parser, e.g. qwen25, hermes, kimi_k2."
    )
    trust_remote_code: bool = Field(default=False, description="Allow the checkpoint's own Python code.")
    preset: ParserPreset | None = Field(
        default=None, description="Model family preset; kimi_k2 = both parsers kimi_k2 + trust_remote_code."
    )
    api_key_env: str | None = Field(
        default=None,
        description="NAME of the environment variable holding the API key (never the key itself).",
    )
    env_preset: EnvPreset | None = Field(
        default=None,
        description="Environment bundle; pcie_nccl = NCCL without P2P/InfiniBand (see argv.ENV_PRESETS).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables; win over presets."
    )
    extra_args: list[str] = Field(default_factory=list, description="Appended verbatim to the server's argv.")
    startup_timeout_s: float = Field(default=1800.0, gt=0, description="Give up on /health after this long.")
    health_poll_s: float = Field(
        default=1.0, gt=0, description="Seconds between /health polls while starting."
    )
    stop_grace_s: float = Field(default=10.0, gt=0, description="SIGTERM to SIGKILL delay when stopping.")
    log_dir: Path = Field(
        default=Path("output/server"), description="Where server logs go (the run directory)."
    )

    @field_validator("mem_fraction_ladder")
    @classmethod
    def _ladder_sorted(cls, ladder: list[float]) -> list[float]:
        """Sort high to low and dedupe, so "one step down/up" has a single meaning."""
        if any(not 0 < f < 1 for f in ladder):
            raise ValueError("mem_fraction_ladder values must be between 0 and 1")
        return sorted(set(ladder), reverse=True)

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk_size(cls, size: int | None) -> int | None:
        if size is not None and size != -1 and size < 1:
            raise ValueError("chunked_prefill_size must be positive, or -1 to disable chunking")
        return size

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, name: str | None) -> str | None:
        """Refuse a pasted key early; errors hide the input, so the key is not echoed back."""
        if name is not None and not _ENV_VAR_NAME.fullmatch(name):
            raise ValueError("api_key_env must be the NAME of an environment variable, not the key")
        return name

    @model_validator(mode="after")
    def _resolve(self) -> ServerConfig:
        if (self.hicache_size_gb is not None or self.hicache_ratio is not None) and not (
            self.enable_hierarchical_cache
        ):
            raise ValueError("hicache_size_gb / hicache_ratio need enable_hierarchical_cache = true")
        if self.hicache_size_gb is not None and self.hicache_ratio is not None:
            raise ValueError("set hicache_size_gb or hicache_ratio, not both (SGLang ignores the ratio)")
        if self.preset is not None:
            for name, value in _PARSER_PRESETS[self.preset].items():
                current = getattr(self, name)
                if current in (None, False):
                    setattr(self, name, value)
                elif current != value:
                    raise ValueError(f"preset {self.preset} sets {name}={value!r}, but {current!r} was given")
        return self
