"""How config.json spellings map to layer kinds, and the models memmap refuses rather than guesses."""

from __future__ import annotations

import pytest

from kvprobe.errors import ConfigError
from kvprobe.memmap import build, model_shape

LLAMA_LIKE = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 2, "torch_dtype": "bfloat16", "max_position_embeddings": 4096}


def kinds(cfg: dict) -> list[str]:
    return [layer.kind for layer in model_shape(cfg).layers]


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    (layer, *_) = model_shape(LLAMA_LIKE).layers
    assert (layer.num_kv_heads, layer.head_dim) == (2, 128)


def test_mistral_style_window_slides_every_layer() -> None:
    # Mistral-7B-v0.1: 32 layers, 8 KV heads of 128, sliding_window 4096 on every layer.
    cfg = {**LLAMA_LIKE, "model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096}
    assert set(kinds(cfg)) == {"sliding_window"}
    window, short, long = (build(cfg, ["auto"], n).plans["auto"] for n in (4096, 8192, 32768))
    # Up to the window every token is held: cdiv(4096, 128) + 1 edge block.
    assert window.blocks_per_request == 33
    # Beyond it, blocks per request stop at cdiv(4095 + 2048 in flight, 128) + 1 = 49: capacity grows with L.
    assert short.blocks_per_request == 49 == long.blocks_per_request
    assert long.max_concurrency == short.max_concurrency
    assert long.kv_cache_tokens == pytest.approx(4 * short.kv_cache_tokens, abs=4)  # int() of each


def test_qwen2_window_only_above_max_window_layers_and_only_when_enabled() -> None:
    cfg = {**LLAMA_LIKE, "model_type": "qwen2", "sliding_window": 1024, "max_window_layers": 6}
    assert set(kinds({**cfg, "use_sliding_window": False})) == {"full_attention"}
    assert kinds({**cfg, "use_sliding_window": True}) == ["full_attention"] * 6 + ["sliding_window"] * 2


def test_gemma2_alternates_starting_with_a_sliding_layer() -> None:
    cfg = {**LLAMA_LIKE, "model_type": "gemma2", "sliding_window": 4096, "head_dim": 256}
    assert kinds(cfg)[:4] == ["sliding_window", "full_attention", "sliding_window", "full_attention"]


def test_layer_types_win_and_linear_attention_is_gdn() -> None:
    cfg = {**LLAMA_LIKE, "model_type": "qwen3_5_text", "num_hidden_layers": 4,
           "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 16,
           "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
           "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32"}
    shape = model_shape(cfg)
    assert [la.kind for la in shape.layers] == ["gdn", "gdn", "gdn", "full_attention"]
    assert shape.ssm_dtype_default == "float32"  # Qwen3.5 takes it from its config


def test_granite_hybrid_mamba_layer_types() -> None:
    cfg = {**LLAMA_LIKE, "model_type": "granitemoehybrid", "num_hidden_layers": 4,
           "layer_types": ["mamba", "mamba", "mamba", "attention"], "mamba_n_heads": 64, "mamba_d_head": 64,
           "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_n_groups": 1}
    assert kinds(cfg) == ["mamba2", "mamba2", "mamba2", "full_attention"]


def test_attention_free_mamba_holds_one_state_and_ignores_kv_dtype() -> None:
    # state-spaces/mamba-130m-hf: 24 layers, hidden 768, intermediate 1536, state 16, conv 4.
    cfg = {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "intermediate_size": 1536,
           "state_size": 16, "conv_kernel": 4, "torch_dtype": "float32"}
    mm = build(cfg, ["auto", "fp8"], 2048)
    state = 3 * 1536 * 2 + 1536 * 16 * 2  # the float32 config is served in 16 bits by dtype=auto
    plan = mm.plans["auto"]
    assert plan.state_page_bytes == {"mamba1": state}
    # Attention-free: prefix caching is off in vLLM, so one state block per request (mode "none").
    assert plan.blocks_per_request == 1
    assert plan.kv_cache_tokens == (1 << 30) // (24 * state) * 2048
    assert mm.ratio("fp8") == 1.0
    assert "float32" in " ".join(mm.model.notes)


@pytest.mark.parametrize(("cfg", "message"), [
    ({**LLAMA_LIKE, "model_type": "falcon_h1"}, "Falcon-H1 runs attention and Mamba in the same layer"),
    ({**LLAMA_LIKE, "layer_types": ["chunked_attention"] * 8}, "layer_types has chunked_attention"),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*X"}, "layer type(s) X in the NemotronH pattern"),
    ({**LLAMA_LIKE, "torch_dtype": "int8"}, "dtype 'int8' is not one memmap can size"),
    ({**LLAMA_LIKE, "num_hidden_layers": "eight"}, "num_hidden_layers = 'eight' is not a whole number"),
    ({**LLAMA_LIKE, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "sliding_window": 128},
     "sliding-window MLA is not modelled"),
])
def test_refused_with_one_line(cfg: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_shape(cfg)
    assert len(err.value.problems) == 1
    assert message in err.value.problems[0]
