"""The power figures (kvprobe.power): TensorRT-LLM's detectable-effect formula on a paired se, and the
sample size that would settle an inconclusive bar."""

from __future__ import annotations

import math

from kvprobe import power


def test_detectable_effect_is_z_alpha_plus_z_power_times_se() -> None:
    block = power.figures(100, "documents", 0.01, 0.0, 0.05, "pass")
    assert math.isclose(block["detectable"], (1.6448536 + 0.8416212) * 0.01, rel_tol=1e-6)
    assert block["needed"] is None  # only an inconclusive bar asks for more


def test_the_trt_llm_form_agrees_for_an_unpaired_binary_metric() -> None:
    # accuracy_core.py: theta = (z_a + z_b) * sqrt(2 s^2 / n); here se = sqrt(2 s^2 / n) given directly.
    sigma, n = 50.0, 1319  # GSM8K's sample count, a percentage metric's worst-case sigma
    block = power.figures(n, "samples", math.sqrt(2 * sigma**2 / n), None, None, "pass")
    assert round(block["detectable"], 2) == 4.84


def test_needed_scales_with_the_square_of_spread_over_margin() -> None:
    # estimate 0.008 under a 0.01 bar, se 0.004: n * ((1.96 + 0.84) * 0.004 / 0.002)^2 = 16 * 31.4
    block = power.figures(16, "passages", 0.004, 0.008, 0.01, "inconclusive")
    assert block["needed"] == math.ceil(16 * ((1.959964 + 0.841621) * 0.004 / 0.002) ** 2)
    assert power.advice(block) == f"about {block['needed']:,} passages would settle it at this spread"


def test_an_estimate_on_the_bar_has_no_size_that_settles_it() -> None:
    block = power.figures(16, "passages", 0.004, 0.01, 0.01, "inconclusive")
    assert block["needed"] is None and "no sample size" in power.advice(block)


def test_binary_se_never_claims_certainty_from_matching_answers() -> None:
    assert power.binary_se(20, 0, 0) > 0.05  # 20 matching needles: a ~16-point loss is detectable, no less
    assert power.binary_se(200, 0, 0) < power.binary_se(20, 0, 0)
    assert power.binary_se(0, 0, 0) is None


def test_se_from_a_95_interval() -> None:
    assert math.isclose(power.se_from_interval(-0.0392, 0.0392), 0.02, rel_tol=1e-3)
    assert power.se_from_interval(float("-inf"), 1.0) is None
