"""memmap's predictions against what real vLLM CPU servers reported (the captures in
tests/fixtures/vllm-cpu): kv_cache_size_tokens, concurrency, block sizes, block counts, padding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvprobe.memmap import Settings, build, load_config
from kvprobe.server.metrics import parse_metrics

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"
HYBRID = FIXTURES / "hybrid-nemotronh"
NEEDLE = Path(__file__).parents[2] / "demo" / "models" / "needle-llama" / "config.json"

# The tiny Llama behind auto-8101 / fp8-8102, as the fixtures README describes it: 2 layers,
# hidden 256, 4 heads / 2 KV heads, head_dim 64, bf16, max_position_embeddings 8192.
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def within_1pct(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= 0.01 * measured


@pytest.mark.parametrize("length", [512, 8192])
@pytest.mark.parametrize("dtype", ["auto", "fp8"])
def test_hybrid_prediction_matches_the_captured_metrics(dtype: str, length: int) -> None:
    snap = parse_metrics((HYBRID / f"metrics-{dtype}-maxlen{length}.txt").read_text())
    labels = snap.cache_config
    measured = snap.capacity()
    mm = build(HYBRID / "config.json", [dtype], length)
    plan = mm.plans[dtype]
    assert within_1pct(plan.kv_cache_tokens, measured.kv_cache_tokens)
    assert plan.kv_cache_tokens == measured.kv_cache_tokens  # in fact exact
    assert plan.max_concurrency == pytest.approx(float(labels["kv_cache_max_concurrency"]), rel=1e-9)
    assert plan.attention_block_size == int(labels["block_size"])
    assert plan.num_blocks == int(labels["num_gpu_blocks"])
    assert labels["mamba_ssm_cache_dtype"] == "float32"  # what memmap assumed from the config


@pytest.mark.parametrize("dtype", ["auto", "fp8"])
@pytest.mark.parametrize("length", [512, 8192])
def test_hybrid_alignment_matches_the_startup_log(dtype: str, length: int) -> None:
    log = (HYBRID / f"startup-{dtype}-maxlen{length}.txt").read_text()
    block = int(re.search(r"Setting attention block size to (\d+) tokens", log).group(1))
    padding = float(re.search(r"Padding mamba page size by ([\d.]+)%", log).group(1))
    tokens = int(re.search(r"KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    plan = build(HYBRID / "config.json", [dtype], length).plans[dtype]
    assert plan.attention_block_size == block
    assert round(plan.padding_pct, 2) == padding
    assert plan.kv_cache_tokens == tokens


def test_the_hybrid_targets_of_issue_7() -> None:
    short = build(HYBRID / "config.json", ["auto", "fp8"], 512)
    long = build(HYBRID / "config.json", ["auto", "fp8"], 8192)
    assert [p.kv_cache_tokens for p in short.plans.values()] == [80_659, 80_659]
    assert [p.kv_cache_tokens for p in long.plans.values()] == [599_186, 838_860]
    assert short.ratio("fp8") == 1.0
    assert long.ratio("fp8") == pytest.approx(838_860 / 599_186)


@pytest.mark.parametrize(("server", "dtype"), [("auto-8101", "auto"), ("fp8-8102", "fp8")])
def test_dense_prediction_matches_the_tiny_llama_captures(server: str, dtype: str) -> None:
    measured = parse_metrics((FIXTURES / server / "metrics_fresh.response.txt").read_text()).capacity()
    plan = build(TINY_LLAMA, [dtype], 8192).plans[dtype]
    assert plan.kv_cache_tokens == measured.kv_cache_tokens
    assert plan.num_blocks == measured.num_blocks


def test_needle_llama_targets_of_issue_7() -> None:
    mm = build(NEEDLE, ["auto", "fp8", "int8_per_token_head"], 8192)
    # 4 layers x 2 KV heads x (64 + 64) x 2 bytes = 2,048 bytes per token: 1 GiB / 2,048 = 524,288.
    assert mm.plans["auto"].kv_cache_tokens == 524_288
    assert mm.plans["fp8"].kv_cache_tokens == 1_048_576
    # The CPU build stores int8_per_token_head in one byte with no inline scales (measured: 2x).
    assert mm.plans["int8_per_token_head"].kv_cache_tokens == 1_048_576


def test_the_kv_memory_setting_scales_capacity() -> None:
    one = build(NEEDLE, ["auto"], 8192).plans["auto"].kv_cache_tokens
    four = build(NEEDLE, ["auto"], 8192, Settings(kv_memory_bytes=4 << 30)).plans["auto"].kv_cache_tokens
    assert four == 4 * one


def test_hybrid_config_file_is_the_one_served() -> None:
    # The integration test builds random weights from this file; it must stay a NemotronH config.
    data = load_config(HYBRID / "config.json")
    assert data["architectures"] == ["NemotronHForCausalLM"]
    assert data["layers_block_type"].count("full_attention") == 2


def test_the_alignment_unit_is_what_makes_the_measured_block_sizes() -> None:
    # The logs say 512 (auto) and 1,024 (fp8): a 128-token unit. A 16-token unit (FlashAttention's
    # kernel block on GPU, with --block-size 16) would give 16 x cdiv(233,600, 16 x 512) = 464 and
    # 16 x cdiv(233,600, 16 x 256) = 928.
    gpu_like = Settings(block_size=16, block_align=16)
    mm = build(HYBRID / "config.json", ["auto", "fp8"], 8192, gpu_like)
    assert [p.attention_block_size for p in mm.plans.values()] == [464, 928]
    cpu = build(HYBRID / "config.json", ["auto", "fp8"], 8192)
    assert [p.attention_block_size for p in cpu.plans.values()] == [512, 1024]
