"""Paired 0/1 outcomes decided exactly: how the bar is judged, and how often, by summing the trinomial over
every (lost, gained) count instead of trusting a normal approximation.

n pairs; each is lost (reference right, candidate wrong) with probability p_lost, gained with p_gained,
concordant otherwise; the drop is p_lost - p_gained. The checks judge a drop against a bar with:

- the pass side: Tango's score interval's upper end within the bar (kvprobe.stats.paired_binary_interval),
  the cells whose score statistic at the bar is at most -z, *and* the exact unconditional test of "drop >=
  bar" at the bar rejecting at 2.5% (the mirror of the fail side). Tango's upper end alone passed a
  candidate at a 0.10 bar up to 2.60% of the time (40 pairs, its worst nuisance); with the exact test the
  pass region is Tango's with its largest-statistic cells taken out until its worst tail over the
  nuisance is at most 2.5% (exact_pass_limits), so it holds 2.5% by construction;
- the fail side: Tango's lower end past the bar *and* the exact unconditional test of "drop <= bar" at the
  bar rejecting at 2.5% (Chan 1998: the outcomes ordered by Tango's statistic, the p-value the largest tail
  over the nuisance, the gained-pair probability, on the boundary p_lost = p_gained + bar). Tango's lower
  end alone fails a candidate exactly at the bar up to 4.8% of the time (63 pairs, few gained) where it
  should be 2.5%; the exact test holds 2.5% by construction. A conditional bound (Clopper-Pearson on the
  lost share of the discordant pairs) does not: converting it to the drop needs the discordant share,
  and taking the observed one as known fails 3.9% at 140 pairs, with no pair gained. Exact unconditional
  p-values are not monotone in the margin, so an exact lower limit is either conservative or ill defined;
  kvprobe decides at the bar, where the guarantee is needed, and holds the reported lower end at the bar
  when Tango's clears it and the exact test does not (paired_drop_interval).

Figures from these regions (tests/stats/test_paired_exact.py holds them): a candidate equal to the
reference, with a share d of pairs flipping at random (half each way), passes a 0.10 bar with probability
0.963 (one of six gating checks at 0.8 together) from 85 pairs at d = 2.5% and 111 at d = 5% (Tango's pass
side alone: 76 and 105).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy.special import gammaln, xlogy

from kvprobe.stats import Interval, disk_cache, paired_binary_interval, t_quantile

ALPHA = 0.025  # one-sided, each side of the bar
Z = t_quantile(1 - ALPHA, None)
# Values of the gained-pair probability the exact test takes its supremum over: a grid, so the largest tail
# between two of them can sit a little over. With 257 values a candidate at a 0.10 bar failed 2.50071% of the
# time at 56 pairs; with 1025, at most 2.49988% over 20-200 pairs (evaluated on 3,601 values).
NUISANCE_GRID = 1025
LINEAR_UP_TO = 500  # `equal_size` tries every n up to this, then bisects
MAX_PAIRS = 20_000  # `equal_size` looks no further: a run this large is no run an operator will make


def tango_statistic(n: int, lost: np.ndarray, gained: np.ndarray, d: float) -> np.ndarray:
    """kvprobe.stats._tango_statistic over arrays of counts: the same operations in the same order, so the
    same bits, for every cell at once."""
    lost, gained = np.asarray(lost, dtype=float), np.asarray(gained, dtype=float)
    a = 2.0 * n
    b = -lost - gained + (2.0 * n - lost + gained) * d
    c = -gained * d * (1.0 - d)
    q = (np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    num = lost - gained - n * d
    var = n * (2.0 * q + d * (1.0 - d))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = num / np.sqrt(var)
    return np.where(var > 0, t, np.where(num > 0, np.inf, np.where(num < 0, -np.inf, 0.0)))


def _log_coefficient(n: int, lost: np.ndarray, gained: np.ndarray) -> np.ndarray:
    """log of n! / (lost! gained! rest!): the part of _log_trinomial no probability changes."""
    return gammaln(n + 1.0) - gammaln(lost + 1.0) - gammaln(gained + 1.0) - gammaln(n - lost - gained + 1.0)


def _log_trinomial(n: int, lost: np.ndarray, gained: np.ndarray, p_lost: float, p_gained: float,
                   coefficient: np.ndarray | None = None) -> np.ndarray:
    """log P(lost, gained) for n pairs; cells a zero probability rules out are -inf. `coefficient`: the cells'
    _log_coefficient when the caller already has it (the same bits: it is the same expression)."""
    rest = n - lost - gained
    out = _log_coefficient(n, lost, gained) if coefficient is None else coefficient
    for count, p in ((lost, p_lost), (gained, p_gained), (rest, 1.0 - p_lost - p_gained)):
        # a zero probability (or a rounding residue under it) rules out every cell that needs one
        out = out + count * math.log(p) if p > 0 else np.where(count > 0, -np.inf, out)
    return out


def _cells(n: int, lost_max: int | None = None, gained_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every (lost, gained) with lost + gained <= n, lost <= lost_max and gained <= gained_max, flat."""
    top_l = n if lost_max is None else min(n, lost_max)
    top_g = n if gained_max is None else min(n, gained_max)
    lost, gained = np.meshgrid(np.arange(top_l + 1, dtype=float), np.arange(top_g + 1, dtype=float), indexing="ij")
    keep = lost + gained <= n
    return lost[keep], gained[keep]


