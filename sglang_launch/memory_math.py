"""GPU memory arithmetic for SGLang's ``--mem-fraction-static``: pure numbers, no I/O.

How SGLang 0.5.x sizes its KV cache (``ModelRunnerKVCacheMixin.profile_max_num_token`` in
``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py``)::

    rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)
    max_total_num_tokens = int(rest_memory * (1 << 30)) // cell_size

where ``available_gpu_memory`` is the free memory *after* the weights are loaded and
``total_gpu_memory`` is, despite its name, the free memory measured *before* loading
(``pre_model_load_memory``: the minimum over the tensor-parallel ranks). 0.4.x used the same
formula. So ``mem_fraction_static`` is the share of the pre-load free memory that weights plus KV
may take, and ``(1 - fraction)`` of it is left for activations, CUDA graphs and NCCL buffers. When
``rest_memory <= 0`` SGLang stops with "Not enough memory. Please try to increase
--mem-fraction-static" (0.4.x-0.5.x) or "Loaded weights leave no GPU memory for the KV cache" (newer).

Consequences used here:
- moving a running server from fraction ``a`` to ``b`` changes its KV pool by
  ``(b - a) x basis`` bytes per GPU (basis = pre-load free memory; the GPU total is a close
  stand-in when the GPU was empty before the launch), and the memory that stays free drops by
  the same amount;
- the smallest fraction that fits the weights at all is ``1 - free_after / free_before``
  (SGLang's own suggestion in the newer error message).

All sizes are bytes (ints); SGLang's logs say "GB" but mean GiB (``bytes / (1 << 30)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

# Bytes per element of the KV cache. "auto" means "the model's dtype"; every fp8 variant is 1 byte.
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp16": 2, "bf16": 2}


def gib(n_bytes: float) -> float:
    """Bytes to GiB, the unit people compare with nvidia-smi and SGLang's logs."""
    return n_bytes / GIB


def frac(value: float) -> str:
    """A memory fraction as people write it: ``0.90``, ``0.716``."""
    return f"{value:.2f}" if round(value, 2) == round(value, 4) else f"{value:.3f}"


def dtype_bytes(model_dtype: str | None, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: fp8 KV caches (``fp8_e4m3``, ``fp8_e5m2``) halve a 16-bit model's cache."""
    kv = (kv_cache_dtype or "auto").lower()
    if kv.startswith("fp8") or kv.startswith("float8"):
        return 1
    name = (model_dtype if kv == "auto" else kv) or "bfloat16"
    name = name.lower().removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r} (expected one of {sorted(_DTYPE_BYTES)} or fp8_*)")
    return _DTYPE_BYTES[name]


