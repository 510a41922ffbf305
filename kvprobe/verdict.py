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

Exit code (eval and canary): 3 a candidate is invalid; 4 a server is broken; 1 no candidate is
adopted and at least one is rejected, or inconclusive on a bar that was measured (or asked for and
came back empty): the change under test fails or does not pass a bar; 0 otherwise: a candidate is
adopted, or every candidate passes but frees nothing, or what holds a candidate back is only a
probe that was not asked for (--probes), which the decisions list.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kvprobe import __version__
from kvprobe.config import Bars
from kvprobe.errors import EXIT_BAR_FAILED, EXIT_BROKEN, EXIT_INVALID, EXIT_OK
from kvprobe.evidence import gather
from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.load.stats import P99_KEYS
from kvprobe.stats import Interval, bar_outcome, loss_interval, paired_bootstrap, ratio_interval
from kvprobe.store import RunDir, dumps

SCHEMA = "kvprobe.verdict/1"
RULES = "kvprobe.rules/1"
BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95}
DECISIONS = ("invalid", "broken", "reject", "no_gain", "inconclusive", "adopt")
INPUT_KEYS = ("reference", "order", "bars", "servers", "pin", "broken", "probes", "probes_status")
DERIVED_KEYS = ("decisions", "recommendation", "exit_code")


# -- formatting (deterministic: reasons are part of the signed bytes) ----------------------------

def pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}%" if signed else f"{x * 100:.2f}%"


def _iv(lo: float | None, hi: float | None, fmt: Any = pct) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def _check(bar: str, metric: str, probe: str, outcome: str, text: str, *, value: float | None = None,
           interval: list[float] | None = None, limit: float | None = None, case: str | None = None,
           **extra: Any) -> dict[str, Any]:
    return {"bar": bar, "metric": metric, "probe": probe, "case": case, "value": value, "interval": interval,
            "limit": limit, "outcome": outcome, "text": text, **extra}


def _not_measured(bar: str, metric: str, probe: str, why: str, limit: float | None) -> dict[str, Any]:
    return _check(bar, metric, probe, "not_measured", f"{metric}: not measured ({why})", limit=limit)


def _bootstrap_kw() -> dict[str, Any]:
    return dict(BOOTSTRAP)


# -- checks, one function per bar ----------------------------------------------------------------

def perplexity_check(inputs: dict[str, Any], cand: str, bars: Bars) -> dict[str, Any]:
    bar, metric, limit = "perplexity_delta_max", "perplexity delta", bars.perplexity_delta_max
    probe = inputs["probes"].get("perplexity")
    if probe is None:
        return _not_measured(bar, metric, "perplexity", "perplexity probe not run", limit)
    row = probe["servers"].get(cand) or {}
    delta, ci = row.get("delta"), row.get("ci95")
    if delta is None:
        return _not_measured(bar, metric, "perplexity", f"no perplexity result for {cand}", limit)
    noise = row.get("noise")
    noise_text = f", reference noise {pct(noise)}" if noise is not None else ""
    if not (isinstance(ci, list) and len(ci) == 2 and None not in ci):
        return _check(bar, metric, "perplexity", "inconclusive",
                      f"{metric} {pct(delta)} has no interval: not shown to be under {pct(limit, False)}",
                      value=delta, limit=limit)
    outcome = bar_outcome(Interval(delta, ci[0], ci[1]), limit)
    text = f"{metric} {pct(delta)} {_iv(*ci)} vs bar {pct(limit, False)}{noise_text}: {outcome}"
    if outcome == "fail":
        text += f" (over the bar by at least {pct(ci[0] - limit, False)})"
    elif outcome == "inconclusive":
        text += " (the interval straddles the bar: more passages would settle it)"
    return _check(bar, metric, "perplexity", outcome, text, value=delta, interval=list(ci), limit=limit)


def _needle_pairs(cases: list[dict[str, Any]], ref: str, cand: str) -> tuple[list[int], list[int], dict[str, int]]:
    """Hit (1) / miss (0) on the cases both servers answered. A truncated answer (the cap cut it
    before any value) is not a retrieval failure and an error is not an answer: both are counted
    beside the comparison, not in it (the needle probe's own definition of recall)."""
    by_server: dict[str, dict[Any, str]] = defaultdict(dict)
    for case in cases:
        by_server[case["server"]][case.get("id")] = case["status"]
    r_rows, c_rows = by_server.get(ref, {}), by_server.get(cand, {})
    r_hit, c_hit = [], []
    stats = {"errors": 0, "truncated": 0, "ref_only": 0, "cand_only": 0}
    for case_id in sorted(set(r_rows) & set(c_rows), key=str):
        rs, cs = r_rows[case_id], c_rows[case_id]
        if "error" in (rs, cs):
            stats["errors"] += 1
        elif "truncated" in (rs, cs):
            stats["truncated"] += 1
        elif rs in ("hit", "miss") and cs in ("hit", "miss"):
            r_hit.append(int(rs == "hit"))
            c_hit.append(int(cs == "hit"))
            stats["ref_only"] += rs == "hit" and cs == "miss"
            stats["cand_only"] += cs == "hit" and rs == "miss"
    return r_hit, c_hit, stats


