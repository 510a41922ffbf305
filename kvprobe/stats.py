"""Small statistics every probe shares: percentiles, bootstrap intervals, the bar rule.

Numbers carry their uncertainty: a delta is reported with a 95% bootstrap interval, and a bar is
passed only when the whole interval is on the right side of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Outcome = Literal["pass", "fail", "inconclusive"]


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """{"mean", "p50", "p90", "p99"} with linear interpolation; None for an empty sample."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"mean": None, **{f"p{q:g}": None for q in qs}}
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for q, v in zip(qs, np.percentile(arr, qs), strict=True):
        out[f"p{q:g}"] = float(v)
    return out


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float

    def as_list(self) -> list[float]:
        return [self.lo, self.hi]


def paired_bootstrap(
    ref: Sequence[float],
    cand: Sequence[float],
    statistic: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap over paired units (documents, cases): the same resampled indices are used
    for reference and candidate, so shared difficulty cancels. `statistic(ref_rows, cand_rows)` gets
    2-D arrays (resamples x units) and returns one value per resample."""
    r, c = np.asarray(ref, dtype=float), np.asarray(cand, dtype=float)
    if r.shape != c.shape or r.ndim != 1 or r.size == 0:
        raise ValueError("paired_bootstrap needs two non-empty samples of the same length")
    point = float(statistic(r[None, :], c[None, :])[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, r.size, size=(resamples, r.size))
    stats = statistic(r[idx], c[idx])
    alpha = (1 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return Interval(point, float(lo), float(hi))


def loss_interval(ratio: Interval, loss_of: Callable[[float], float]) -> Interval:
    """A candidate/reference ratio's interval as a loss (a drop 1 - r, a rise r - 1), bounds in order."""
    a, b = loss_of(ratio.lo), loss_of(ratio.hi)
    return Interval(loss_of(ratio.estimate), min(a, b), max(a, b))


def ratio_interval(ref: Sequence[float], cand: Sequence[float], *, level: float = 0.95) -> Interval:
    """Interval for the ratio of geometric means cand / ref, from independent repeated runs (Welch's t
    on log values). Speed runs on a shared box vary by tens of percent and there are few of them: a
    bootstrap over 2-3 runs gives intervals far too narrow, while t with Welch's degrees of freedom
    widens honestly. One run on either side gives an infinite interval: no noise estimate."""
    from scipy import stats as st

    r, c = np.asarray(ref, dtype=float), np.asarray(cand, dtype=float)
    if r.size == 0 or c.size == 0 or min(r.min(), c.min()) <= 0:
        raise ValueError("ratio_interval needs two non-empty samples of positive numbers")
    x, y = np.log(r), np.log(c)
    point = float(np.exp(y.mean() - x.mean()))
    if min(x.size, y.size) < 2:
        return Interval(point, float("-inf"), float("inf"))
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = float(np.sqrt(vx + vy))
    if se == 0.0:
        return Interval(point, point, point)
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = float(st.t.ppf(0.5 + level / 2, df)) * se
    return Interval(point, float(np.exp(np.log(point) - half)), float(np.exp(np.log(point) + half)))


def log_ratio_se(ref: Sequence[float], cand: Sequence[float]) -> float | None:
    """The standard error of log(mean cand / mean ref) from independent runs (ratio_interval's), or
    None with fewer than 2 runs on a side."""
    r, c = np.log(np.asarray(ref, dtype=float)), np.log(np.asarray(cand, dtype=float))
    if min(r.size, c.size) < 2:
        return None
    return float(np.sqrt(r.var(ddof=1) / r.size + c.var(ddof=1) / c.size))


def bar_outcome(interval: Interval, bar: float, *, larger_is_worse: bool = True) -> Outcome:
    """Pass when the whole interval is on the good side of the bar (at or under it for a loss, at or
    over it for a quantity where smaller is worse), fail when the whole interval is past it,
    inconclusive when it straddles."""
    if not larger_is_worse:  # its negative is a loss (negation is exact in floating point)
        return bar_outcome(Interval(-interval.estimate, -interval.hi, -interval.lo), -bar)
    if interval.hi <= bar:
        return "pass"
    if interval.lo > bar:
        return "fail"
    return "inconclusive"


def mcnemar_p(ref_only: int, cand_only: int) -> float:
    """Exact two-sided McNemar p for paired 0/1 outcomes: under "no difference" each discordant pair
    is a fair coin, so the count of reference-only successes is Binomial(discordant, 1/2)."""
    from scipy import stats as st

    discordant = ref_only + cand_only
    if discordant == 0:
        return 1.0
    return float(st.binomtest(ref_only, discordant, 0.5).pvalue)