def _reach(n: int, p: float) -> tuple[int, int]:
    """The counts a Binomial(n, p) stays within but for a probability far under 1e-15: the cells past them
    carry no mass a probability here could show."""
    spread = 12.0 * math.sqrt(n * p * (1.0 - p)) + 12.0
    return max(0, math.floor(n * p - spread)), min(n, math.ceil(n * p + spread))


def tango_passes(n: int, lost: np.ndarray, gained: np.ndarray, bar: float) -> np.ndarray:
    """Whether Tango's upper end is within the bar: its statistic at the bar at most -z (the statistic falls
    as the hypothesised drop rises, so the upper end is under the bar exactly when the statistic there is
    under -z; tests/stats/test_paired_exact.py checks the cells against paired_binary_interval)."""
    return tango_statistic(n, lost, gained, bar) <= -Z


def tango_most_lost(n: int, gained: np.ndarray, bar: float) -> np.ndarray:
    """Per gained count, the most lost pairs whose Tango upper end is within the bar (-1: none). They are a
    prefix (Tango's upper end rises with every lost pair), so a bisection per gained count finds the
    boundary, all gained counts at once."""
    gained = np.asarray(gained, dtype=np.int64)
    lo, hi = np.full(gained.shape, -1, dtype=np.int64), n - gained
    while (open_ := lo < hi).any():
        mid = (lo + hi + 1) // 2
        ok = tango_passes(n, mid.astype(float), gained.astype(float), bar)
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid - 1, hi)
    return lo


def _pass_tails(n: int, most_lost: np.ndarray, bar: float) -> np.ndarray:
    """Per nuisance value on the boundary p_lost = p_gained + bar, the probability of the region
    {lost <= most_lost[gained]}."""
    from scipy import stats as st

    nuisance = _nuisance(bar)
    out = np.empty(len(nuisance))
    for i in range(0, len(nuisance), 16):
        p_gained = nuisance[i:i + 16, None]
        g0, g1 = _reach(n, float(p_gained[0, 0]))[0], _reach(n, float(p_gained[-1, 0]))[1]
        gs = np.arange(g0, g1 + 1)
        k = most_lost[gs]
        p_cond = np.minimum(1.0, (p_gained + bar) / np.maximum(1.0 - p_gained, 1e-300))
        inside = np.where(k >= 0, st.binom.cdf(np.maximum(k, 0), n - gs, p_cond), 0.0)
        out[i:i + 16] = (st.binom.pmf(gs, n, p_gained) * inside).sum(axis=1)
    return out


def _largest_pass_tail(n: int, most_lost: np.ndarray, bar: float) -> float:
    """The size of the pass side's test with this region: its largest probability over the nuisance."""
    return float(_pass_tails(n, most_lost, bar).max())


