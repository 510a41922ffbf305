"""Small statistics the checks share: percentiles, intervals, the bar rule.

Numbers carry their uncertainty: a delta is reported with a 95% interval, and a bar is passed only
when the whole interval is on the right side of it (a one-sided test at 2.5% against the bar). The
interval fits the data: Tango's score interval for paired 0/1 outcomes (needles, task documents,
answers cut at the cap) and, on the losses' mass, for bounded task scores; Student's t over units for
a ratio of sums (perplexity, agreement) or a mean difference; Welch's t on log values for runs of two
servers. The percentile bootstrap is kept for rules/2 verdicts (kvprobe.verdict.sealed.rules_v2) only: on paired
0/1 outcomes with no lost pair it gives an upper end of exactly 0, which passes any bar at any sample size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
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
    """An estimate and its 95% interval; `se` and `df` when the interval is a t (or z) interval,
    which the power figures (kvprobe.stats.power) reuse."""

    estimate: float
    lo: float
    hi: float
    se: float | None = None
    df: float | None = None

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
    is a fair coin, so the count of reference-only successes is Binomial(discordant, 1/2), symmetric:
    twice the smaller tail (exact integers, the same on every machine)."""
    n = ref_only + cand_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(ref_only, cand_only) + 1))
    return min(1.0, 2 * tail / 2**n)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float | None) -> float:
    """Student's t quantile; the normal one for df None or infinite (cached: checks ask for the same few)."""
    if df is None or not math.isfinite(df):
        return NormalDist().inv_cdf(p)
    from scipy import stats as st

    return float(st.t.ppf(p, df))


