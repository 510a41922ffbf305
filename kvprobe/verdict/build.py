"""The verdict: a pure function of the recorded numbers and the bars fixed before the run.

Per candidate, most serious first:
  invalid       the one-knob check failed (each differing field is named);
  broken        the server could not serve (inventory smoke, or a probe hit a server failure); the
                bars measured before the failure are still judged and listed with it;
  reject        a bar is failed: the whole interval is on the wrong side of it (which bar, by how much);
  no_gain       no bar fails but the capacity gain is under capacity_gain_min ("frees nothing");
  inconclusive  capacity gain is there and nothing fails, but some bar is not shown to pass: its
                interval straddles the bar, or it was not measured. Never counted as a pass: an
                operator does not deploy on an unproven quality or speed result;
  adopt         capacity gain >= capacity_gain_min and every bar passes.
Overall: the adopted candidate with the largest capacity (ties: config order); else the reference,
with the reason.

Exit code (eval and canary; the codes are kvprobe.errors' EXIT_*): 3 a candidate is invalid; 4 a
server is broken; 1 no candidate is adopted and at least one is rejected, or inconclusive on a bar
that was measured (or asked for and came back empty): the change under test fails or does not pass a
bar; 0 otherwise: a candidate is adopted, or every candidate passes but frees nothing, or what holds
a candidate back is only a probe that was not asked for (--probes), which the decisions list.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kvprobe import __version__
from kvprobe.config import Bars
from kvprobe.errors import EXIT_BAR_FAILED, EXIT_BROKEN, EXIT_INVALID, EXIT_OK
from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.run.store import RunDir, dumps
from kvprobe.verdict import sealed
from kvprobe.verdict.checks import METHOD, capacity_of, gating, judge, pct
from kvprobe.verdict.evidence import gather
from kvprobe.verdict.schema import check_written
from kvprobe.verdict.sealed import rules5

SCHEMA = "kvprobe.verdict/3"
# Schema 3: beside the words that say the same, a check's case as typed fields (case_fields), the cases a speed
#    endpoint averages over (scope_cases), and the client-limited blocks a speed check dropped with why
#    (dropped_client_limited, client_limited_reason); published as JSON Schema (kvprobe.verdict.schema).
SCHEMA_2 = "kvprobe.verdict/2"

# Rules 2: power figures on every measured check, and the task-accuracy bar.
# 3: answers cut at the cap or failed are outcomes (scored as wrong, both-unanswered left out and counted),
#    a bar on the rise in answers cut at the cap, a minimum share of scored pairs; Tango's score interval for
#    paired 0/1 outcomes, t intervals over passages with the reference's run-to-run noise in the perplexity
#    interval; power as passes_at_most / fails_at_least and a family-wide `needed`; stable check ids; a probe
#    that cannot run on these servers is not_measured (schema 2: per-passage and per-document evidence).
# 4: speed is one primary endpoint declared before the run (load.endpoint.*), decided by a group-sequential
#    paired t test over blocks; per-case speed checks are guardrails (gating: false) that fail only past twice
#    the bar on Holm-adjusted intervals.
# 5: every 0/1 task metric through Tango's interval (negated when lower is better), other task scores through
#    Tango's interval on the losses' mass within their range with a pass at the zero-loss size at least, and a
#    cut answer scored at the range's worst end; a 0/1 bar fails only where the exact unconditional test at the
#    bar agrees; `needed` for paired outcomes by exact enumeration; an undecided speed endpoint whose advice
#    passes 10x the design's blocks is told the design cannot settle it; a speed design declared now uses the
#    robust statistic (kvprobe.stats.sequential: AR(1)-inflated se, c the worst over a family of skewed and
#    correlated block noise, no look before 8 blocks; recorded as the plan's `statistic`), and a look the
#    design did not plan quotes no boundary.
# 6: a block's paired throughput is the client's (dropped) where the two sides' mean loop lag differs by over a
#    quarter of the bar of one span both share, not of each server's own span: the same lag reads larger on the
#    faster server, so rules/5 chose the blocks it dropped by their own ratio; what the lateness can have moved
#    each kept case's throughput ratio (log((1 + e_cand) / (1 + e_ref)), e = lag / own span) is taken out.
RULES = "kvprobe.rules/6"
# Verdicts written under earlier rules are re-derived under their own, sealed (kvprobe.verdict.sealed).
RULES_5, RULES_4, RULES_3 = rules5.RULES_5, sealed.RULES_4, sealed.RULES_3
SEALED = sealed.DECIDERS | rules5.DECIDERS
DECISIONS = ("invalid", "broken", "reject", "no_gain", "inconclusive", "adopt")
INPUT_KEYS = ("reference", "order", "bars", "servers", "pin", "broken", "probes", "probes_status")
DERIVED_KEYS = ("decisions", "recommendation", "exit_code")


# -- the decision --------------------------------------------------------------------------------

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
    bars = Bars.model_validate(inputs.get("bars") or {})
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


# -- the verdict file ----------------------------------------------------------------------------

def _times(run: RunDir) -> dict[str, Any]:
    first = last = None
    for event in run.events():
        first = first or event.get("t")
        last = event.get("t")
    return {"first_measurement": first, "last_measurement": last}


def build_verdict(run: RunDir) -> dict[str, Any]:
    """The verdict for a run directory: its inputs read from disk, then decided. The same directory
    gives the same bytes (times come from the recorded events, not from the clock). Its bytes follow
    the published schema (kvprobe.verdict.schema), else this raises: every verdict made, in a run or
    a test, is checked against it."""
    meta = run.read_json("run.json")
    inputs = gather(run)
    verdict: dict[str, Any] = {
        "schema": SCHEMA,
        "rules": RULES,
        "method": METHOD,
        "kvprobe_version": __version__,
        "run": {"id": run.path.name, "started": meta.get("started"), "measured_by": meta.get("kvprobe_version"),
                "probes_requested": meta.get("probes"), "resumed": meta.get("resumed") or [],
                "left_out": meta.get("left_out") or [], **_times(run)},
        **inputs,
    }
    verdict.update(decide(verdict))
    check_written(verdict_bytes(verdict))
    return verdict


def verdict_bytes(verdict: dict[str, Any]) -> bytes:
    return dumps(verdict)


def write_verdict(run: RunDir) -> tuple[dict[str, Any], bytes]:
    verdict = build_verdict(run)
    data = verdict_bytes(verdict)
    run.write_bytes("verdict.json", data)
    return verdict, data


def same(recorded: Any, current: Any) -> bool:
    """Equal, numbers within 1e-9 relative: a verdict's last digits can differ between CPU kinds (vector
    math in numpy and scipy), the decisions and their words cannot."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        return recorded.keys() == current.keys() and all(same(recorded[k], current[k]) for k in recorded)
    if isinstance(recorded, list) and isinstance(current, list):
        return len(recorded) == len(current) and all(same(a, b) for a, b in zip(recorded, current, strict=True))
    if isinstance(recorded, float) and isinstance(current, float):
        return recorded == current or math.isclose(recorded, current, rel_tol=1e-9, abs_tol=1e-12)
    return type(recorded) is type(current) and recorded == current


