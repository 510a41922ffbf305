"""How much a bar's result is worth: the smallest effect the run could detect, and the sample size
that would decide a bar that came out inconclusive.

A pass is only as good as the run's power: 20 needles that all match cannot tell a 10-point recall
loss from none. TensorRT-LLM's accuracy tests print the same figure (accuracy_core.py: a
one-sided test at alpha 0.05 with power 0.8, threshold = ref + z_a * sqrt(2 s^2 / n)); kvprobe's
comparisons are paired, so the standard error is the one of the paired difference, read from
the bar's own 95% interval (half-width / 1.96) unless the check knows it directly.

- detectable: (z_{1-alpha} + z_{power}) * se: a true loss this large is caught (the interval
  clears 0) 80% of the time at this run's size and spread;
- needed (inconclusive only): the size at which, if the true value is where this run measured it,
  the 95% interval clears the bar 80% of the time: n * ((z_{0.975} + z_{power}) * se / |estimate -
  bar|)^2, rounded up. None when the estimate sits on the bar (no size decides it).
"""

from __future__ import annotations

import math
from typing import Any

ALPHA = 0.05
POWER = 0.8
Z_ONE_SIDED = 1.6448536269514722  # z_{1 - alpha}
Z_TWO_SIDED = 1.959963984540054  # z_{1 - alpha/2}: the 95% intervals the bars are judged on
Z_POWER = 0.8416212335729143  # z_{power}


def se_from_interval(lo: float, hi: float) -> float | None:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return None
    return (hi - lo) / (2 * Z_TWO_SIDED)


def binary_se(n: int, ref_only: int, cand_only: int) -> float | None:
    """The standard error of a paired 0/1 difference (discordant pairs b and c of n), with one
    pseudo-pair on each side: with no discordant pair at all the plain estimate is 0, which would
    claim that 20 matching needles rule out any loss."""
    if n < 1:
        return None
    b, c, m = ref_only + 1, cand_only + 1, n + 2
    var = (b + c) / m - ((b - c) / m) ** 2
    return math.sqrt(max(var, 0.0) / m)


def figures(n: int, unit: str, se: float | None, estimate: float | None, bar: float | None,
            outcome: str) -> dict[str, Any]:
    """The power block of one check, as verdict.json and the reports carry it."""
    out: dict[str, Any] = {"n": n, "unit": unit, "alpha": ALPHA, "power": POWER, "se": se, "detectable": None,
                           "needed": None}
    if se is None:
        return out
    out["detectable"] = (Z_ONE_SIDED + Z_POWER) * se
    if outcome == "inconclusive" and estimate is not None and bar is not None:
        margin = abs(estimate - bar)
        if margin > 0:
            out["needed"] = max(n + 1, math.ceil(n * ((Z_TWO_SIDED + Z_POWER) * se / margin) ** 2))
    return out


def advice(block: dict[str, Any] | None) -> str:
    """One clause for a check's text: what would settle an inconclusive bar."""
    if not block or block.get("se") is None:
        return ""
    if block.get("needed") is None:
        return "the estimate sits on the bar: no sample size settles it"
    return f"about {block['needed']:,} {block['unit']} would settle it at this spread"
