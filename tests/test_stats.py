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
