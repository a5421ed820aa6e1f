"""The --mem-fraction-static arithmetic, checked against the seeds' hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_launch.memory_math import (
    GIB,
    MIB,
    dtype_bytes,
    frac,
    fraction_change,
    kv_bytes_per_token,
    launch_budget,
    max_safe_fraction,
    min_fraction_for_weights,
    server_memory,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"

# tiny-llm of the CPU engines (engines/make_tiny_model.py): 2 layers, 4 heads, 2 KV heads, head_dim 32.
TINY_LLM = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 128,
    "head_dim": 32,
    "torch_dtype": "bfloat16",
}
# Qwen3-235B-A22B's attention shape: 94 layers, 64 query heads, 4 KV heads of 128.
QWEN3_235B = {
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "hidden_size": 4096,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
# DeepSeek-V3: MLA, one latent of kv_lora_rank + qk_rope_head_dim per layer.
DEEPSEEK_V3 = {
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}

# The seeds' node: SGLang saw 95.10 GiB free before loading; nvidia-smi shows 5200 MiB free at 0.85.
BASIS = round(95.10 * GIB)
FREE = 5200 * MIB


def test_tiny_llm_takes_the_512_bytes_per_token_the_fixtures_document() -> None:
    assert kv_bytes_per_token(TINY_LLM) == 512


def test_gqa_heads_split_across_tensor_parallel_gpus_but_never_below_one() -> None:
    assert kv_bytes_per_token(QWEN3_235B) == 94 * 2 * 4 * 128 * 2
    assert kv_bytes_per_token(QWEN3_235B, tp_size=2) == 94 * 2 * 2 * 128 * 2
    # 4 KV heads over 8 GPUs: SGLang replicates, each GPU keeps one head.
    assert kv_bytes_per_token(QWEN3_235B, tp_size=8) == 48_128


def test_fp8_kv_cache_halves_the_bytes() -> None:
    assert kv_bytes_per_token(QWEN3_235B, tp_size=8, kv_cache_dtype="fp8_e4m3") == 24_064
    assert kv_bytes_per_token(QWEN3_235B, tp_size=8, kv_cache_dtype="fp8_e5m2") == 24_064


def test_mla_counts_one_latent_per_layer_on_every_gpu() -> None:
    assert kv_bytes_per_token(DEEPSEEK_V3) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token(DEEPSEEK_V3, tp_size=8) == 70_272


def test_head_dim_defaults_to_hidden_over_heads_and_text_config_is_unwrapped() -> None:
    llama = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    assert kv_bytes_per_token(llama) == 32 * 2 * 8 * 128 * 2  # torch_dtype missing: bf16 assumed
    assert kv_bytes_per_token({"architectures": ["Mistral3"], "text_config": llama}) == 131_072


def test_dtype_bytes() -> None:
    assert dtype_bytes("float32") == 4
    assert dtype_bytes("torch.float16") == 2
    assert dtype_bytes("bfloat16", "fp8_e4m3") == 1
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        dtype_bytes("int3")


def test_seeds_085_to_088_adds_about_29_gib_and_leaves_about_22_gib() -> None:
    change = fraction_change(0.85, 0.88, basis_bytes=BASIS, free_bytes=FREE, bytes_per_token=48_128)
    assert change.extra_kv_bytes / GIB == pytest.approx(2.853, abs=1e-3)
    assert change.extra_kv_tokens == 63_650
    assert change.margin_bytes / GIB == pytest.approx(2.225, abs=1e-3)


def test_seeds_085_to_090_leaves_only_a_few_hundred_mib() -> None:
    change = fraction_change(0.85, 0.90, basis_bytes=BASIS, free_bytes=FREE, bytes_per_token=48_128)
    assert change.extra_kv_bytes / GIB == pytest.approx(4.755, abs=1e-3)
    assert change.margin_bytes / MIB == pytest.approx(331, abs=1)


def test_fraction_change_without_bytes_per_token_has_no_token_count() -> None:
    assert fraction_change(0.85, 0.88, basis_bytes=BASIS, free_bytes=FREE).extra_kv_tokens is None


def test_max_safe_fraction_keeps_the_margin_and_never_goes_below_current() -> None:
    assert max_safe_fraction(0.85, basis_bytes=BASIS, free_bytes=FREE, min_margin_bytes=2 * GIB) == 0.88
    assert max_safe_fraction(0.85, basis_bytes=BASIS, free_bytes=FREE, min_margin_bytes=0) == 0.9
    assert max_safe_fraction(0.85, basis_bytes=BASIS, free_bytes=GIB, min_margin_bytes=2 * GIB) == 0.85


def test_max_safe_fraction_never_advises_more_than_the_gpu_can_give() -> None:
    """A free-memory reading that does not fit the log (most of the GPU free under a running server)."""
    assert max_safe_fraction(0.85, basis_bytes=BASIS, free_bytes=BASIS, min_margin_bytes=2 * GIB) == 0.95
    assert (
        max_safe_fraction(0.97, basis_bytes=BASIS, free_bytes=BASIS, min_margin_bytes=0) == 0.97
    )  # no lower


def test_launch_budget_splits_the_static_pool_into_weights_and_kv() -> None:
    budget = launch_budget(
        0.88, free_before_load_bytes=BASIS, weights_bytes=round(55.16 * GIB), bytes_per_token=48_128
    )
    assert budget.static_bytes / GIB == pytest.approx(83.688, abs=1e-3)
    assert budget.margin_bytes / GIB == pytest.approx(11.412, abs=1e-3)
    assert budget.kv_bytes is not None and budget.kv_bytes / GIB == pytest.approx(28.528, abs=1e-3)
    assert budget.kv_tokens == 636_463
    bare = launch_budget(0.88, free_before_load_bytes=BASIS)
    assert (bare.kv_bytes, bare.kv_tokens) == (None, None)


def test_min_fraction_is_one_minus_after_over_before() -> None:
    assert min_fraction_for_weights(round(92.56 * GIB), round(13.29 * GIB)) == pytest.approx(
        0.85642, abs=1e-5
    )


def test_server_memory_from_the_real_get_server_info() -> None:
    facts = server_memory(json.loads((FIXTURES / "sglang-0.5.23" / "get_server_info.json").read_text()))
    assert facts.mem_fraction_static == 0.716
    assert facts.tp_size == 1
    assert facts.kv_cache_dtype == "auto"
    assert facts.max_total_num_tokens == 4096
    # 0.002 GB (SGLang rounds to 3 decimals) over 4096 tokens: 524, for a true 512.
    assert facts.bytes_per_token == 524
    assert facts.startup_available_bytes == round(21.534 * GIB)
    assert facts.weights_bytes == round(0.005 * GIB)


def test_server_memory_tolerates_missing_internal_states() -> None:
    facts = server_memory({"mem_fraction_static": 0.9, "tp_size": 8})
    assert (facts.mem_fraction_static, facts.tp_size, facts.bytes_per_token, facts.weights_bytes) == (
        0.9,
        8,
        None,
        None,
    )


def test_frac_formats_like_people_write_fractions() -> None:
    assert (frac(0.9), frac(0.88), frac(0.716)) == ("0.90", "0.88", "0.716")
