"""The speed decision: one declared endpoint, measured in paired blocks and stopped at the first
look that settles it (a group-sequential design, O'Brien-Fleming type, on the paired t statistic).

Each block gives one paired log loss per candidate (for throughput log(ref / cand), for a latency
log(cand / ref), so larger is worse either way). At each planned look n the statistic is
t_n = (margin - mean) / se for a pass and (mean - margin) / se for a fail, against the boundary
b_n = c * sqrt(n_max / n). `c` is calibrated by simulation once per design so that a candidate exactly
at the bar crosses the pass boundary at any look at most `alpha` of the time; t is pivotal, so c does
not depend on the spread. With one look the design is the fixed-sample t test (c = t_0.975, n-1 df).

The repeated confidence interval mean -/+ b_n * se is valid at whichever look stopped
(statistics-audit.md section 4.3).

Two statistics. `t` (rules/4) is the paired t above, calibrated under iid normal block losses; right-skewed
losses or serially correlated blocks push its false pass at the bar to 5-16% (statistics-verify.md N3).
`robust` (rules/5) is what new runs declare:
  * the lag-1 autocorrelation of the losses, bias-corrected (+1/n) and held in [0, RHO_CAP], inflates the
    standard error by sqrt((1 + r) / (1 - r)), the long-run variance of an AR(1) mean;
  * c is calibrated, by seeded simulation, as the worst over a declared family of block-loss noise (normal,
    t(3), exponential skew either way, lognormal, one-sided hiccups, AR(1) rho 0.3 and 0.5), at a
    Monte-Carlo margin under alpha, both sides: the skewed members set it at every size shipped (12 to 64
    blocks: exponential 4.25 to 3.06 against AR(1) 0.5's 3.73 to 2.78), so normal or AR(1) blocks pass at
    the bar less than alpha (0.2% and 1.4% at 64);
  * no look before ROBUST_MIN_LOOK blocks: an autocorrelation on fewer is noise.
A skew correction of the statistic itself (Hall's 1992 cubic) was tried and left out: with the sample
skewness of 8-12 blocks it flattens the statistic of a clearly equal candidate (P(pass | equal) 0.90
against 0.99 at a block spread of 0.019 over 12 blocks), where the worst-case c costs less.
The repeated confidence interval is mean -/+ b_n * (inflated se), so its ends agree with the outcome.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any

import numpy as np

from kvprobe.stats import disk_cache, t_quantile

ALPHA = 0.025
SIMS = 200_000
SEED = 20261203
MIN_LOOK = 3  # a t statistic on 2 blocks has 1 df: too heavy-tailed to spend alpha on
T, ROBUST = "t", "robust"
STATISTIC = ROBUST  # what a design declared now uses; a recorded design without one is rules/4's t
ROBUST_MIN_LOOK = 8
RHO_CAP = 0.8
FAMILY = ("normal", "t3", "exponential", "exponential-left", "lognormal", "hiccup", "ar1-0.3", "ar1-0.5")
FAMILY_SIMS = 60_000  # per member: the worst member's 97.5% point to about +-0.07% in rate
CAL_MARGIN = 0.95  # calibrate the worst member to 0.95 alpha, so a fresh 10^5-path check stays under alpha
ADVICE_POWER = 0.8  # "about N more blocks would settle it": at this power, if the estimate is the truth
ADVICE_Z = 0.8416212335729143  # its normal quantile


@dataclass(frozen=True)
class Design:
    """The planned looks (block counts) and the boundary constant; recorded in load.json and the verdict."""

    looks: tuple[int, ...]
    c: float
    alpha: float = ALPHA
    c_fail: float | None = None  # with two primary endpoints the fail side is Bonferroni-split (alpha / 2)
    statistic: str = T

    @property
    def n_max(self) -> int:
        return self.looks[-1]

    def boundary(self, n: int) -> float:
        return self.c * math.sqrt(self.n_max / n)

    def fail_boundary(self, n: int) -> float:
        return (self.c if self.c_fail is None else self.c_fail) * math.sqrt(self.n_max / n)

    def as_dict(self) -> dict[str, Any]:
        out = {"looks": list(self.looks), "c": _finite(self.c), "alpha": self.alpha,
               "boundaries": [_finite(round(self.boundary(n), 3)) for n in self.looks]}
        if self.c_fail is not None:
            out["c_fail"] = _finite(self.c_fail)
        if self.statistic != T:  # rules/4's plans carry no statistic, and re-derive byte for byte
            out["statistic"] = self.statistic
        return out


def planned_looks(max_blocks: int, look_every: int, first_look: int | None = None,
                  statistic: str = T) -> tuple[int, ...]:
    """Looks every `look_every` blocks from `first_look` (default: look_every, at least MIN_LOOK, or
    ROBUST_MIN_LOOK for the robust statistic) up to max_blocks, which is always a look."""
    if look_every < 1 or max_blocks < 1:
        raise ValueError(f"looks need max_blocks >= 1 and look_every >= 1 (got {max_blocks}, {look_every})")
    least = ROBUST_MIN_LOOK if statistic == ROBUST else MIN_LOOK
    first = max(least, first_look or look_every)
    if max_blocks < first:
        return (max_blocks,)
    looks = list(range(first, max_blocks + 1, look_every))
    if looks[-1] != max_blocks:
        looks.append(max_blocks)
    return tuple(looks)


@lru_cache(maxsize=64)
@disk_cache.kept_on_disk(disk_cache.encode_float, disk_cache.decode_float)
def calibrate(looks: tuple[int, ...], alpha: float = ALPHA, statistic: str = T) -> float:
    """The smallest c (rounded up to 3 decimals) whose boundaries c*sqrt(n_max/n) a paired t statistic
    under the null crosses at some look with probability at most alpha: seeded, so every run and every
    `verify` computes the same c. The robust statistic: the worst over FAMILY, either side."""
    if statistic == ROBUST:
        return _calibrate_robust(looks, alpha)
    if len(looks) == 1:
        if looks[0] < 2:
            return math.inf  # one block has no spread: nothing can cross
        return math.ceil(t_quantile(1 - alpha, looks[0] - 1) * 1000) / 1000
    n_max = looks[-1]
    rng = np.random.default_rng(SEED)
    worst = np.full(SIMS, -np.inf)
    chunk = 50_000
    for start in range(0, SIMS, chunk):
        z = rng.standard_normal((min(chunk, SIMS - start), n_max))
        csum, csq = np.cumsum(z, axis=1), np.cumsum(z * z, axis=1)
        part = np.full(z.shape[0], -np.inf)
        for n in looks:
            mean = csum[:, n - 1] / n
            var = (csq[:, n - 1] - n * mean * mean) / (n - 1)
            t = mean / np.sqrt(np.maximum(var, 1e-300) / n)
            part = np.maximum(part, t * math.sqrt(n / n_max))  # crossing b_n <=> t*sqrt(n/n_max) > c
        worst[start:start + z.shape[0]] = part
    return math.ceil(float(np.quantile(worst, 1 - alpha)) * 1000) / 1000


def _family_noise(member: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Standardised block-loss noise (mean 0, sd 1) of one FAMILY member."""
    if member == "normal":
        return rng.standard_normal(shape)
    if member == "t3":
        return rng.standard_t(3, shape) / math.sqrt(3)
    if member == "exponential":  # skew +2: now and then a block much slower on the candidate
        return rng.exponential(1.0, shape) - 1
    if member == "exponential-left":
        return 1 - rng.exponential(1.0, shape)
    if member == "lognormal":  # sigma 0.5: skew 1.75
        s2 = 0.25
        y = rng.lognormal(0.0, 0.5, shape)
        return (y - math.exp(s2 / 2)) / math.sqrt((math.exp(s2) - 1) * math.exp(s2))
    if member == "hiccup":  # 5% of blocks +4 sd on one side
        y = rng.standard_normal(shape) + np.where(rng.random(shape) < 0.05, 4.0, 0.0)
        return (y - 0.2) / math.sqrt(1 + 0.05 * 0.95 * 16)
    if member.startswith("ar1-"):
        rho = float(member.removeprefix("ar1-"))
        e = rng.standard_normal(shape)
        y = np.empty(shape)
        y[:, 0] = e[:, 0]
        for j in range(1, shape[1]):
            y[:, j] = rho * y[:, j - 1] + math.sqrt(1 - rho * rho) * e[:, j]
        return y
    raise ValueError(f"no noise model {member!r}")