def _cell_masses(n: int, lost: np.ndarray, gained: np.ndarray, bar: float) -> np.ndarray:
    """P(lost, gained) per cell (rows) at every nuisance value on the boundary (columns)."""
    p_gained = _nuisance(bar)[None, :]
    p_lost = np.minimum(1.0, p_gained + bar)
    lost, gained = np.asarray(lost, dtype=float)[:, None], np.asarray(gained, dtype=float)[:, None]
    rest = n - lost - gained
    log = (gammaln(n + 1.0) - gammaln(lost + 1.0) - gammaln(gained + 1.0) - gammaln(rest + 1.0)
           + xlogy(lost, p_lost) + xlogy(gained, p_gained) + xlogy(rest, np.maximum(1.0 - p_lost - p_gained, 0.0)))
    return np.exp(log)


@functools.lru_cache(maxsize=1024)
@disk_cache.kept_on_disk(disk_cache.encode_int_array, disk_cache.decode_int_array)
def exact_pass_limits(n: int, bar: float) -> np.ndarray:
    """Per gained count 0..n, the most lost pairs that pass (-1: none): Tango's upper end within the bar and
    the exact unconditional test of "drop >= bar" rejecting at 2.5%. That test's p-value at a cell is the
    largest tail P(statistic <= the cell's) over the nuisance, which rises with the cell's statistic, so its
    rejection region is {statistic <= t*}: starting from Tango's region (statistic <= -z), the cells with the
    largest statistic leave it together (ties with them too), each taking its mass off the region's
    probability at every nuisance value, until the largest is at most 2.5% (at a 0.10 bar 1 cell leaves at
    40 pairs, 8 at 105, 29 at 200, 670 at 5,000)."""
    gained = np.arange(n + 1)
    k = tango_most_lost(n, gained, bar).copy()
    tails = _pass_tails(n, k, bar)
    while tails.max() > ALPHA:
        live = np.flatnonzero(k >= 0)
        t = tango_statistic(n, k[live].astype(float), live.astype(float), bar)
        top = live[t >= t.max()]
        tails = tails - _cell_masses(n, k[top], top, bar).sum(axis=0)
        k[top] -= 1
    k.setflags(write=False)
    return k


def passes(n: int, lost: np.ndarray, gained: np.ndarray, bar: float) -> np.ndarray:
    """Whether the cells pass: at most exact_pass_limits' lost count for their gained count."""
    limits = exact_pass_limits(n, bar)
    lost, gained = np.asarray(lost), np.asarray(gained)
    return lost <= limits[gained.astype(np.int64)]


def most_lost_passing(n: int, gained: np.ndarray, bar: float) -> np.ndarray:
    """Per gained count, the most lost pairs that still pass (-1: none)."""
    return exact_pass_limits(n, bar)[np.asarray(gained, dtype=np.int64)]


def pass_probability(n: int, bar: float, p_lost: float, p_gained: float) -> float:
    """P(the check passes) for n scored pairs, exactly (to 1e-15): over the gained count G ~ Binomial(n,
    p_gained), P(L <= the most lost that pass | G), where L | G ~ Binomial(n - G, p_lost / (1 - p_gained)).
    The same sum as over every cell of the trinomial, in time linear in n."""
    return _region_probability(n, lambda gained: most_lost_passing(n, gained, bar), p_lost, p_gained)


def _region_probability(n: int, most_lost: Callable[[np.ndarray], np.ndarray], p_lost: float, p_gained: float) -> float:
    """P(lost <= most_lost(gained)) for n pairs: pass_probability's sum, over any region of that shape."""
    from scipy import stats as st

    g0, g1 = _reach(n, p_gained)
    gained = np.arange(g0, g1 + 1)
    k = most_lost(gained)
    rest = max(0.0, 1.0 - p_gained)
    p_cond = min(1.0, p_lost / rest) if rest > 0 else 0.0
    terms = st.binom.pmf(gained, n, p_gained) * np.where(k >= 0, st.binom.cdf(k, n - gained, p_cond), 0.0)
    return float(terms.sum())


def _nuisance(bar: float) -> np.ndarray:
    """The gained-pair probabilities on the null's boundary p_lost = p_gained + bar."""
    return np.linspace(max(0.0, -bar), (1.0 - bar) / 2.0, NUISANCE_GRID)


