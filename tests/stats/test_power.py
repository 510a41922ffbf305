"""The power figures (kvprobe.stats.power) for the test kvprobe runs: one-sided 2.5% against the bar."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from kvprobe.stats import power


def test_passes_and_fails_with_80_percent_power_around_the_bar() -> None:
    block = power.figures(16, "passages", 0.0027, 15, 0.01)
    k = (stats.t.ppf(0.975, 15) + stats.t.ppf(0.8, 15)) * 0.0027
    assert block["passes_at_most"] == pytest.approx(0.01 - k) and block["fails_at_least"] == pytest.approx(0.01 + k)
    assert block["alpha_one_sided"] == 0.025 and block["power"] == 0.8


def test_the_figures_mean_what_they_say_under_the_checks_rule() -> None:
    """A true loss at passes_at_most passes 80% of the time; at fails_at_least fails 80% (normal, se known)."""
    se, bar = 0.01, 0.05
    block = power.figures(1000, "units", se, None, bar)
    z = stats.norm.ppf(0.975)
    p_pass = stats.norm.cdf((bar - block["passes_at_most"]) / se - z)
    p_fail = stats.norm.cdf((block["fails_at_least"] - bar) / se - z)
    assert p_pass == pytest.approx(0.8, abs=1e-6) and p_fail == pytest.approx(0.8, abs=1e-6)


def test_needed_is_a_design_figure_for_the_whole_family() -> None:
    block = power.figures(16, "passages", 0.004, 15, 0.01)
    one = power.needed(block, 0.01, family=1, sd_df=15)
    twenty = power.needed(block, 0.01, family=20, sd_df=15)
    sd = 0.004 * 4
    z_size = ((1.96 + 0.8416) * sd / 0.01) ** 2  # 20.1; t at ~20 units asks for a few more
    assert z_size <= one["needed"] <= 1.25 * z_size
    # every one of 20 checks must pass: each needs power 0.8^(1/20), about 2.3x the size
    assert 2.0 < twenty["needed"] / one["needed"] < 2.6
    lo, hi = one["range"]
    assert lo < one["needed"] < hi  # the spread itself is uncertain at 15 df
    assert "with its 19 other gating checks" in power.advice(twenty | {"unit": "passages"})


def test_a_zero_bar_has_no_size() -> None:
    block = power.figures(40, "needles", 0.045, None, 0.0)
    sized = power.needed(block, 0.0, family=1)
    assert sized["needed"] is None and "can only fail or be inconclusive" in power.advice(block | sized)


def test_speed_is_sized_on_the_log_scale_with_t() -> None:
    se = 0.05
    block = power.figures(3, "runs", se, 4.0, -math.log(0.95))
    sized = power.needed(block, 0.05, family=1, log_margin=-math.log(0.95), sd_df=4.0, df_of=lambda m: 2 * m - 2)
    z_size = ((1.96 + 0.8416) * se * math.sqrt(3) / -math.log(0.95)) ** 2
    assert sized["needed"] >= z_size  # t at small sizes asks for more than z


def test_client_limited_advice() -> None:
    assert power.advice({"client_limited": True}) == "more runs do not help; a quieter client does"


def test_se_from_a_95_interval() -> None:
    assert math.isclose(power.se_from_interval(-0.0392, 0.0392), 0.02, rel_tol=1e-3)
    assert power.se_from_interval(float("-inf"), 1.0) is None


def test_paired_01_outcomes_are_sized_exactly_from_their_disagreement() -> None:
    from kvprobe.stats.paired_exact import equal_pass_probability

    assert [power.zero_loss_size(b) for b in (0.10, 0.05, 0.02)] == [36, 75, 191]  # ~ ln(0.025) / ln(1 - bar)
    block = power.figures(20, "needles", 0.082, None, 0.10)
    agreeing = power.needed(block, 0.10, family=1, disagreement=0.0)
    assert agreeing["needed"] == 36 and agreeing["method"] == "exact"  # 20 needles that all agree: 36 would pass
    disagreeing = power.needed(block, 0.10, family=1, disagreement=4 / 20)
    size = disagreeing["needed"]
    assert equal_pass_probability(size, 0.10, 0.2) >= 0.8 > equal_pass_probability(size - 1, 0.10, 0.2)
    # a bounded score on a range of 100 is sized at its bar over the range
    assert power.needed(block, 10.0, family=1, disagreement=0.0, span=100.0)["needed"] == 36


def test_rules4_sized_paired_01_outcomes_by_a_normal_approximation() -> None:
    """Kept for re-deriving rules/4 verdicts (answers_rules4): sd = sqrt(discordant share), floored."""
    block = power.figures(20, "needles", 0.082, None, 0.10)
    assert power.needed(block, 0.10, family=1, sd_unit=0.0, floor=35)["needed"] == 35
    assert power.needed(block, 0.10, family=1, sd_unit=(4 / 20) ** 0.5, floor=35)["needed"] > 35


def test_binary_figures_are_exact_for_a_candidate_that_only_loses() -> None:
    from scipy.stats import binom

    block = power.binary_figures(40, 0.10)
    # 0 lost of 40 passes 0.10, 1 lost does not: P(pass) = P(no loss) = (1 - L)^40 = 0.8 at passes_at_most
    assert (1 - block["passes_at_most"]) ** 40 == pytest.approx(0.8)
    assert block["fails_at_least"] > 0.10
    assert power.binary_figures(20, 0.10)["passes_at_most"] is None  # 20 pairs cannot pass 0.10 at all
    big = power.binary_figures(1000, 0.05)
    assert 0.0 < big["passes_at_most"] < 0.05 < big["fails_at_least"] < 0.1
    assert binom.cdf(0, 40, block["passes_at_most"]) == pytest.approx(0.8)


def test_fails_at_least_follows_the_fail_side_the_check_runs() -> None:
    """At 63 pairs Tango's lower end alone fails on fewer lost pairs than the exact test at the bar allows:
    the figure moves up with the rule, and means what it says under it (P(fail) = 0.8 there)."""
    from kvprobe.stats.paired_exact import fail_probability

    exact, tango = power.binary_figures(63, 0.10), power.binary_figures(63, 0.10, exact_fail=False)
    assert exact["fails_at_least"] > tango["fails_at_least"]
    assert fail_probability(63, 0.10, exact["fails_at_least"], 0.0) == pytest.approx(0.8, abs=1e-6)
    assert fail_probability(63, 0.10, tango["fails_at_least"], 0.0, tango_only=True) == pytest.approx(0.8, abs=1e-6)