def robust_stat(x: np.ndarray) -> np.ndarray:
    """The robust statistic of each row of x (block losses minus the hypothesised mean), vectorised: the
    mean over its AR(1)-inflated standard error, larger is worse (the fail side's; the pass side's is its
    negative)."""
    n = x.shape[1]
    m = x.mean(axis=1)
    d = x - m[:, None]
    ss = (d * d).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip((d[:, 1:] * d[:, :-1]).sum(axis=1) / ss + 1.0 / n, 0.0, RHO_CAP)
        out = m / (np.sqrt(ss / (n - 1) / n) * np.sqrt((1 + r) / (1 - r)))
    return np.where(ss > 0, out, np.sign(m) * np.inf)


@lru_cache(maxsize=64)
def _calibrate_robust(looks: tuple[int, ...], alpha: float) -> float:
    if looks[-1] < 3:
        return math.inf  # no autocorrelation on fewer than three blocks
    n_max = looks[-1]
    worst = 0.0
    for k, member in enumerate(FAMILY):
        z = _family_noise(member, np.random.default_rng([SEED, k]), (FAMILY_SIMS, n_max))
        high = np.full(FAMILY_SIMS, -np.inf)
        low = np.full(FAMILY_SIMS, -np.inf)
        for n in looks:
            if n < MIN_LOOK:
                continue
            t = robust_stat(z[:, :n]) * math.sqrt(n / n_max)
            high, low = np.maximum(high, t), np.maximum(low, -t)
        q = 1 - CAL_MARGIN * alpha
        worst = max(worst, float(np.quantile(high, q)), float(np.quantile(low, q)))
    return math.ceil(worst * 1000) / 1000