def needle_check(inputs: dict[str, Any], cand: str, bars: Bars) -> dict[str, Any]:
    """Recall drop vs the reference over the cases both answered (paired), with a paired bootstrap
    interval; cases truncated at the cap or failed on either side are reported, not scored."""
    bar, metric, limit = "needle_recall_drop_max", "needle recall drop", bars.needle_recall_drop_max
    probe = inputs["probes"].get("needle")
    ref = inputs["reference"]
    if probe is None:
        return _not_measured(bar, metric, "needle", "needle probe not run", limit)
    r_hit, c_hit, st = _needle_pairs(probe.get("cases") or [], ref, cand)
    if r_hit:
        n = len(r_hit)
        iv = paired_bootstrap(r_hit, c_hit, lambda r, c: r.mean(axis=-1) - c.mean(axis=-1), **_bootstrap_kw())
        outcome = bar_outcome(iv, limit)
        text = (f"needle recall {sum(c_hit)}/{n} vs reference {sum(r_hit)}/{n} on the same cases: drop "
                f"{iv.estimate:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}] vs bar {limit:.2f}: {outcome} "
                f"(reference-only hits {st['ref_only']}, candidate-only hits {st['cand_only']}")
        text += f", {st['truncated']} truncated at the cap on either side, not scored" if st["truncated"] else ""
        text += f", {st['errors']} cases with errors left out" if st["errors"] else ""
        text += ")"
        return _check(bar, metric, "needle", outcome, text, value=iv.estimate, interval=iv.as_list(),
                      limit=limit, pairs=n, ref_only=st["ref_only"], cand_only=st["cand_only"])
    rows = probe.get("servers") or {}
    r_rec, c_rec = (rows.get(ref) or {}).get("recall"), (rows.get(cand) or {}).get("recall")
    if r_rec is None or c_rec is None:
        return _not_measured(bar, metric, "needle", f"no needle cases for {ref} and {cand}", limit)
    drop = r_rec - c_rec
    outcome = "pass" if drop <= limit else "fail"  # no case list: counts only, point estimate
    return _check(bar, metric, "needle", outcome,
                  f"needle recall {c_rec:.2f} vs reference {r_rec:.2f} (drop {drop:+.2f}, no paired cases: "
                  f"point estimate) vs bar {limit:.2f}: {outcome}", value=drop, limit=limit)


def agreement_checks(inputs: dict[str, Any], cand: str, bars: Bars) -> list[dict[str, Any]]:
    """Optional bars (unset by default): mean KL divergence and top-1 agreement. With the probe's
    bootstrap interval (over passages) the interval rule applies; without one, the point value."""
    out = []
    probe = inputs["probes"].get("agreement")
    row = ((probe or {}).get("servers") or {}).get(cand) or {}
    for bar, key, metric, larger_is_worse in (("kl_mean_max", "kl_mean", "mean KL divergence", True),
                                              ("top1_agreement_min", "top1_agreement", "top-1 agreement", False)):
        limit = getattr(bars, bar)
        if limit is None:
            continue
        value = row.get(key)
        if value is None:
            why = "agreement probe not run" if probe is None else f"no {key} for {cand}"
            out.append(_not_measured(bar, metric, "agreement", why, limit))
            continue
        ci = row.get(f"{key}_ci95")
        ci = list(ci) if isinstance(ci, list) and len(ci) == 2 and None not in ci else None
        if ci is not None:
            outcome = bar_outcome(Interval(value, ci[0], ci[1]), limit, larger_is_worse=larger_is_worse)
            shown = f"{value:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"
        else:
            outcome = bar_outcome(Interval(value, value, value), limit, larger_is_worse=larger_is_worse)
            shown = f"{value:.4f} (no interval)"
        sign = "<=" if larger_is_worse else ">="
        out.append(_check(bar, metric, "agreement", outcome, f"{metric} {shown} vs bar {sign} {limit:.4f}: {outcome}",
                          value=value, interval=ci, limit=limit))
    return out


