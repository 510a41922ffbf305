"""What every check shares: its record, its wording and its power block.

A check's text is part of the signed bytes, so every number in it is formatted deterministically.
"""

from __future__ import annotations

from typing import Any

from kvprobe.verdict.sealed.rules5 import power
from kvprobe.verdict.sealed.rules5.stats import Interval, bar_outcome

# A pass needs this share of the planned pairs scored: a bar decided on the few cases that are left
# after the rest were cut or failed on both sides says little about the whole plan.
MIN_SCORED_SHARE = 0.8
# A ratio-of-sums t interval over fewer units is not trusted to pass a bar (it may still fail one).
MIN_PASSAGES = 8


def pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}%" if signed else f"{x * 100:.2f}%"


def iv_text(lo: float | None, hi: float | None, fmt: Any = pct) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def make_check(check_id: str, bar: str, metric: str, probe: str, outcome: str, text: str, *,
               value: float | None = None, interval: list[float] | None = None, limit: float | None = None,
               case: str | None = None, **extra: Any) -> dict[str, Any]:
    """One check as verdict.json carries it. `id` is stable across runs of the same config: a
    dashboard or a baseline comparison keys on it, never on the text."""
    return {"id": check_id, "bar": bar, "metric": metric, "probe": probe, "case": case, "value": value,
            "interval": interval, "limit": limit, "outcome": outcome, "text": text, **extra}


def not_measured(check_id: str, bar: str, metric: str, probe: str, why: str, limit: float | None,
                 case: str | None = None) -> dict[str, Any]:
    return make_check(check_id, bar, metric, probe, "not_measured", f"{metric}: not measured ({why})",
                      limit=limit, case=case)


def probe_missing(inputs: dict[str, Any], probe: str) -> str:
    """Why a probe's numbers are absent, in the words of its status."""
    status = (inputs.get("probes_status") or {}).get(probe)
    if status and status.startswith("cannot run"):
        return f"{probe} probe {status}"
    return f"{probe} probe {status or 'not run'}"


def rules2_row(probe: str, row: dict[str, Any], totals: tuple[str, ...], who: str, figures: str) -> str | None:
    """Why a server's row that has a result (a number in `totals`) has no `figures` to judge: it was written
    under rules/2. The probe files gained the per-passage and per-document figures the checks judge with
    rules/3, so such a probe ran, and saying "no result" or "not run" of it would be untrue. None otherwise."""
    if not any(isinstance(row.get(k), int | float) and not isinstance(row.get(k), bool) for k in totals):
        return None
    return f"{probe} ran under rules/2, whose {probe}.json kept totals: its {figures} for {who} are not recorded"


def judged(interval: Interval, limit: float, *, larger_is_worse: bool = True) -> str:
    return bar_outcome(interval, limit, larger_is_worse=larger_is_worse)


def with_power(check: dict[str, Any], n: int, unit: str, se: float | None, df: float | None,
               loss_bar: float | None, *, binary: bool = False, exact_fail: bool = True,
               **sizing: Any) -> dict[str, Any]:
    """Attach the power block (kvprobe.stats.power), in loss units; paired 0/1 outcomes get exact binomial
    figures (`exact_fail`: under the fail side the check runs; rules/4's was Tango's lower end alone).
    `sizing` is kept for the family pass (kvprobe.verdict.checks.judge), which computes `needed` once every
    gating check is known."""
    if check["outcome"] == "not_measured" or n < 1:
        return check
    block = power.figures(n, unit, se, df, loss_bar)
    if binary:
        block.update(power.binary_figures(n, loss_bar, exact_fail=exact_fail))
    block["_sizing"] = {"loss_bar": loss_bar, **sizing}
    check["power"] = block
    return check