def _tango_statistic(n: int, lost: int, gained: int, d: float) -> float:
    """Tango's score statistic for H0: drop = d, where drop = (lost - gained) / n is the difference of
    two paired proportions (reference minus candidate). The nuisance (the gained-pair probability) is
    its maximum likelihood estimate under H0, in closed form (Tango 1998, eq. 4)."""
    a = 2.0 * n
    b = -lost - gained + (2.0 * n - lost + gained) * d
    c = -gained * d * (1.0 - d)
    q = (math.sqrt(max(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    num = lost - gained - n * d
    var = n * (2.0 * q + d * (1.0 - d))
    if var <= 0.0:
        return math.copysign(math.inf, num) if num else 0.0
    return num / math.sqrt(var)


def paired_binary_interval(n: int, lost: int, gained: int, level: float = 0.95) -> Interval:
    """The drop (lost - gained) / n of paired 0/1 outcomes over n pairs with Tango's score interval.

    `lost`: pairs the reference got right and the candidate wrong; `gained`: the reverse. Unlike the
    percentile bootstrap it stays honest with no lost pair: 0 lost of 40 gives [-0.088, +0.088], so
    a 0.10 bar passes and a 0.05 bar cannot (that needs about ln(0.025) / ln(1 - 0.05) = 72 pairs).
    At a true drop exactly at the bar it passes at most 2.5% of the time when the candidate mostly
    loses or gains few pairs (tests/test_binary_bars.py); where most pairs disagree both ways, up to
    about 2.9% at 40 pairs, the score test's known slight liberality. Its lower end alone fails a
    candidate at the bar up to 4.8% of the time: the checks fail only where the exact test agrees
    (kvprobe.stats.paired_exact.paired_drop_interval)."""
    if n < 1 or lost < 0 or gained < 0 or lost + gained > n:
        raise ValueError(f"paired counts need n >= 1 and 0 <= lost + gained <= n (n={n}, lost={lost}, "
                         f"gained={gained})")
    return _tango_interval(n, lost, gained, level)


@functools.lru_cache(maxsize=8192)
def _tango_interval(n: int, lost: float, gained: float, level: float) -> Interval:
    """Tango's score interval for (lost - gained) / n; counts may be fractional (bounded_paired_interval).
    Cached (an Interval is frozen): the power figures and the simulations ask for the same counts many times."""
    z = t_quantile(0.5 + level / 2, None)

    def root(target: float) -> float:
        from scipy.optimize import brentq

        # The statistic falls as d rises; at the ends of (-1, 1) it may not cross `target` at all.
        lo, hi = -1.0 + 1e-12, 1.0 - 1e-12
        f_lo, f_hi = _tango_statistic(n, lost, gained, lo) - target, _tango_statistic(n, lost, gained, hi) - target
        if f_lo <= 0:
            return -1.0
        if f_hi >= 0:
            return 1.0
        return float(brentq(lambda d: _tango_statistic(n, lost, gained, d) - target, lo, hi, xtol=1e-13))

    estimate = (lost - gained) / n
    lower, upper = max(-1.0, root(z)), min(1.0, root(-z))
    se = (upper - lower) / (2 * z)
    return Interval(estimate, min(lower, estimate), max(upper, estimate), se=se, df=None)


def bounded_paired_interval(losses: Sequence[float], span: float, level: float = 0.95) -> Interval:
    """The mean of paired losses that lie in [-span, span] (a score bounded in a range of width `span`,
    reference minus candidate where larger is worse), with Tango's score interval on the losses' mass.

    Each loss, over `span`, splits into a lost part max(x, 0) and a gained part max(-x, 0); their sums
    are Tango's lost and gained counts, fractional. For 0/1 scores this is paired_binary_interval exactly.
    Why it stays honest for any score in the range: a loss x in [-1, 1] has x^2 <= |x|, so its variance
    is at most E|x| - (E x)^2, which is the variance Tango's statistic gives pairs that are lost or gained
    with those probabilities: the interval takes every document's difference as if it were a whole
    answer lost or gained, the widest a bounded score can spread. So with no document differing it is
    Tango's [-0.43, +0.43] at 5 documents and [-0.088, +0.088] at 40, where a t interval is [0, 0] and
    passes any bar; at a true loss on the bar it passes about as often as the 0/1 check, at most,
    (tests/verdict/checks/test_answers.py simulates it). The price is width where the scores spread
    little: a t interval would be narrower, and wrong at the few-differences end."""
    xs = [float(x) for x in losses]
    if not xs or span <= 0 or any(abs(x) > span * (1 + 1e-12) for x in xs):
        raise ValueError(f"bounded_paired_interval needs losses within [-{span}, {span}]")
    lost = math.fsum(min(max(x / span, 0.0), 1.0) for x in xs)
    gained = math.fsum(min(max(-x / span, 0.0), 1.0) for x in xs)
    iv = _tango_interval(len(xs), lost, gained, level)
    return Interval(iv.estimate * span, iv.lo * span, iv.hi * span, se=None if iv.se is None else iv.se * span,
                    df=None)


def ratio_t_interval(num: Sequence[float], den: Sequence[float], *, level: float = 0.95,
                     extra_var: float = 0.0, extra_df: float | None = None) -> Interval:
    """R = sum(num) / sum(den) over units (passages) with a t interval: the delta-method standard
    error of a ratio of sums, n - 1 degrees of freedom. A percentile bootstrap over 4-16 units is
    too narrow (at 16 passages it passes a candidate at the bar up to 9% of the time, at 4 about
    10% per side); t widens honestly.

    `extra_var`: a variance component the units do not show (the platform's run-to-run noise),
    added with `extra_df` degrees of freedom (Welch-Satterthwaite). Exact sums (math.fsum): the
    same numbers give the same bits on every CPU, which `kvprobe verify` relies on."""
    x, w = [float(v) for v in num], [float(v) for v in den]
    total = math.fsum(w)
    if len(x) != len(w) or not x or total <= 0:
        raise ValueError("ratio_t_interval needs two non-empty samples of the same length, positive total")
    n = len(x)
    r = math.fsum(x) / total
    if n < 2:
        return Interval(r, -math.inf, math.inf, se=None, df=0)
    mean_w = total / n
    var_units = math.fsum(((a - r * b) / mean_w) ** 2 for a, b in zip(x, w, strict=True)) / (n * (n - 1))
    var = var_units + extra_var
    if var == 0.0:
        return Interval(r, r, r, se=0.0, df=n - 1)
    df: float = n - 1
    if extra_var > 0:
        parts = var_units**2 / (n - 1) + (extra_var**2 / extra_df if extra_df else 0.0)
        df = var**2 / parts if parts > 0 else math.inf
    se = math.sqrt(var)
    half = t_quantile(0.5 + level / 2, df) * se
    return Interval(r, r - half, r + half, se=se, df=df)


def mean_t_interval(diffs: Sequence[float], *, level: float = 0.95) -> Interval:
    """The mean of paired differences with a t interval (n - 1 degrees of freedom)."""
    d = [float(v) for v in diffs]
    if not d:
        raise ValueError("mean_t_interval needs a non-empty sample")
    n = len(d)
    m = math.fsum(d) / n
    if n < 2:
        return Interval(m, -math.inf, math.inf, se=None, df=0)
    se = math.sqrt(math.fsum((v - m) ** 2 for v in d) / (n - 1) / n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    return Interval(m, m - half, m + half, se=se, df=n - 1)


def welch_log_ratio(ref: Sequence[float], cand: Sequence[float], *, level: float = 0.95) -> Interval:
    """The ratio of geometric means cand / ref of two servers' runs, with Welch's t interval on log values
    (`se` and `df` on the log scale). Exact sums, as ratio_t_interval."""
    x, y = [math.log(v) for v in ref], [math.log(v) for v in cand]
    if not x or not y:
        raise ValueError("welch_log_ratio needs two non-empty samples of positive numbers")
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    point = math.exp(my - mx)
    if min(len(x), len(y)) < 2:
        return Interval(point, -math.inf, math.inf, se=None, df=0)
    vx = math.fsum((v - mx) ** 2 for v in x) / (len(x) - 1) / len(x)
    vy = math.fsum((v - my) ** 2 for v in y) / (len(y) - 1) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0.0:
        return Interval(point, point, point, se=0.0, df=math.inf)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return Interval(point, math.exp(my - mx - half), math.exp(my - mx + half), se=se, df=df)
