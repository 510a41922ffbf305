"""How a check reads in a table cell. The live tables (kvprobe.report.terminal), the final ones
(kvprobe.report.tables), the JUnit file and the step summary word a check the same way, from the check
alone: its value, interval and outcome come from kvprobe.verdict.checks and are never recomputed here.

Checks of both rules are read: rules/3 checks carry an `id` and power as passes_at_most /
fails_at_least; rules/2 checks (older verdicts) have neither, and power as `detectable`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from kvprobe.verdict.checks import pct
from kvprobe.verdict.checks.speed import UNSETTLED_WORDS

# Relative bars: shown as percentages. The others are absolute: answers (needles, task scores) and
# the answers cut at the cap as fractions with 3 decimals (a signed drop or rise); the agreement bars
# with 4, unsigned: a mean KL and a top-1 agreement are levels, not differences.
PERCENT_BARS = frozenset({"perplexity_delta_max", "throughput_drop_max", "p99_latency_rise_max",
                          "capacity_gain_min"})
LEVEL_BARS = frozenset({"kl_mean_max", "top1_agreement_min"})

CLIENT_LIMITED_ADVICE = "more runs do not help; a quieter client does"


def value_text(bar: str | None, x: float | None, signed: bool = True) -> str:
    """A number in its bar's units: signed for estimates, unsigned for limits and sizes."""
    if x is None:
        return "-"
    if bar in PERCENT_BARS:
        return pct(x, signed)
    if bar in LEVEL_BARS:
        return f"{x:.4f}"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def interval_text(check: dict[str, Any]) -> str:
    iv = check.get("interval")
    if not iv or None in iv:
        return "-"
    return f"[{value_text(check.get('bar'), iv[0])}, {value_text(check.get('bar'), iv[1])}]"


def figure(check: dict[str, Any] | None) -> tuple[str, str]:
    """(value, 95% interval) in the one unit every surface shows the check in: a speed check as its
    candidate/reference ratio (`1.07x`, `[0.70, 1.65]`), as the summary says it, any other in its bar's
    units (value_text). The summary, the tables of report.md and report.html, the step summary and
    `compare` all word a check through here, so one check never reads as 1.07x in one place and -7.27%
    in another."""
    if not check:
        return "-", "-"
    if check.get("ratio") is not None:
        iv = check.get("ratio_interval")
        return f"{check['ratio']:.2f}x", f"[{iv[0]:.2f}, {iv[1]:.2f}]" if iv and None not in iv else "-"
    if check.get("value") is None:
        return "-", "-"
    return value_text(check.get("bar"), check["value"]), interval_text(check)


def estimate_text(check: dict[str, Any] | None) -> str:
    """The check's figure with its 95% interval (`figure`), or '-' when it has none."""
    value, iv = figure(check)
    return value if iv == "-" else f"{value} {iv}"


def limit_text(check: dict[str, Any]) -> str:
    return value_text(check.get("bar"), check.get("limit"), signed=False)


def client_limited(check: dict[str, Any]) -> bool:
    return bool(check.get("client_limited")) or bool((check.get("power") or {}).get("client_limited"))


def outcome_word(check: dict[str, Any] | None) -> str:
    """The check's outcome as a table says it; a speed check the client could have moved is
    inconclusive because it was not judged, and says so."""
    if not check:
        return "-"
    outcome = check["outcome"]
    if outcome == "inconclusive" and client_limited(check):
        return "not judged"
    return "not measured" if outcome == "not_measured" else outcome


def label(check: dict[str, Any]) -> str:
    """What a check measures, in words: its metric (the percentile too: "TTFT p99 rise") and its case
    ("at shape=default agents=4"); a task's case is already in its metric."""
    metric = check.get("metric") or check.get("bar") or "check"
    case = check.get("case")
    text = metric if not case or str(case) in metric else f"{metric} at {case}"
    return text if check.get("gating", True) else f"guardrail: {text}"


