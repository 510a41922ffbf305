"""rules/5's decision from a verdict's inputs (kvprobe.verdict.build.decide as it was when rules/6 sealed these
rules): invalid, broken, reject, no_gain, inconclusive or adopt per candidate, the recommendation and the exit
code."""

from __future__ import annotations

from typing import Any

from kvprobe.verdict.sealed.bars import Bars
from kvprobe.verdict.sealed.exits import EXIT_BAR_FAILED, EXIT_BROKEN, EXIT_INVALID, EXIT_OK
from kvprobe.verdict.sealed.rules5.checks import capacity_of, gating, judge, pct

DEFAULT_KNOB = "kv_cache_dtype"  # kvprobe.knob.DEFAULT when rules/5 was sealed


def _broken(base: dict[str, Any], checks: list[dict[str, Any]], why: str) -> dict[str, Any]:
    """Broken stays the decision, but what was measured before the failure is judged and said: a
    candidate that fails a quality bar and then crashes fails that bar too."""
    measured = [c for c in checks if c["outcome"] != "not_measured"]
    reasons = [why] + [f"also fails {c['bar']}: {c['text']}" if c["outcome"] == "fail"
                       else f"measured before it broke: {c['text']}" for c in measured]
    return base | {"decision": "broken", "checks": checks, "reasons": reasons}


def _decide_candidate(inputs: dict[str, Any], cand: str, bars: Bars) -> dict[str, Any]:
    ref = inputs["reference"]
    server = inputs["servers"].get(cand) or {}
    pin = inputs.get("pin") or {}
    differences = (pin.get("by_candidate") or {}).get(cand) or []
    ref_tokens, tokens = capacity_of(inputs, ref), capacity_of(inputs, cand)
    ratio = tokens / ref_tokens if tokens is not None and ref_tokens else None
    base = {"kv_cache_tokens": tokens, "capacity_ratio": ratio, "checks": []}
    if differences:
        knob = pin.get("knob") or DEFAULT_KNOB
        return base | {"decision": "invalid",
                       "reasons": [f"servers differ in more than the knob under test ({knob}): " + d["text"]
                                   for d in differences]}
    checks = judge(inputs, cand, bars)
    if server.get("status") not in (None, "ok"):
        return _broken(base, checks, f"{cand} could not serve ({server.get('status')}): "
                                     f"{server.get('error') or 'no detail'}")
    if cand in inputs.get("broken", {}):
        return _broken(base, checks, f"{cand} failed during a probe: {inputs['broken'][cand]}")
    notes = []
    ref_server = inputs["servers"].get(ref) or {}
    if ref_server.get("status") not in (None, "ok") or ref in inputs.get("broken", {}):
        err = inputs.get("broken", {}).get(ref) or ref_server.get("error") or ref_server.get("status")
        notes.append(f"the reference {ref} is broken ({err}): what needs it was not measured")
    if server.get("kv_cache_tokens_estimate") or (ref_server.get("kv_cache_tokens_estimate")):
        notes.append("capacity is an estimate (num_gpu_blocks x block_size): wrong for hybrid models")
    notes += [u for u in pin.get("unchecked") or [] if u.startswith((f"{cand}:", f"{ref}:"))]
    failed = [c for c in checks if c["outcome"] == "fail" and not c.get("advisory")]
    # A guardrail (gating: false) rejects when it fails, and otherwise holds nothing back.
    open_ = [c for c in checks if c["outcome"] in ("inconclusive", "not_measured") and gating(c)]

    if ratio is None:
        capacity_text = "capacity unknown (no kv_cache_tokens)"
        gain = None
    else:
        gain = (tokens - ref_tokens) / ref_tokens
        capacity_text = (f"capacity {ratio:.2f}x ({tokens:,} vs {ref_tokens:,} KV tokens, gain {pct(gain)}; "
                         f"bar: gain >= {pct(bars.capacity_gain_min, False)})")
    base["capacity_gain"] = gain
    base["checks"] = checks
    if failed:
        decision = "reject"
        reasons = [f"fails {c['bar']}: {c['text']}" for c in failed]
    elif gain is not None and gain < bars.capacity_gain_min:
        decision = "no_gain"
        # The memory map's account of why, and which knob would move capacity, beside the decision.
        why = ((inputs["probes"].get("capacity") or {}).get("explain") or {}).get(cand)
        reasons = [f"frees nothing: {capacity_text}" + (f". Memory map: {why}" if why else "")]
        reasons += [f"also not shown to pass: {c['text']}" for c in open_]
    elif gain is None or open_:
        decision = "inconclusive"
        reasons = [] if gain is not None else [f"not shown to gain: {capacity_text}"]
        reasons += [f"not shown to pass: {c['text']}" for c in open_]
    else:
        decision = "adopt"
        reasons = [f"gains: {capacity_text}", f"passes every bar ({sum(map(gating, checks))} checks)"]
    if decision != "adopt" and gain is not None and decision != "no_gain":
        reasons.append(capacity_text)
    if decision in ("adopt", "inconclusive") and (inputs.get("probes_status") or {}).get("tasks") == "not run":
        # A policy, said where it applies: adopt does not wait for task accuracy nobody asked for.
        notes.append("task accuracy was not measured: the tasks probe is opt-in ([tasks] in servers.toml or "
                     "--probes ...,tasks) and was not asked for")
    return base | {"decision": decision, "reasons": reasons + notes}