def fewest_lost_reaching(n: int, gained: np.ndarray, bar: float, t_obs: float) -> np.ndarray:
    """Per gained count, the fewest lost pairs whose statistic at the bar is at least `t_obs` (n - gained + 1:
    none). Tango's statistic rises with every lost pair, so the cells at least as extreme as an outcome are
    a suffix of lost counts in each gained count: a bisection per gained count, all at once."""
    gained = np.asarray(gained, dtype=np.int64)
    lo, hi = np.zeros(gained.shape, dtype=np.int64), n - gained + 1
    while (open_ := lo < hi).any():
        mid = (lo + hi) // 2
        ok = tango_statistic(n, np.minimum(mid, n - gained).astype(float), gained.astype(float), bar) >= t_obs
        ok &= mid <= n - gained
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid + 1, lo)
    return lo


@functools.lru_cache(maxsize=4096)
def exact_pvalue(n: int, lost: int, gained: int, bar: float) -> float:
    """The exact unconditional p-value of "drop <= bar" at one cell: the largest probability, over the
    nuisance on the boundary, of a statistic at least the cell's own (ties count in the tail). The tail is a
    suffix of lost counts per gained count (fewest_lost_reaching), so each nuisance value is a sum over the
    gained counts of P(G = g) P(L >= the suffix's start | G = g): linear in n, where summing every cell
    took 16 s at 5,000 pairs. exact_pvalues (every cell) agrees with it to 1e-12 (the tests hold it)."""
    from scipy import stats as st

    t_obs = float(tango_statistic(n, np.array([float(lost)]), np.array([float(gained)]), bar)[0])
    start = fewest_lost_reaching(n, np.arange(n + 1), bar, t_obs)
    nuisance = _nuisance(bar)
    worst = 0.0
    for i in range(0, len(nuisance), 16):
        # 16 nuisance values at a time, one row each, over the gained counts their trinomials reach
        p_gained = nuisance[i:i + 16, None]
        g0, g1 = _reach(n, float(p_gained[0, 0]))[0], _reach(n, float(p_gained[-1, 0]))[1]
        gs = np.arange(g0, g1 + 1)
        p_cond = np.minimum(1.0, (p_gained + bar) / np.maximum(1.0 - p_gained, 1e-300))
        tail = st.binom.pmf(gs, n, p_gained) * st.binom.sf(start[gs] - 1, n - gs, p_cond)
        worst = max(worst, float(tail.sum(axis=1).max()))
    return min(worst, 1.0)


@functools.lru_cache(maxsize=16)
def exact_pvalues(n: int, bar: float) -> np.ndarray:
    """exact_pvalue for every cell at once, as an (n+1) x (n+1) array indexed [lost, gained] (nan where
    lost + gained > n): the enumerations in the tests and the fail-side figures read it."""
    lost, gained = _cells(n)
    t = tango_statistic(n, lost, gained, bar)
    order = np.argsort(-t, kind="stable")
    desc = -t[order]
    last = np.searchsorted(desc, desc, side="right") - 1  # a cell's tail runs to the end of its tie group
    lo_s, ga_s = lost[order], gained[order]
    worst = np.zeros(len(order))
    coefficient = _log_coefficient(n, lo_s, ga_s)  # once, not per nuisance value: most of the time went to it
    for p_gained in _nuisance(bar):
        mass = np.exp(_log_trinomial(n, lo_s, ga_s, p_gained + bar, p_gained, coefficient))
        np.maximum(worst, np.cumsum(mass)[last], out=worst)
    out = np.full((n + 1, n + 1), np.nan)
    out[lo_s.astype(int), ga_s.astype(int)] = np.minimum(worst, 1.0)
    out.setflags(write=False)
    return out


def fails(n: int, lost: int, gained: int, bar: float) -> bool:
    """The fail side's rule: Tango's lower end past the bar and the exact test at the bar rejecting."""
    if not tango_statistic(n, np.array([lost]), np.array([gained]), bar)[0] > Z:
        return False
    return exact_pvalue(n, lost, gained, bar) <= ALPHA