def kv_bytes_per_token(config: Mapping[str, Any], *, tp_size: int = 1, kv_cache_dtype: str = "auto") -> int:
    """KV bytes one token takes on ONE GPU, from a Hugging Face ``config.json``.

    Mirrors SGLang's ``cell_size``:
    - standard attention: ``layers x 2 (K and V) x kv_heads_per_gpu x head_dim x dtype_bytes`` with
      ``kv_heads_per_gpu = max(1, num_key_value_heads // tp_size)`` (SGLang replicates KV heads when
      there are fewer heads than GPUs);
    - MLA (DeepSeek V2/V3 style, a ``kv_lora_rank`` in the config): one compressed latent per layer,
      ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes``, no separate K and V, and the same
      on every tensor-parallel rank (the latent is not split across GPUs).
    Multimodal configs keep the language model under ``text_config``. Hybrid models (sliding-window
    or Mamba layers) keep a full KV cache for only some layers; this counts all layers, so for them
    it is an upper bound.
    """
    cfg: Mapping[str, Any] = config
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    layers = int(cfg["num_hidden_layers"])
    elem = dtype_bytes(cfg.get("torch_dtype") or cfg.get("dtype"), kv_cache_dtype)
    if cfg.get("kv_lora_rank"):
        return layers * (int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])) * elem
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return layers * 2 * max(1, kv_heads // tp_size) * head_dim * elem


@dataclass(frozen=True, slots=True)
class FractionChange:
    """Moving a RUNNING server's ``--mem-fraction-static`` from ``current`` to ``proposed``, on one GPU.

    ``margin_bytes`` is what stays free on the GPU afterwards (today's free memory minus the extra
    KV): the room left for activation peaks. Negative means the new value cannot fit.
    """

    current: float
    proposed: float
    basis_bytes: int
    free_bytes: int
    extra_kv_bytes: int
    extra_kv_tokens: int | None
    margin_bytes: int


def fraction_change(
    current: float,
    proposed: float,
    *,
    basis_bytes: int,
    free_bytes: int,
    bytes_per_token: int | None = None,
) -> FractionChange:
    """The KV bytes/tokens gained and the margin left when a running server moves to ``proposed``."""
    extra = round((proposed - current) * basis_bytes)
    return FractionChange(
        current=current,
        proposed=proposed,
        basis_bytes=basis_bytes,
        free_bytes=free_bytes,
        extra_kv_bytes=extra,
        extra_kv_tokens=extra // bytes_per_token if bytes_per_token else None,
        margin_bytes=free_bytes - extra,
    )


MAX_FRACTION = 0.95
"""The most of a GPU's memory that ``--mem-fraction-static`` is ever advised to take (weights and KV):
the rest is activations, CUDA graphs and NCCL buffers, whatever a reading says is free."""


def max_safe_fraction(
    current: float, *, basis_bytes: int, free_bytes: int, min_margin_bytes: int, step: float = 0.01
) -> float:
    """The largest fraction (a multiple of ``step``) that still leaves ``min_margin_bytes`` free.

    Never below ``current``: when even today's margin is short the answer is "no higher"; never
    above ``MAX_FRACTION``: a free-memory reading that does not fit the log (another GPU's, taken
    before the server started) advised 0.85 -> 1.65.
    """
    exact = min(current + (free_bytes - min_margin_bytes) / basis_bytes, MAX_FRACTION)
    # Round on a grid of `step` with a tiny tolerance so 0.88 does not become 0.87 by float error.
    stepped = math.floor(exact / step + 1e-9) * step
    return round(max(current, stepped), 4)


@dataclass(frozen=True, slots=True)
class LaunchBudget:
    """What a FRESH launch at ``fraction`` gets on one GPU with ``free_before_load_bytes`` free.

    ``static_bytes`` (weights + KV) is ``fraction x free``; ``margin_bytes`` is the rest, left for
    activations, CUDA graphs and NCCL buffers. ``kv_bytes``/``kv_tokens`` need the weights' size.
    """

    fraction: float
    free_before_load_bytes: int
    static_bytes: int
    margin_bytes: int
    weights_bytes: int | None
    kv_bytes: int | None
    kv_tokens: int | None


def launch_budget(
    fraction: float,
    *,
    free_before_load_bytes: int,
    weights_bytes: int | None = None,
    bytes_per_token: int | None = None,
) -> LaunchBudget:
    """SGLang's static pool for a new launch, split into weights and KV when the weights are known."""
    static = round(fraction * free_before_load_bytes)
    kv = static - weights_bytes if weights_bytes is not None else None
    return LaunchBudget(
        fraction=fraction,
        free_before_load_bytes=free_before_load_bytes,
        static_bytes=static,
        margin_bytes=free_before_load_bytes - static,
        weights_bytes=weights_bytes,
        kv_bytes=kv,
        kv_tokens=kv // bytes_per_token if kv is not None and bytes_per_token else None,
    )


def min_fraction_for_weights(free_before_load_bytes: int, free_after_load_bytes: int) -> float:
    """The fraction below which SGLang finds no room for any KV: ``1 - after / before``."""
    return 1 - free_after_load_bytes / free_before_load_bytes


@dataclass(frozen=True, slots=True)
class ServerMemory:
    """Memory facts a running SGLang reports in ``/get_server_info`` (0.5.x ``internal_states``).

    ``bytes_per_token`` is the KV pool size over its token capacity; SGLang rounds the pool to
    1 MB-ish (3 decimals of GB), so on tiny pools it is approximate.
    """

    mem_fraction_static: float | None
    tp_size: int
    kv_cache_dtype: str | None
    max_total_num_tokens: int | None
    bytes_per_token: int | None
    startup_available_bytes: int | None
    weights_bytes: int | None


def server_memory(server_info: Mapping[str, Any]) -> ServerMemory:
    """Read :class:`ServerMemory` from a ``/get_server_info`` body (missing fields become None)."""
    states = server_info.get("internal_states") or [{}]
    usage: Mapping[str, Any] = (states[0] or {}).get("memory_usage") or {}
    capacity = usage.get("token_capacity") or server_info.get("max_total_num_tokens")
    kv_gb = usage.get("kvcache")
    fraction = server_info.get("mem_fraction_static")
    return ServerMemory(
        mem_fraction_static=float(fraction) if fraction is not None else None,
        tp_size=int(server_info.get("tp_size") or 1),
        kv_cache_dtype=server_info.get("kv_cache_dtype"),
        max_total_num_tokens=int(capacity) if capacity else None,
        bytes_per_token=round(kv_gb * GIB / capacity) if kv_gb and capacity else None,
        startup_available_bytes=_gb_to_bytes(usage.get("startup_available")),
        weights_bytes=_gb_to_bytes(usage.get("weight")),
    )


def _gb_to_bytes(value: float | None) -> int | None:
    return round(value * GIB) if value is not None else None
