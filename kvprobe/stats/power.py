"""What a check's result is worth, for the test kvprobe actually runs.

A bar B is passed when the whole 95% interval of the loss is at or under B and failed when it is
wholly over it: two one-sided tests at 2.5% against the bar, not against 0. With the interval's
standard error se and its degrees of freedom, at power 0.8:

- passes_at_most: B - (t_0.975 + t_0.8) x se. A true loss this small (or smaller) is passed 80% of
  the time at this run's size and spread. Negative: even a candidate equal to the reference is
  likely not to pass: the run is too small for the bar;
- fails_at_least: B + (t_0.975 + t_0.8) x se. A true loss this large is failed 80% of the time;
- needed (inconclusive checks only): a design figure, not "observed power": the size (passages,
  needles, documents, runs) at which a candidate truly equal to the reference would pass every
  gating check of its family together with power 0.8 (each at 0.8^(1/k) for k gating checks), at
  the measured spread, with t for small sizes, and the range that figure spans over the spread's
  own 95% interval when the spread comes from few units. Speed is sized on the log scale, where its
  interval is built. Paired 0/1 outcomes are sized exactly, not by a normal approximation: the fewest
  pairs at which a candidate that disagrees with the reference on the share of pairs this run saw, half
  each way, passes Tango's interval with that power, summed over every (lost, gained)
  (kvprobe.stats.paired_exact.equal_size). The approximation with sd = sqrt(discordant share) named 38
  and 73 pairs where 76 and 105 are needed (at 2.5% and 5% disagreeing, six gating checks); at its
  sizes an equal candidate passed 0.64 and 0.83 of the time, not 0.963. A bar of 0 has no such size:
  non-inferiority with a zero margin can only fail or be inconclusive.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

ALPHA = 0.025  # one-sided, against the bar: the 95% two-sided interval's end
POWER = 0.8
MAX_NEEDED = 10_000_000


def _t(p: float, df: float | None) -> float:
    from kvprobe.stats import t_quantile

    return t_quantile(p, df)


def se_from_interval(lo: float, hi: float, df: float | None = None) -> float | None:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return None
    return (hi - lo) / (2 * _t(1 - ALPHA, df))


def figures(n: int, unit: str, se: float | None, df: float | None, bar: float | None) -> dict[str, Any]:
    """The power block of one check (loss units: larger is worse), as verdict.json and reports carry it."""
    out: dict[str, Any] = {"n": n, "unit": unit, "alpha_one_sided": ALPHA, "power": POWER, "se": se, "df": df,
                           "passes_at_most": None, "fails_at_least": None, "needed": None}
    if se is None or bar is None or not math.isfinite(se):
        return out
    k = (_t(1 - ALPHA, df) + _t(POWER, df)) * se
    out["passes_at_most"] = bar - k
    out["fails_at_least"] = bar + k
    return out


def binary_figures(n: int, bar: float | None, *, exact_fail: bool = True) -> dict[str, Any]:
    """passes_at_most / fails_at_least for n paired 0/1 outcomes judged by Tango's interval, exactly: for
    a candidate that only loses answers (the way a broken KV format fails), with a true loss L each pair
    is lost with probability L, and the check passes when the lost count keeps the interval's upper end
    within the bar (fails when its lower end clears it and, with `exact_fail`, the exact test at the bar
    agrees: kvprobe.stats.paired_exact; rules/4 failed on Tango's lower end alone). A normal approximation
    with the interval's own width would say even 40 matching needles cannot pass a 0.10 bar at power 0.8;
    they pass every time."""
    return dict(_binary_figures(n, bar, exact_fail))  # a copy: callers add to it


@functools.lru_cache(maxsize=1024)
def _binary_figures(n: int, bar: float | None, exact_fail: bool) -> dict[str, Any]:
    from scipy import stats as st
    from scipy.optimize import brentq

    from kvprobe.stats import paired_binary_interval
    from kvprobe.stats.paired_exact import fails

    out: dict[str, Any] = {"passes_at_most": None, "fails_at_least": None, "model": "the candidate only loses answers"}
    if bar is None or n < 1:
        return out

    def largest(ok: Any) -> int:
        """The largest lost count k in [-1, n] with ok(k) (ok holds for a prefix of 0..n)."""
        lo, hi = -1, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    pass_k = largest(lambda k: paired_binary_interval(n, k, 0).hi <= bar)
    fail_k = largest(lambda k: not paired_binary_interval(n, k, 0).lo > bar) + 1  # the fewest lost that fail
    if exact_fail:
        # The exact test only ever withholds a fail Tango would give, and rejects for more lost pairs once
        # it rejects for some (its tail shrinks as the lost count grows): count up from Tango's boundary.
        while fail_k <= n and not fails(n, fail_k, 0, bar):
            fail_k += 1
    if pass_k >= 0:
        p_pass = lambda q: float(st.binom.cdf(pass_k, n, q)) - POWER  # noqa: E731
        out["passes_at_most"] = 1.0 if p_pass(1.0) >= 0 else float(brentq(p_pass, 0.0, 1.0, xtol=1e-10))
    if fail_k <= n:
        p_fail = lambda q: float(st.binom.sf(fail_k - 1, n, q)) - POWER  # noqa: E731
        out["fails_at_least"] = 0.0 if p_fail(0.0) >= 0 else float(brentq(p_fail, 0.0, 1.0, xtol=1e-10))
    return out


def _size_for(sd_unit: float, margin: float, power: float, df_of: Any) -> int | None:
    """The smallest m with (t_(1-alpha) + t_power) x sd_unit / sqrt(m) <= margin."""
    if margin <= 0 or sd_unit <= 0:
        return None if margin <= 0 else 1
    z = _t(1 - ALPHA, None) + _t(power, None)
    m = max(2, math.ceil((z * sd_unit / margin) ** 2))
    if m > MAX_NEEDED:
        return None
    while m < 1_000 and (_t(1 - ALPHA, df_of(m)) + _t(power, df_of(m))) * sd_unit / math.sqrt(m) > margin:
        m += 1
    return m


def zero_loss_size(bar: float, *, tango: bool = False) -> int | None:
    """The fewest pairs of 0/1 outcomes, none lost, that pass `bar` (kvprobe.stats.paired_exact.passes: about
    ln(0.025) / ln(1 - bar); 36 for 0.10). `tango`: by Tango's interval alone, as rules/4 judged (35 for
    0.10, 72 for 0.05, 183 for 0.02)."""
    from kvprobe.stats import paired_binary_interval
    from kvprobe.stats.paired_exact import passes

    if bar <= 0:
        return None
    m = max(1, math.floor(math.log(0.025) / math.log1p(-bar)) - 2) if bar < 1 else 1
    while paired_binary_interval(m, 0, 0).hi > bar or not (tango or passes(m, np.zeros(1), np.zeros(1), bar)[0]):
        m += 1
        if m > MAX_NEEDED:
            return None
    return m


def needed(block: dict[str, Any], bar: float | None, family: int, *, log_margin: float | None = None,
           sd_df: float | None = None, df_of: Any = None, sd_unit: float | None = None,
           floor: int | None = None, disagreement: float | None = None, span: float = 1.0) -> dict[str, Any] | None:
    """`needed` for an inconclusive check: the size at which a candidate equal to the reference passes
    all `family` gating checks with power 0.8, and its range over the spread's uncertainty.

    `log_margin`: the bar on the log scale (speed: -ln(1 - drop bar), ln(1 + rise bar)), with se on
    that scale; `sd_df`: the degrees of freedom of the spread estimate; `df_of(m)`: the interval's
    degrees of freedom at size m (default m - 1). `disagreement`: paired outcomes judged by Tango's
    interval (0/1, or bounded scores on their losses' mass), sized exactly at that share of pairs
    disagreeing, half each way (paired_exact.equal_size); `span`: a bounded score's range, which the bar is
    divided by (the 0/1 case is the widest a bounded score can spread, so its size is enough). rules/4's
    0/1 checks gave `sd_unit` (the square root of the share of pairs that disagree) and `floor` (the
    pairs a pass needs even when none disagrees, zero_loss_size) to a normal approximation instead."""
    se, n = block.get("se"), block.get("n") or 0
    margin = log_margin if log_margin is not None else bar
    if se is None or margin is None or n < 1 or not math.isfinite(se):
        return None
    if margin <= 0:
        return {"needed": None, "why": "a bar of 0 can only fail or be inconclusive"}
    power = POWER ** (1 / max(family, 1))
    if disagreement is not None:
        from kvprobe.stats.paired_exact import MAX_PAIRS, equal_size

        size = equal_size(margin / span, disagreement, power)
        out = {"needed": size, "family": family, "power_each": power, "disagreement": disagreement,
               "method": "exact"}
        if size is None:
            out["why"] = (f"no practical run settles it: over {MAX_PAIRS:,} {block.get('unit', 'pairs')} would "
                          f"be needed at {disagreement:.1%} of them disagreeing")
        return out
    sd_unit = se * math.sqrt(n) if sd_unit is None else sd_unit
    df_of = df_of or (lambda m: m - 1)
    size = _size_for(sd_unit, margin, power, df_of) if sd_unit > 0 else floor
    if size is not None and floor is not None:
        size = max(size, floor)
    out: dict[str, Any] = {"needed": size, "family": family, "power_each": power}
    if size is None:
        out["why"] = f"over {MAX_NEEDED:,} at this spread"
        return out
    if sd_df is not None and math.isfinite(sd_df) and sd_df >= 1:
        from scipy import stats as st

        lo = _size_for(sd_unit * math.sqrt(sd_df / st.chi2.ppf(0.975, sd_df)), margin, power, df_of)
        hi = _size_for(sd_unit * math.sqrt(sd_df / st.chi2.ppf(0.025, sd_df)), margin, power, df_of)
        out["range"] = [lo, hi]
    return out


def advice(block: dict[str, Any] | None) -> str:
    """One clause for an inconclusive check's text: what would settle it."""
    if not block:
        return ""
    if block.get("client_limited"):
        return "more runs do not help; a quieter client does"
    if block.get("why"):
        return block["why"]
    size = block.get("needed")
    if size is None:
        return ""
    unit = block.get("unit", "units")
    if size <= (block.get("n") or 0):
        return (f"at {block['n']:,} {unit} a candidate equal to the reference passes with power 0.8 (about {size:,} "
                "would do); the estimate itself holds this one back, and a larger run tells which it is")
    span = block.get("range")
    spread = ""
    if span and span[0] is not None and span[1] is not None and span[0] != span[1]:
        spread = f" ({span[0]:,}-{span[1]:,} over the spread's uncertainty)"
    together = f", with its {block['family'] - 1} other gating checks" if block.get("family", 1) > 1 else ""
    return (f"about {size:,} {unit}{spread} would let a candidate equal to the reference pass it{together}, "
            "with power 0.8")
