"""memmap on public model shapes (tests/fixtures/configs, see its README): bytes per layer type and
the predicted capacity ratio per KV dtype, each derived by hand in the test from vLLM's rules, at
1 GiB of KV memory and the CPU build's defaults (block 128, alignment 128, 2,048 batched tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe.memmap import build

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
GIB = 1 << 30


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tokens(num_blocks: int, blocks_per_request: int, length: int) -> int:
    return int(num_blocks / blocks_per_request * length)


def test_dense_gqa_llama_3_1_8b() -> None:
    mm = build(CONFIGS / "llama-3.1-8b.json", ["auto", "fp8", "int8_per_token_head"], 8192)
    per_token = 32 * 8 * (128 + 128) * 2  # layers x KV heads x (K + V) x bf16 = 128 KiB
    assert mm.plans["auto"].attention_bytes_per_token == {"full_attention": per_token}
    assert mm.plans["auto"].kv_cache_tokens == GIB // per_token == 8192
    assert mm.ratio("fp8") == 2.0
    assert mm.ratio("int8_per_token_head") == 2.0
    assert mm.bytes_per_sequence("auto") == {"full_attention": per_token * 8192, "mlp": 0}
    assert mm.ceiling() is None  # no state: KV is the whole lever
    assert mm.conclusion().startswith("Full-attention KV is all of each sequence's bytes")


def test_mla_deepseek_v3() -> None:
    mm = build(CONFIGS / "deepseek-v3.json", ["auto", "fp8", "fp8_ds_mla"], 8192)
    latent = 512 + 64  # one latent per token per layer, no separate V
    blocks = {dtype: GIB // (61 * 128 * per_token) for dtype, per_token in
              (("auto", latent * 2), ("fp8", latent), ("fp8_ds_mla", 656))}
    assert blocks == {"auto": 119, "fp8": 238, "fp8_ds_mla": 209}
    for dtype, n in blocks.items():
        assert mm.plans[dtype].kv_cache_tokens == tokens(n, 8192 // 128, 8192)
    assert mm.ratio("fp8") == 2.0
    assert mm.ratio("fp8_ds_mla") == pytest.approx(209 / 119, rel=1e-4)  # 1.76x: the packed scales cost
    assert mm.model.no_kv == {"mlp": 3, "moe": 58}  # first_k_dense_replace = 3


def test_sliding_window_gemma_3_4b() -> None:
    short = build(CONFIGS / "gemma-3-4b.json", ["auto", "fp8"], 8192)
    long = build(CONFIGS / "gemma-3-4b.json", ["auto", "fp8"], 131072)
    assert short.model.count("full_attention") == 5 and short.model.count("sliding_window") == 29
    # Groups of 5 layers (the global count): 1 full group + cdiv(29, 5) = 6 sliding groups.
    page = 4 * (256 + 256) * 2 * 128  # 4 KV heads, head_dim 256, bf16, 128 tokens = 512 KiB
    num_blocks = GIB // (5 * page)
    sliding_blocks = cdiv(min(1024 - 1 + 2048, 8192), 128) + 1  # window - 1 + in-flight, +1 for the edge
    assert len(short.plans["auto"].groups) == 7
    assert short.plans["auto"].kv_cache_tokens == tokens(num_blocks, 64 + 6 * sliding_blocks, 8192)
    assert long.plans["auto"].kv_cache_tokens == tokens(num_blocks, 1024 + 6 * sliding_blocks, 131072)
    assert long.plans["fp8"].kv_cache_tokens == tokens(GIB // (5 * page // 2), 1024 + 6 * sliding_blocks, 131072)
    assert long.ratio("fp8") == pytest.approx(819 / 409, rel=1e-4)  # int() of the token counts
    # A sliding window's bytes stop growing at the window; full attention keeps growing.
    sw_short = short.bytes_per_sequence("auto")["sliding_window"]
    assert sw_short == long.bytes_per_sequence("auto")["sliding_window"] == 6 * sliding_blocks * 5 * page
    assert long.bytes_per_sequence("auto")["full_attention"] == 16 * short.bytes_per_sequence("auto")["full_attention"]


def test_attention_light_hybrid_nemotron_h_8b() -> None:
    mm = build(CONFIGS / "nemotron-h-8b.json", ["auto", "fp8"], 8192)
    assert (mm.model.count("mamba2"), mm.model.count("full_attention"), mm.model.count("mlp")) == (24, 4, 24)
    conv = 3 * (128 * 64 + 2 * 8 * 128) * 2  # (conv_kernel - 1) x conv_dim x bf16
    ssm = 128 * 64 * 128 * 4  # heads x head_dim x state x float32 (NemotronH's default)
    state = conv + ssm
    assert mm.plans["auto"].state_page_bytes == {"mamba2": state} and state == 4_255_744
    per_token = {"auto": 8 * 256 * 2, "fp8": 8 * 256}  # one attention layer
    for dtype in ("auto", "fp8"):
        p = mm.plans[dtype]
        block = 128 * cdiv(state, 128 * per_token[dtype])  # smallest 128-multiple whose page covers the state
        assert p.attention_block_size == block == {"auto": 1152, "fp8": 2176}[dtype]
        assert p.state_page_padded == block * per_token[dtype]
        # 4 attention layers set the group size: 1 attention group + 6 Mamba groups of 4 layers.
        num_blocks = GIB // (4 * block * per_token[dtype])
        per_request = cdiv(8192, block) + 6 * 3  # Mamba2 in align mode: 2 + 1 prefill checkpoint
        assert p.kv_cache_tokens == tokens(num_blocks, per_request, 8192)
    assert mm.ratio("fp8") == pytest.approx((60 / 22) / (56 / 26), rel=1e-4)  # 1.27x, not 2x
    assert mm.state_share() > 0.69
    assert mm.conclusion().startswith("Mamba2 state is 69% of each sequence's bytes at 8,192 tokens: fp8 changes")


def test_gated_delta_net_qwen3_next() -> None:
    mm = build(CONFIGS / "qwen3-next-80b-a3b.json", ["auto", "fp8"], 8192)
    assert (mm.model.count("gdn"), mm.model.count("full_attention"), mm.model.count("moe")) == (36, 12, 48)
    conv = 3 * (2 * 16 * 128 + 32 * 128) * 2
    ssm = 32 * 128 * 128 * 2  # SSM state at the model dtype: Qwen3-Next has no float32 default
    assert mm.plans["auto"].state_page_bytes == {"gdn": conv + ssm}
    per_token = {"auto": 2 * 512 * 2, "fp8": 2 * 512}
    expected = {}
    for dtype in ("auto", "fp8"):
        block = 128 * cdiv(conv + ssm, 128 * per_token[dtype])
        num_blocks = GIB // (12 * block * per_token[dtype])  # 4 groups of 12 layers
        per_request = cdiv(8192, block) + 3 * 2  # GDN in align mode: 2 blocks, no checkpoint
        expected[dtype] = tokens(num_blocks, per_request, 8192)
        assert mm.plans[dtype].kv_cache_tokens == expected[dtype]
    assert mm.ratio("fp8") == pytest.approx(expected["fp8"] / expected["auto"])
    assert 1.3 < mm.ratio("fp8") < 1.6


def test_mamba1_hybrid_jamba() -> None:
    mm = build(CONFIGS / "jamba-v0.1.json", ["auto", "fp8"], 8192)
    assert (mm.model.count("mamba1"), mm.model.count("full_attention")) == (28, 4)
    assert mm.model.no_kv == {"mlp": 16, "moe": 16}
    state = 3 * 8192 * 2 + 8192 * 16 * 2  # conv (3, 2 x 4096) + SSM (8192, 16), bf16
    p = mm.plans["auto"]
    assert p.state_page_bytes == {"mamba1": state}
    assert p.attention_block_size == 128  # one 128-token attention page (512 KiB) already covers it
    assert p.state_page_padded == 128 * 4096
    assert p.kv_cache_tokens == tokens(GIB // (4 * 128 * 4096), 64 + 7 * 2, 8192)
    # fp8: 128 tokens x 2,048 B = 256 KiB no longer covers the 304 KiB state, so the block doubles to
    # 256 tokens: the page (and the block count) stay put and only the attention blocks halve.
    fp8 = mm.plans["fp8"]
    assert fp8.attention_block_size == 256
    assert fp8.num_blocks == p.num_blocks
    assert fp8.kv_cache_tokens == tokens(GIB // (4 * 256 * 2048), 32 + 7 * 2, 8192)
    assert mm.ratio("fp8") == pytest.approx(78 / 46, rel=1e-4)


def test_mamba_ssm_dtype_changes_the_state_and_the_block_size() -> None:
    from kvprobe.memmap import Settings

    f32 = build(CONFIGS / "nemotron-h-8b.json", ["auto"], 8192).plans["auto"]
    bf16 = build(CONFIGS / "nemotron-h-8b.json", ["auto"], 8192,
                 Settings(mamba_ssm_cache_dtype="bfloat16")).plans["auto"]
    assert bf16.state_page_bytes["mamba2"] == 3 * 10240 * 2 + 128 * 64 * 128 * 2
    assert bf16.attention_block_size == 128 * cdiv(bf16.state_page_bytes["mamba2"], 128 * 4096) == 640
    assert bf16.kv_cache_tokens > f32.kv_cache_tokens