def fail_probability(n: int, bar: float, p_lost: float, p_gained: float, *, tango_only: bool = False) -> float:
    """P(the check fails) for n scored pairs, exactly; `tango_only`: under Tango's lower end alone (the
    rule before the exact test, kept to show what it cost)."""
    lost, gained = _cells(n)
    bad = tango_statistic(n, lost, gained, bar) > Z
    if not tango_only:
        bad &= exact_pvalues(n, bar)[lost.astype(int), gained.astype(int)] <= ALPHA
    return float(np.exp(_log_trinomial(n, lost[bad], gained[bad], p_lost, p_gained)).sum())


def equal_pass_probability(n: int, bar: float, disagreement: float) -> float:
    """P(pass) for a candidate equal to the reference: a share `disagreement` of pairs flips, half each way."""
    return pass_probability(n, bar, disagreement / 2.0, disagreement / 2.0)


def _tango_equal_pass_probability(n: int, bar: float, disagreement: float) -> float:
    """equal_pass_probability over Tango's pass region alone: at least the exact check's (its region holds it)."""
    p = disagreement / 2.0
    return _region_probability(n, lambda gained: tango_most_lost(n, gained, bar), p, p)


@functools.lru_cache(maxsize=512)
def equal_size(bar: float, disagreement: float, power: float) -> int | None:
    """The fewest pairs at which a candidate equal to the reference passes with probability `power`, by
    exact enumeration of P(pass) at each size tried; None past MAX_PAIRS or for a bar <= 0.

    P(pass) is a sawtooth in n (each extra lost pair the bar allows is a step up, then it sags): this is the
    first n that reaches `power` (a few pairs more can sit up to about 0.003 under it). Every n is tried up
    to LINEAR_UP_TO; past it, the sizes grow by 5% until one reaches `power`, and bisection finds where: the
    teeth are small there (at a 0.05 bar and 10% disagreeing, and at 0.02, the size bisection finds is the
    first, and P stays over `power` for the next 40 pairs)."""
    if bar <= 0 or not 0.0 <= disagreement <= 1.0:
        return None
    # The size a z test would need at this spread (sd sqrt(disagreement) a pair) is fewer than the exact test
    # needs (38 and 73 where 76 and 105 are, power.py): four times MAX_PAIRS by it, no size tried could reach
    # `power`. Enumerating each size up to MAX_PAIRS to learn that took 1-2 minutes (a 0.001 bar at 50%).
    z = t_quantile(1.0 - ALPHA, None) + t_quantile(power, None)
    if z * z * disagreement > 4 * MAX_PAIRS * bar * bar:
        return None

    def enough(n: int) -> bool:
        # The exact region is Tango's less some cells, so where even Tango's passes too rarely the exact one
        # does too: that bound is one bisection, the exact region a search over the nuisance grid (~70 ms a
        # size on a slow core; a verdict asked for hundreds of sizes). The margin keeps rounding out of it.
        if _tango_equal_pass_probability(n, bar, disagreement) < power - 1e-9:
            return False
        return equal_pass_probability(n, bar, disagreement) >= power

    for n in range(1, min(LINEAR_UP_TO, MAX_PAIRS) + 1):
        if enough(n):
            return n
    below = min(LINEAR_UP_TO, MAX_PAIRS)
    while below < MAX_PAIRS:
        above = min(MAX_PAIRS, math.ceil(below * 1.05))
        if enough(above):
            while above - below > 1:
                mid = (above + below) // 2
                below, above = (below, mid) if enough(mid) else (mid, above)
            return above
        below = above
    return None


@functools.lru_cache(maxsize=4096)
def paired_drop_interval(n: int, lost: int, gained: int, bar: float) -> Interval:
    """The interval a paired 0/1 drop is judged by against `bar`: Tango's score interval, with its lower
    end held at the bar where it clears the bar but the exact unconditional test at the bar does not reject
    (then the check cannot fail), and its upper end held just past the bar where it is within the bar but
    the exact test of the pass side does not reject (then the check cannot pass)."""
    iv = paired_binary_interval(n, lost, gained)
    if iv.lo > bar and not fails(n, lost, gained, bar):
        return Interval(iv.estimate, bar, iv.hi, se=iv.se, df=iv.df)
    if iv.hi <= bar and not bool(passes(n, np.array([lost]), np.array([gained]), bar)[0]):
        return Interval(iv.estimate, iv.lo, math.nextafter(bar, math.inf), se=iv.se, df=iv.df)
    return iv