def operating(plan: Design, sigma: float, margin: float, truth: float = 0.0, sims: int = 20_000,
              noise: str = "normal", seed: int = SEED) -> tuple[float, float, float]:
    """(P(pass), P(fail), mean blocks used) of the design for a candidate whose mean log loss is `truth`,
    block losses spread `sigma` with one FAMILY member's shape, by seeded simulation: what a plan can
    promise before its blocks run (the robust statistic has no closed-form power)."""
    losses = truth + sigma * _family_noise(noise, np.random.default_rng(seed), (sims, plan.n_max))
    passed, failed, used = decide(losses, margin, plan)
    return float(passed.mean()), float(failed.mean()), float(used.mean())


def decide(losses: np.ndarray, margin: float, plan: Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`settle`'s decisions over many runs at once: each row of `losses` is one run's block losses (at least
    n_max of them), looked at at the planned looks, stopped at the first pass or fail. (passed, failed,
    blocks used) per row; neither passed nor failed is inconclusive."""
    x = np.asarray(losses, dtype=float)[:, :plan.n_max] - margin
    sims = x.shape[0]
    done = np.zeros(sims, bool)
    passed, failed = np.zeros(sims, bool), np.zeros(sims, bool)
    used = np.full(sims, plan.n_max, dtype=float)
    for n in plan.looks:
        if n < 2 or ((plan.statistic == ROBUST or len(plan.looks) > 1) and n < MIN_LOOK):
            continue
        part = x[:, :n]
        if plan.statistic == ROBUST:
            stat = robust_stat(part)
        else:
            sd = part.std(axis=1, ddof=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                stat = part.mean(axis=1) / (sd / math.sqrt(n))
        b, b_fail = plan.boundary(n), plan.fail_boundary(n)
        p = (-stat > b) & ~done
        f = (stat > b_fail) & ~done & ~p
        used[p | f] = n
        passed |= p
        failed |= f
        done |= p | f
    return passed, failed, used


def design(max_blocks: int, look_every: int, first_look: int | None = None, alpha: float = ALPHA,
           statistic: str = T) -> Design:
    looks = planned_looks(max_blocks, look_every, first_look, statistic)
    return Design(looks, calibrate(looks, alpha, statistic), alpha, statistic=statistic)


def fixed(blocks: int, alpha: float = ALPHA, statistic: str = T) -> Design:
    """A fixed design: one look after exactly `blocks` blocks (the paired t test, or the robust one)."""
    return Design((blocks,), calibrate((blocks,), alpha, statistic), alpha, statistic=statistic)


def of_settings(load: Any, alpha: float = ALPHA) -> Design:
    """The design a [load] table declares (kvprobe.config.LoadSettings: a design declared now, with
    STATISTIC; or its recorded dict, whose plan names its statistic, rules/4's t when it names none). With
    a latency endpoint beside throughput, each fails at alpha / 2; the pass side needs no split (a pass
    needs both)."""
    if isinstance(load, dict):
        get: Any = load.get
        statistic = (load.get("plan") or {}).get("statistic", T)
    else:
        def get(k: str, d: Any = None) -> Any:
            return getattr(load, k, d)
        statistic = STATISTIC
    if get("repeats") is not None:
        looks: tuple[int, ...] = (int(get("repeats")),)
    else:
        looks = planned_looks(int(get("max_blocks", 20)), int(get("look_every", 4)), statistic=statistic)
    c_fail = calibrate(looks, alpha / 2, statistic) if get("latency_endpoint") else None
    return Design(looks, calibrate(looks, alpha, statistic), alpha, c_fail, statistic)


@dataclass(frozen=True)
class Look:
    """Where the decision stands after n blocks."""

    n: int
    mean: float  # mean paired log loss (larger is worse)
    sd: float
    se: float
    boundary: float
    t_pass: float
    t_fail: float
    lo: float  # the repeated confidence interval of the log loss
    hi: float
    outcome: str  # pass | fail | continue | inconclusive
    at_look: bool
    more_blocks: int | None  # inconclusive: roughly how many more blocks would settle it

    def as_dict(self) -> dict[str, Any]:
        return {k: _finite(v) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _finite(x: float) -> float | None:
    """JSON has no infinity: a boundary nothing can cross, or a t of a zero spread, is recorded as null."""
    return x if math.isfinite(x) else None


def _t(num: float, se: float) -> float:
    if se > 0:
        return num / se
    return math.inf if num > 0 else (-math.inf if num < 0 else 0.0)


def look(losses: Sequence[float], margin: float, plan: Design, *, final: bool = False) -> Look | None:
    """The decision after len(losses) blocks. Pass or fail only at a planned look (or `final`, the
    budget spent); between looks the outcome is `continue`. None before two blocks."""
    n = len(losses)
    if n < 2:
        return None
    if not all(math.isfinite(x) for x in losses):
        raise ValueError("a block loss is not a finite number")
    # Centred on the first block: identical losses then have a spread of exactly 0, not a rounding residue
    # that would make t = +-sqrt(n - 1) on the bar.
    shift = losses[0]
    centred = [x - shift for x in losses]
    mean_c = math.fsum(centred) / n
    sd = math.sqrt(math.fsum((x - mean_c) ** 2 for x in centred) / (n - 1))
    mean = shift + mean_c
    se = sd / math.sqrt(n)
    early = n < MIN_LOOK and len(plan.looks) > 1
    at_look = n in plan.looks or n >= plan.n_max
    b = math.inf if early else plan.boundary(min(n, plan.n_max))
    b_fail = math.inf if early else plan.fail_boundary(min(n, plan.n_max))
    if final and not at_look:
        # An unplanned last look: never below the fixed-sample t at this n, which an early stop of a
        # one-look design would otherwise undercut.
        floor = t_quantile(1 - plan.alpha, n - 1)
        b, b_fail = max(b, floor), max(b_fail, floor)
    spread = sd  # the block spread the advice on more blocks scales by
    if plan.statistic == ROBUST:  # the standard error the decision uses, inflated by the blocks' serial correlation
        rho = autocorrelation(centred)
        se = sd / math.sqrt(n) * math.sqrt((1 + rho) / (1 - rho))
        spread = se * math.sqrt(n)
    t_pass, t_fail = _t(margin - shift - mean_c, se), _t(mean_c + shift - margin, se)
    if (at_look or final) and t_pass > b:
        outcome = "pass"
    elif (at_look or final) and t_fail > b_fail:
        outcome = "fail"
    elif final or n >= plan.n_max:
        outcome = "inconclusive"
    else:
        outcome = "continue"
    # The repeated confidence interval: its upper end under the margin is a pass, its lower end over it a fail.
    lo = mean - b_fail * se if math.isfinite(b_fail) else -math.inf
    hi = mean + b * se if math.isfinite(b) else math.inf
    more = _more_blocks(n, mean, spread, margin, plan) if outcome == "inconclusive" else None
    return Look(n, mean, sd, se, b, t_pass, t_fail, lo, hi, outcome, at_look, more)


def autocorrelation(centred: Sequence[float]) -> float:
    """The lag-1 autocorrelation of one run's block losses as the robust statistic uses it: bias-corrected
    (+1/n) and held in [0, RHO_CAP]."""
    n = len(centred)
    m = math.fsum(centred) / n
    d = [x - m for x in centred]
    ss = math.fsum(x * x for x in d)
    if ss <= 0:
        return 0.0
    return min(max(math.fsum(a * b for a, b in pairwise(d)) / ss + 1.0 / n, 0.0), RHO_CAP)


def settle(losses: Sequence[float], margin: float, plan: Design) -> Look | None:
    """The decision the design reaches on these blocks, in order: the first planned look that crosses a
    boundary decides; otherwise where it stands after the last block (at most n_max): `continue` while
    blocks are left, `inconclusive` once n_max is reached. A look that was not planned (a budget spent
    between looks) never decides: the probe stops only at planned looks."""
    usable = list(losses)[:plan.n_max]
    for n in plan.looks:
        if n > len(usable):
            break
        at = look(usable[:n], margin, plan)
        if at is not None and at.outcome in ("pass", "fail"):
            return at
    return look(usable, margin, plan)


def _more_blocks(n: int, mean: float, sd: float, margin: float, plan: Design) -> int | None:
    """Blocks beyond n at which a candidate whose true loss is the current estimate would cross the final
    boundary c with power ADVICE_POWER: n' = ((c + z) * sd / |margin - mean|)^2. The estimate taken as the
    truth with z = 0 (rules/4) crosses only about half the time, so the count promised a settled run that a
    coin decided. None when the estimate sits on the bar."""
    gap = abs(margin - mean)
    if gap == 0:
        return None
    c = plan.c if mean < margin or plan.c_fail is None else plan.c_fail
    if not math.isfinite(c):  # a design no run can settle (the robust statistic at 2 blocks): no count helps
        return None
    total = math.ceil(((c + ADVICE_Z) * sd / gap) ** 2) if sd > 0 else n + 1
    return max(total - n, 1)


def drift(losses: Sequence[float]) -> float | None:
    """The least-squares slope of the block losses on the block index (information only: blocking and
    alternation cancel drift by design)."""
    n = len(losses)
    if n < 3:
        return None
    xbar = (n - 1) / 2
    sxx = math.fsum((i - xbar) ** 2 for i in range(n))
    ybar = math.fsum(losses) / n
    return math.fsum((i - xbar) * (y - ybar) for i, y in enumerate(losses)) / sxx


def williams(k: int) -> list[list[int]]:
    """A Williams design for k servers: every server takes every position equally often and follows
    every other server equally often (k orders for even k, 2k for odd k)."""
    if k == 1:
        return [[0]]
    first, lo, hi = [0], 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % k for x in first] for i in range(k)]
    if k % 2:
        rows += [list(reversed(r)) for r in rows]
    return rows
