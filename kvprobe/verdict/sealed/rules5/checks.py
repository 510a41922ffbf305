"""The checks: the one place that judges a bar. Probes record numbers; each check turns the recorded
numbers into pass, fail, inconclusive or not_measured, with its words, its interval and its power
figures (kvprobe.stats.power). The verdict, every table (live and final), the reports, the JUnit file and
the step summary show these outcomes and no other.

Pure functions of the verdict's inputs: `kvprobe verify` runs them again on a signed verdict.
"""

from __future__ import annotations

from typing import Any

from kvprobe.verdict.sealed.rules5 import power
from kvprobe.verdict.sealed.rules5.answers import needle_checks, task_checks
from kvprobe.verdict.sealed.rules5.common import MIN_PASSAGES, MIN_SCORED_SHARE, pct
from kvprobe.verdict.sealed.rules5.quality import agreement_checks, perplexity_check
from kvprobe.verdict.sealed.rules5.speed import case_key, load_checks, natural_order, runs_by_case

__all__ = ["METHOD", "MIN_PASSAGES", "MIN_SCORED_SHARE", "STRUCTURED_KEYS",
           "capacity_of", "case_key", "gating", "judge", "judge_probe", "natural_order", "pct",
           "runs_by_case"]

METHOD = {
    "interval_rule": "pass: the whole 95% interval within the bar; fail: the whole interval beyond it; else "
                     "inconclusive (a one-sided test at 2.5% against the bar, each way)",
    "answers": "needles and task documents paired case by case under the answer cap: an answer cut at the cap "
               "or failed scores as wrong on either side, a pair unanswered on both sides is left out and counted; "
               f"a pass needs {MIN_SCORED_SHARE:.0%} of the pairs scored; Tango's score interval for 0/1 outcomes in "
               "either direction (a fail and a pass each need the exact unconditional test at the bar too), and on "
               "the losses' mass within the score's range for other scores, whose pass needs at least the zero-loss "
               "size; the paired rise in answers cut at the cap has its own bar",
    "passages": "perplexity and agreement: a ratio of sums over passages with a t interval (delta method, n - 1 "
                f"df); a pass needs {MIN_PASSAGES} passages; the reference's measured run-to-run delta enters the "
                "perplexity interval as a variance component, and a bar with noise over a third of it is not passed",
    "speed": "one primary endpoint declared before the run (output tokens/s over the sweep as the mean of the "
             "per-case log ratios, or one declared case; optionally a latency percentile beside it), measured in "
             "paired blocks in a balanced order and decided by a group-sequential paired t test (O'Brien-Fleming "
             "boundaries c x sqrt(n_max / n), c calibrated so a candidate at the bar passes at most 2.5%; with two "
             "endpoints each fails at 1.25%); client-limited blocks are dropped and re-run; per-case figures are "
             "guardrails that fail only past twice the bar on Holm-adjusted paired t tests, and never gate adopt",
    "power": "passes_at_most / fails_at_least: the true loss this run passes / fails with power 0.8 "
             "(bar -/+ (t_0.975 + t_0.8) x se; exact for 0/1 outcomes); needed (inconclusive): the size at which a "
             "candidate equal to the reference passes every gating check of its family together with power 0.8 "
             "(for paired outcomes by exact enumeration at the share of pairs this run saw disagree)",
}

_PROBES = {
    "perplexity": lambda i, c, b: [perplexity_check(i, c, b)],
    "agreement": agreement_checks,
    "needle": needle_checks,
    "tasks": task_checks,
    "load": load_checks,
}


# Fields a check carries from verdict schema 3 on, beside the words that say the same: a case as typed
# fields, the cases an endpoint averages over, and the client-limited blocks a speed check dropped, with
# why. A verdict of an earlier schema was signed without them (kvprobe.verdict.sealed re-derives those).
STRUCTURED_KEYS = ("case_fields", "scope_cases", "dropped_client_limited", "client_limited_reason")


def gating(check: dict[str, Any]) -> bool:
    """A check that can hold a candidate back from adopt (a guardrail can only reject it)."""
    return check.get("gating", True)


def judge_probe(probe: str, inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """One probe's checks for one candidate (the live tables show these as each probe ends)."""
    checks = _PROBES[probe](inputs, cand, bars)
    for check in checks:
        check.get("power", {}).pop("_sizing", None)
    return checks


def judge(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """Every check of one candidate, under these rules, with `needed` sized for its whole family of gating
    checks (older rules' checks: kvprobe.verdict.sealed.checks)."""
    checks = [c for probe in _PROBES for c in _PROBES[probe](inputs, cand, bars)]
    family = sum(c["outcome"] != "not_measured" and gating(c) for c in checks)
    for check in checks:
        block = check.get("power")
        if block is None:
            continue
        sizing = block.pop("_sizing", {})
        if check["outcome"] != "inconclusive" or check.get("interval") is None:
            continue
        if block.get("client_limited"):
            advice = power.advice(block)
        else:
            kind = sizing.get("df_kind")
            df_of = {"welch": lambda m: 2 * m - 2, "paired": lambda m: m - 1}.get(kind, lambda m: None)
            sized = power.needed(block, sizing.get("loss_bar"), family, log_margin=sizing.get("log_margin"),
                                 sd_df=sizing.get("sd_df"), df_of=df_of, sd_unit=sizing.get("sd_unit"),
                                 floor=sizing.get("floor"), disagreement=sizing.get("disagreement"),
                                 span=sizing.get("span", 1.0))
            if sized:
                block.update(sized)
            advice = power.advice(block)
        if advice and advice not in check["text"]:
            check["text"] += f" (to settle it: {advice})"
    return checks


def capacity_of(inputs: dict[str, Any], name: str) -> int | None:
    probe = inputs["probes"].get("capacity") or {}
    row = (probe.get("servers") or {}).get(name) or {}
    tokens = row.get("kv_cache_tokens")
    return int(tokens) if isinstance(tokens, int | float) else None