def holds_back(check: dict[str, Any]) -> bool:
    """Whether a check keeps its candidate from adopt: anything but a pass, except a guardrail
    (gating: false), which only a fail counts."""
    if check.get("gating", True):
        return check["outcome"] != "pass"
    return check["outcome"] == "fail" and not check.get("advisory")


def find(checks: Iterable[dict[str, Any]], bar: str, case: str | None = None, metric: str | None = None
         ) -> dict[str, Any] | None:
    """The first check of `bar` (for `case` and `metric` when given)."""
    for check in checks:
        if check.get("bar") != bar:
            continue
        if case is not None and check.get("case") != case:
            continue
        if metric is not None and check.get("metric") != metric:
            continue
        return check
    return None


def ratio_text(check: dict[str, Any] | None) -> str:
    """A speed check's candidate/reference ratio with its interval and outcome."""
    if not check:
        return "-"
    if check.get("ratio") is None:
        return outcome_word(check)
    return f"{estimate_text(check)} {outcome_word(check)}"


def noise_text(noise: Any) -> str:
    """The reference's run-to-run noise as the perplexity check measured it (rules/3: a dict), or a
    rules/2 verdict's recorded figure (a number)."""
    if isinstance(noise, int | float) and not isinstance(noise, bool):
        return pct(float(noise), False)
    if not isinstance(noise, dict):
        return "-"
    if noise.get("deterministic"):
        return "deterministic"
    if noise.get("rms") is None:
        return f"not measured ({noise.get('runs', 1)} run)"
    return f"{pct(noise['rms'], False)} rms"


# -- power ---------------------------------------------------------------------------------------

def power_size(check: dict[str, Any], key: str) -> str:
    """passes_at_most / fails_at_least in the bar's units. Top-1 agreement's figures are a loss, 1 - top-1."""
    block = check.get("power") or {}
    x = block.get(key)
    if x is None:
        return "-"
    bar = check.get("bar")
    text = value_text(bar, x, signed=False)
    return f"{text} (1 - top-1)" if bar == "top1_agreement_min" else text


def se_text(check: dict[str, Any]) -> str:
    block = check.get("power") or {}
    se = block.get("se")
    if se is None:
        return "-"
    if block.get("scale") == "log ratio":
        return log_se_text(se)
    return value_text(check.get("bar"), se, signed=False)


def log_se_text(se: float) -> str:
    """A log ratio's standard error as the share it moves the ratio by (0.0120 is 1.21%), beside % bars."""
    return f"{math.expm1(se):.2%}"


def sequential_settle(check: dict[str, Any]) -> str | None:
    """What would settle an undecided speed endpoint, as its own words say it (kvprobe.verdict.checks.speed):
    that its design cannot, or about how many more blocks would; None for a check with no sequential look."""
    look = (check.get("sequential") or {}).get("look")
    if not look:
        return None
    if check.get("outcome") != "inconclusive":
        return "-"
    if UNSETTLED_WORDS in str(check.get("text", "")):
        return UNSETTLED_WORDS
    more = look.get("more_blocks")
    return f"about {more:,} more blocks (now {look.get('n')})" if more else "more blocks, or a quieter box"


def settle_text(check: dict[str, Any]) -> str:
    """What would settle an inconclusive check: a quieter client (client-limited), the power block's
    own why (no size passes), or the size needed, with its range over the spread's uncertainty."""
    if check.get("outcome") != "inconclusive":
        return "-"
    block = check.get("power") or {}
    if client_limited(check):
        return CLIENT_LIMITED_ADVICE
    if block.get("why"):
        return str(block["why"])
    needed = block.get("needed")
    if needed is None:
        return "-"
    unit = block.get("unit", "units")
    if "detectable" not in block and needed <= (block.get("n") or 0):
        # rules/3: this size already lets an equal candidate pass; what holds it back is the estimate
        return f"the estimate, not the size (about {needed:,} {unit} would do): a larger run tells which"
    text = f"about {needed:,} {unit}"
    span = block.get("range")
    if span and None not in span and span[0] != span[1]:
        text += f" ({span[0]:,}-{span[1]:,})"
    return text
