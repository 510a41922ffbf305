from __future__ import annotations

import math

import numpy as np
import pytest

from kvprobe.stats import Interval, bar_outcome, percentiles, ratio_interval


def test_percentiles_on_known_values() -> None:
    out = percentiles(list(range(1, 101)))
    assert out["mean"] == 50.5 and out["p50"] == 50.5
    assert out["p99"] == pytest.approx(99.01)
    assert percentiles([])["p90"] is None


def test_ratio_interval_matches_welch_by_hand() -> None:
    ref, cand = [100.0, 110.0, 90.0], [80.0, 85.0, 75.0]
    iv = ratio_interval(ref, cand)
    x, y = np.log(ref), np.log(cand)
    vx, vy = x.var(ddof=1) / 3, y.var(ddof=1) / 3
    df = (vx + vy) ** 2 / (vx**2 / 2 + vy**2 / 2)
    from scipy.stats import t

    half = t.ppf(0.975, df) * math.sqrt(vx + vy)
    assert iv.estimate == pytest.approx(math.exp(y.mean() - x.mean()))
    assert iv.lo == pytest.approx(math.exp(y.mean() - x.mean() - half))
    assert iv.hi == pytest.approx(math.exp(y.mean() - x.mean() + half))


def test_two_noisy_runs_each_cannot_fail_a_speed_bar() -> None:
    # ±15% run-to-run noise, two runs each: far too little to claim a 5% drop either way.
    iv = ratio_interval([100.0, 130.0], [95.0, 120.0])
    loss = Interval(1 - iv.estimate, 1 - iv.hi, 1 - iv.lo)
    assert bar_outcome(loss, 0.05) == "inconclusive"
    assert iv.lo < 1 < iv.hi


def test_one_run_each_has_no_interval_and_identical_runs_no_width() -> None:
    iv = ratio_interval([100.0], [50.0])
    assert iv.estimate == pytest.approx(0.5) and iv.lo == -math.inf and iv.hi == math.inf
    same = ratio_interval([100.0, 100.0], [50.0, 50.0])
    assert same.lo == same.hi == same.estimate == pytest.approx(0.5)


def test_ratio_interval_refuses_non_positive_values() -> None:
    with pytest.raises(ValueError):
        ratio_interval([0.0, 1.0], [1.0, 1.0])


def test_bar_outcome_boundaries() -> None:
    assert bar_outcome(Interval(0.0, -0.01, 0.01), 0.01) == "pass"  # upper end exactly at the bar
    assert bar_outcome(Interval(0.02, 0.0101, 0.03), 0.01) == "fail"
    assert bar_outcome(Interval(0.01, 0.01, 0.03), 0.01) == "inconclusive"  # lower end at the bar


# -- paired 0/1 outcomes: Tango's score interval --------------------------------------------------

def test_no_lost_pair_gives_an_honest_upper_end_not_zero() -> None:
    from kvprobe.stats import paired_binary_interval

    iv = paired_binary_interval(40, 0, 0)
    # rules/2's bootstrap said [0.00, 0.00] here, and passed any bar >= 0
    assert iv.estimate == 0.0 and iv.hi == pytest.approx(0.0876, abs=1e-4) and iv.lo == pytest.approx(-iv.hi)
    # the exact one-sided bound for zero losses is 1 - 0.025^(1/n); the score interval sits just under it
    assert iv.hi < 1 - 0.025 ** (1 / 40) < 0.10
    assert paired_binary_interval(20, 0, 0).hi > 0.10  # 20 matching needles cannot show a 0.10 margin


def test_tango_matches_published_values() -> None:
    from kvprobe.stats import paired_binary_interval

    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8, as their R
    # package contingencytables tests it: Cavo et al. (2012), n12 = 6, n21 = 16 of 161 pairs ->
    # estimate -0.0621, Tango 95% CI -0.1240 to -0.0054
    iv = paired_binary_interval(161, 6, 16)
    assert iv.estimate == pytest.approx(-0.0621, abs=5e-5)
    assert iv.lo == pytest.approx(-0.1240, abs=5e-5) and iv.hi == pytest.approx(-0.0054, abs=5e-5)


def test_a_collapsed_candidate_is_far_past_any_margin() -> None:
    from kvprobe.stats import paired_binary_interval

    iv = paired_binary_interval(40, 36, 0)
    assert iv.lo > 0.7 and iv.hi <= 1.0
    assert paired_binary_interval(40, 40, 0).hi == 1.0 and paired_binary_interval(40, 0, 40).lo == -1.0
    with pytest.raises(ValueError):
        paired_binary_interval(10, 6, 6)


# -- t intervals over passages and paired differences ----------------------------------------------

def test_ratio_t_interval_is_the_delta_method_with_n_minus_1_df() -> None:
    from scipy.stats import t

    from kvprobe.stats import ratio_t_interval

    num, den = [1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 10.0, 10.0]
    iv = ratio_t_interval(num, den)
    # equal weights: the ratio is a mean of num/den, its se the usual one
    ratios = np.asarray(num) / 10
    se = ratios.std(ddof=1) / 2
    assert iv.estimate == pytest.approx(0.25) and iv.se == pytest.approx(se) and iv.df == 3
    assert iv.hi == pytest.approx(0.25 + t.ppf(0.975, 3) * se)


def test_run_to_run_noise_widens_the_interval_and_takes_its_few_degrees_of_freedom() -> None:
    from kvprobe.stats import ratio_t_interval

    num, den = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98], [100.0] * 8
    quiet = ratio_t_interval(num, den)
    noisy = ratio_t_interval(num, den, extra_var=quiet.se**2, extra_df=1)
    assert noisy.se == pytest.approx(quiet.se * math.sqrt(2))
    # wider than the larger se alone: the noise's one degree of freedom also raises the t quantile
    assert noisy.df < quiet.df and (noisy.hi - noisy.lo) > math.sqrt(2) * (quiet.hi - quiet.lo) * 1.1


def test_mean_t_interval_and_welch_log_ratio() -> None:
    from kvprobe.stats import mean_t_interval, welch_log_ratio

    iv = mean_t_interval([0.1, 0.2, 0.15])
    assert iv.estimate == pytest.approx(0.15) and iv.df == 2
    assert mean_t_interval([0.3]).hi == math.inf
    w, r = welch_log_ratio([100.0, 110.0, 90.0], [80.0, 85.0, 75.0]), ratio_interval([100.0, 110.0, 90.0],
                                                                                     [80.0, 85.0, 75.0])
    assert (w.estimate, w.lo, w.hi) == pytest.approx((r.estimate, r.lo, r.hi))
