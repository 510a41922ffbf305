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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from kvprobe.stats import t_quantile

ALPHA = 0.025
SIMS = 200_000
SEED = 20261203
MIN_LOOK = 3  # a t statistic on 2 blocks has 1 df: too heavy-tailed to spend alpha on


@dataclass(frozen=True)
class Design:
    """The planned looks (block counts) and the boundary constant; recorded in load.json and the verdict."""

    looks: tuple[int, ...]
    c: float
    alpha: float = ALPHA
    c_fail: float | None = None  # with two primary endpoints the fail side is Bonferroni-split (alpha / 2)

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
        return out


def planned_looks(max_blocks: int, look_every: int, first_look: int | None = None) -> tuple[int, ...]:
    """Looks every `look_every` blocks from `first_look` (default: look_every, at least MIN_LOOK) up to
    max_blocks, which is always a look."""
    if look_every < 1 or max_blocks < 1:
        raise ValueError(f"looks need max_blocks >= 1 and look_every >= 1 (got {max_blocks}, {look_every})")
    first = max(MIN_LOOK, first_look or look_every)
    if max_blocks < first:
        return (max_blocks,)
    looks = list(range(first, max_blocks + 1, look_every))
    if looks[-1] != max_blocks:
        looks.append(max_blocks)
    return tuple(looks)


@lru_cache(maxsize=64)
def calibrate(looks: tuple[int, ...], alpha: float = ALPHA) -> float:
    """The smallest c (rounded up to 3 decimals) whose boundaries c*sqrt(n_max/n) a paired t statistic
    under the null crosses at some look with probability at most alpha: seeded, so every run and every
    `verify` computes the same c."""
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


def design(max_blocks: int, look_every: int, first_look: int | None = None, alpha: float = ALPHA) -> Design:
    looks = planned_looks(max_blocks, look_every, first_look)
    return Design(looks, calibrate(looks, alpha), alpha)


def fixed(blocks: int, alpha: float = ALPHA) -> Design:
    """A fixed design: one look after exactly `blocks` blocks (the paired t test)."""
    return Design((blocks,), calibrate((blocks,), alpha), alpha)


def of_settings(load: Any, alpha: float = ALPHA) -> Design:
    """The design a [load] table declares (kvprobe.config.LoadSettings, or its recorded dict). With a
    latency endpoint beside throughput, each fails at alpha / 2; the pass side needs no split (a pass
    needs both)."""
    get = load.get if isinstance(load, dict) else lambda k, d=None: getattr(load, k, d)
    if get("repeats") is not None:
        looks: tuple[int, ...] = (int(get("repeats")),)
    else:
        looks = planned_looks(int(get("max_blocks", 20)), int(get("look_every", 4)))
    c_fail = calibrate(looks, alpha / 2) if get("latency_endpoint") else None
    return Design(looks, calibrate(looks, alpha), alpha, c_fail)


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
    more = _more_blocks(n, mean, sd, margin, plan) if outcome == "inconclusive" else None
    return Look(n, mean, sd, se, b, t_pass, t_fail, lo, hi, outcome, at_look, more)


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
    """Blocks beyond n at which the current estimate, taken as the truth, would cross the final boundary
    c: n' = (c * sd / |margin - mean|)^2. None when the estimate sits on the bar."""
    gap = abs(margin - mean)
    if gap == 0:
        return None
    c = plan.c if mean < margin or plan.c_fail is None else plan.c_fail
    total = math.ceil((c * sd / gap) ** 2) if sd > 0 else n + 1
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