def _counts_against(inputs: dict[str, Any], decision: dict[str, Any]) -> bool:
    """A rejected candidate, or one held back by a bar that was measured (or asked for and missing).
    A bar whose probe was not asked for (--probes) keeps the candidate from adopt but does not by
    itself make the run fail: the operator chose not to measure it."""
    if decision["decision"] == "reject":
        return True
    if decision["decision"] != "inconclusive":
        return False
    status = inputs.get("probes_status") or {}
    return any(c["outcome"] == "inconclusive"
               or (c["outcome"] == "not_measured" and status.get(c["probe"]) != "not run")
               for c in decision["checks"] if gating(c)) or decision.get("capacity_gain") is None


def decide(inputs: dict[str, Any]) -> dict[str, Any]:
    """The decisions, the recommendation and the exit code from the inputs alone, under these rules (an older
    verdict's: `decider`)."""
    bars = Bars.of(inputs.get("bars") or {})
    ref = inputs["reference"]
    order = list(inputs.get("order") or inputs["servers"])
    candidates = [n for n in order if n != ref and (inputs["servers"].get(n) or {}).get("role") != "reference"]
    decisions = {c: _decide_candidate(inputs, c, bars) for c in candidates}

    adopted = [c for c in candidates if decisions[c]["decision"] == "adopt"]
    if adopted:
        best = max(adopted, key=lambda c: (decisions[c]["kv_cache_tokens"] or 0, -candidates.index(c)))
        d = decisions[best]
        recommendation = {"server": best, "change": True,
                          "reason": f"adopt {best}: largest capacity among the adopted candidates "
                                    f"({d['capacity_ratio']:.2f}x the reference), every bar passes"}
    else:
        why = "; ".join(f"{c} {decisions[c]['decision']}: {decisions[c]['reasons'][0]}" for c in candidates)
        recommendation = {"server": ref, "change": False,
                          "reason": f"keep the reference {ref}: " + (f"no candidate can be adopted ({why})"
                                                                      if candidates else "no candidates")}

    ref_server = inputs["servers"].get(ref) or {}
    kinds = {d["decision"] for d in decisions.values()}
    if "invalid" in kinds:
        code = EXIT_INVALID
    elif "broken" in kinds or ref_server.get("status") not in (None, "ok") or ref in inputs.get("broken", {}):
        code = EXIT_BROKEN
    elif not adopted and any(_counts_against(inputs, d) for d in decisions.values()):
        code = EXIT_BAR_FAILED
    else:
        code = EXIT_OK
    return {"decisions": decisions, "recommendation": recommendation, "exit_code": code}
