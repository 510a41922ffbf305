"""rules/3's and rules/4's checks by probe, and the judging of one candidate (kvprobe.verdict.checks.judge as it
was when these rules were sealed)."""

from __future__ import annotations

import functools
from typing import Any

from kvprobe.verdict.sealed import answers_rules4, power, speed_rules3
from kvprobe.verdict.sealed.quality import agreement_checks, perplexity_check
from kvprobe.verdict.sealed.speed import load_checks

# rules/4 judged answers as answers_rules4 says, and told an undecided speed endpoint any count of blocks.
RULES4_PROBES = {
    "perplexity": lambda i, c, b: [perplexity_check(i, c, b)],
    "agreement": agreement_checks,
    "needle": answers_rules4.needle_checks,
    "tasks": answers_rules4.task_checks,
    "load": functools.partial(load_checks, cap_advice=False),
}
# rules/3 judged speed per case with Welch intervals; answers as rules/4.
RULES3_PROBES = {**RULES4_PROBES, "load": speed_rules3.load_checks}

# Fields a check carries from verdict schema 3 on; `judge(structured=False)` leaves them out for schema 2.
STRUCTURED_KEYS = ("case_fields", "scope_cases", "dropped_client_limited", "client_limited_reason")


def gating(check: dict[str, Any]) -> bool:
    """A check that can hold a candidate back from adopt (a guardrail can only reject it)."""
    return check.get("gating", True)


def judge(inputs: dict[str, Any], cand: str, bars: Any, probes: dict[str, Any], *,
          structured: bool = True) -> list[dict[str, Any]]:
    """Every check of one candidate, with `needed` sized for its whole family of gating checks."""
    checks = [c for probe in probes for c in probes[probe](inputs, cand, bars)]
    if not structured:
        checks = [{k: v for k, v in c.items() if k not in STRUCTURED_KEYS} for c in checks]
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