def decider(rules: Any, schema: Any) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """The decision a verdict's own rules make from its inputs: these rules', or older rules' sealed
    (kvprobe.verdict.sealed); None for rules this kvprobe does not know."""
    if (rules, schema) == (RULES, SCHEMA):
        return decide
    return SEALED.get((rules, schema))


def rederive(verdict: dict[str, Any]) -> list[str]:
    """Differences between the verdict's recorded decisions and those its own numbers give now, under
    the rules it was written with."""
    rules, schema = verdict.get("rules"), verdict.get("schema")
    decide_under = decider(rules, schema)
    if decide_under is None:
        known = ", ".join(sorted(f"{s} / {r}" for r, s in [(RULES, SCHEMA), *SEALED]))
        return [f"verdict schema {schema!r} / rules {rules!r}: this kvprobe re-derives {known} only"]
    missing = [k for k in (*INPUT_KEYS, *DERIVED_KEYS) if k not in verdict]
    if missing:
        return [f"verdict lacks {', '.join(missing)}"]
    try:
        again = decide_under({k: verdict[k] for k in INPUT_KEYS})
    except (KeyError, TypeError, ValueError) as exc:
        return [f"the verdict's numbers cannot be decided again: {exc}"]
    problems = []
    recorded = verdict["decisions"]
    for name in sorted(set(recorded) | set(again["decisions"])):
        was, now = recorded.get(name) or {}, again["decisions"].get(name) or {}
        if was.get("decision") != now.get("decision"):
            problems.append(f"{name}: recorded decision {was.get('decision')!r}, the numbers give "
                            f"{now.get('decision')!r}")
        elif not same(was, now):
            problems.append(f"{name}: recorded reasons or checks differ from what the numbers give")
    if verdict["recommendation"] != again["recommendation"]:
        problems.append(f"recommendation: recorded {verdict['recommendation'].get('server')!r}, the numbers give "
                        f"{again['recommendation']['server']!r}")
    if verdict["exit_code"] != again["exit_code"]:
        problems.append(f"exit_code: recorded {verdict['exit_code']}, the numbers give {again['exit_code']}")
    return problems