def case_key(case: dict[str, Any]) -> tuple[str, ...]:
    """A load case's identity: its workload shape (by name), concurrency and, open loop, its rate."""
    parts = [f"{k}={case[k]}" for k in ("shape", "name") if case.get(k) is not None]
    parts.append(f"agents={case.get('agents')}")
    if case.get("rate") is not None:
        parts.append(f"rate={case['rate']}")
    return tuple(parts)


def runs_by_case(cases: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Every run of each load case (a case's own repeats when it lists them, else the case itself),
    grouped by case_key."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for case in cases:
        groups[case_key(case)] += case.get("repeats") or [case]
    return groups


def _samples(cases: list[dict[str, Any]], key: str) -> list[float]:
    """One value per run of a case: a case's own repeats when it lists them, else each listed case."""
    out: list[float] = []
    for case in cases:
        rows = case.get("repeats") or [case]
        out += [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return out


def _ratio_check(bar: str, metric: str, case: str, ref: list[float], cand: list[float], limit: float,
                 *, loss_from_ratio: Any, describe: str) -> dict[str, Any]:
    if not ref or not cand or min(ref + cand) <= 0:
        return _not_measured(bar, metric, "load", f"no {metric} samples at {case}", limit) | {"case": case}
    if min(len(ref), len(cand)) < 2:
        point = (sum(cand) / len(cand)) / (sum(ref) / len(ref))
        loss = loss_from_ratio(point)
        return _check(bar, metric, "load", "inconclusive",
                      f"{metric} at {case}: {describe} {pct(loss)} from one run each, no interval "
                      f"(set load.repeats >= 2) vs bar {pct(limit, False)}: inconclusive",
                      value=loss, limit=limit, case=case, ratio=point)
    iv = ratio_interval(ref, cand)
    loss = loss_interval(iv, loss_from_ratio)
    outcome = bar_outcome(loss, limit)
    text = (f"{metric} at {case}: ratio {iv.estimate:.3f} [{iv.lo:.3f}, {iv.hi:.3f}] over "
            f"{len(ref)}+{len(cand)} runs, {describe} {pct(loss.estimate)} {_iv(loss.lo, loss.hi)} vs bar "
            f"{pct(limit, False)}: {outcome}")
    if outcome == "fail":
        text += f" (over the bar by at least {pct(loss.lo - limit, False)})"
    return _check(bar, metric, "load", outcome, text, value=loss.estimate, interval=loss.as_list(), limit=limit,
                  case=case, ratio=iv.estimate, ratio_interval=iv.as_list())


def load_checks(inputs: dict[str, Any], cand: str, bars: Bars) -> list[dict[str, Any]]:
    """Per load case: output-token throughput drop and p99 latency rises (TTFT, ITL, E2E) vs the
    reference, each with a Welch t interval over the case's repeated runs (stats.ratio_interval)."""
    probe = inputs["probes"].get("load")
    if probe is None:
        return [_not_measured("throughput_drop_max", "throughput drop", "load", "load probe not run",
                              bars.throughput_drop_max),
                _not_measured("p99_latency_rise_max", "p99 latency rise", "load", "load probe not run",
                              bars.p99_latency_rise_max)]
    servers = probe.get("servers") or {}

    def grouped(name: str) -> dict[tuple[str, ...], list[dict[str, Any]]]:
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for case in (servers.get(name) or {}).get("cases") or []:
            groups[case_key(case)].append(case)
        return groups

    ref_groups, cand_groups = grouped(inputs["reference"]), grouped(cand)
    if not ref_groups or not cand_groups:
        who = inputs["reference"] if not ref_groups else cand
        return [_not_measured("throughput_drop_max", "throughput drop", "load", f"no load cases for {who}",
                              bars.throughput_drop_max)]
    out = []
    for key in sorted(set(ref_groups) | set(cand_groups), key=natural_order):
        case = " ".join(key)
        if key not in ref_groups or key not in cand_groups:
            who = inputs["reference"] if key not in ref_groups else cand
            out.append(_not_measured("throughput_drop_max", "throughput drop", "load",
                                     f"{case} not measured on {who}", bars.throughput_drop_max) | {"case": case})
            continue
        rc, cc = ref_groups[key], cand_groups[key]
        failed = {kind: sum(int(c.get(kind) or 0) for c in cc) for kind in ("errors", "incomplete")}
        check = _ratio_check("throughput_drop_max", "throughput drop", case, _samples(rc, "output_tokens_per_s"),
                             _samples(cc, "output_tokens_per_s"), bars.throughput_drop_max,
                             loss_from_ratio=lambda r: 1 - r, describe="drop")
        if any(failed.values()):
            check["text"] += f"; {failed['errors']} failed and {failed['incomplete']} cut-off requests on {cand}"
        out.append(check)
        for key_p99, label in P99_KEYS:
            r, c = _samples(rc, key_p99), _samples(cc, key_p99)
            if not r and not c:
                continue  # the probe does not report this percentile
            out.append(_ratio_check("p99_latency_rise_max", f"{label} rise", case, r, c, bars.p99_latency_rise_max,
                                    loss_from_ratio=lambda x: x - 1, describe="rise"))
    return out


def natural_order(key: Iterable[str]) -> tuple[Any, ...]:
    out: list[Any] = []
    for part in key:
        name, _, value = part.partition("=")
        try:
            out.append((name, float(value), ""))
        except ValueError:
            out.append((name, float("inf"), value))
    return tuple(out)


def capacity_of(inputs: dict[str, Any], name: str) -> int | None:
    probe = inputs["probes"].get("capacity") or {}
    row = (probe.get("servers") or {}).get(name) or {}
    tokens = row.get("kv_cache_tokens")
    return int(tokens) if isinstance(tokens, int | float) else None


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
    checks = [perplexity_check(inputs, cand, bars), *agreement_checks(inputs, cand, bars),
              needle_check(inputs, cand, bars), *load_checks(inputs, cand, bars)]
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
    failed = [c for c in checks if c["outcome"] == "fail"]
    open_ = [c for c in checks if c["outcome"] in ("inconclusive", "not_measured")]

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
        reasons = [f"gains: {capacity_text}", f"passes every bar ({len(checks)} checks)"]
    if decision != "adopt" and gain is not None and decision != "no_gain":
        reasons.append(capacity_text)
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
               for c in decision["checks"]) or decision.get("capacity_gain") is None


def decide(inputs: dict[str, Any]) -> dict[str, Any]:
    """The decisions, the recommendation and the exit code from the inputs alone."""
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
    gives the same bytes (times come from the recorded events, not from the clock)."""
    meta = run.read_json("run.json")
    inputs = gather(run)
    verdict: dict[str, Any] = {
        "schema": SCHEMA,
        "rules": RULES,
        "method": {"bootstrap": BOOTSTRAP, "speed_interval": "Welch t on log values over repeated runs, 95%",
                   "interval_rule": "pass: whole interval within the bar; fail: whole interval beyond it; "
                   "else inconclusive"},
        "kvprobe_version": __version__,
        "run": {"id": run.path.name, "started": meta.get("started"), "measured_by": meta.get("kvprobe_version"),
                "probes_requested": meta.get("probes"), "resumed": meta.get("resumed") or [],
                "left_out": meta.get("left_out") or [], **_times(run)},
        **inputs,
    }
    verdict.update(decide(verdict))
    return verdict


def verdict_bytes(verdict: dict[str, Any]) -> bytes:
    return dumps(verdict)


def write_verdict(run: RunDir) -> tuple[dict[str, Any], bytes]:
    verdict = build_verdict(run)
    data = verdict_bytes(verdict)
    run.write_bytes("verdict.json", data)
    return verdict, data


def rederive(verdict: dict[str, Any]) -> list[str]:
    """Differences between the verdict's recorded decisions and those its own numbers give now."""
    if verdict.get("schema") != SCHEMA or verdict.get("rules") != RULES:
        return [f"verdict schema {verdict.get('schema')!r} / rules {verdict.get('rules')!r} are not "
                f"{SCHEMA} / {RULES}: this kvprobe cannot re-derive it"]
    missing = [k for k in (*INPUT_KEYS, *DERIVED_KEYS) if k not in verdict]
    if missing:
        return [f"verdict lacks {', '.join(missing)}"]
    try:
        again = decide({k: verdict[k] for k in INPUT_KEYS})
    except (KeyError, TypeError, ValueError) as exc:
        return [f"the verdict's numbers cannot be decided again: {exc}"]
    problems = []
    recorded = verdict["decisions"]
    for name in sorted(set(recorded) | set(again["decisions"])):
        was, now = recorded.get(name) or {}, again["decisions"].get(name) or {}
        if was.get("decision") != now.get("decision"):
            problems.append(f"{name}: recorded decision {was.get('decision')!r}, the numbers give "
                            f"{now.get('decision')!r}")
        elif was != now:
            problems.append(f"{name}: recorded reasons or checks differ from what the numbers give")
    if verdict["recommendation"] != again["recommendation"]:
        problems.append(f"recommendation: recorded {verdict['recommendation'].get('server')!r}, the numbers give "
                        f"{again['recommendation']['server']!r}")
    if verdict["exit_code"] != again["exit_code"]:
        problems.append(f"exit_code: recorded {verdict['exit_code']}, the numbers give {again['exit_code']}")
    return problems
