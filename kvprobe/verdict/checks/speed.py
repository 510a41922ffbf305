"""Speed checks: one primary endpoint declared before the run, decided by a group-sequential test on
paired blocks (kvprobe.stats.sequential), and per-case guardrails that never gate adopt.

A block is one run of every case on the reference and on the candidate, back to back; its repeat
index pairs them. The primary endpoint is output tokens/s, as the mean over the sweep's cases of the
per-case log ratio (or one declared case), optionally beside a latency percentile at the same scope.
A block in which the client could have moved the compared numbers (client_limited: for throughput, the
two sides' mean loop lag differing by over a quarter of the bar of the request span they share; for a
latency, either side's lateness) is dropped and counted; the probe runs another in its place. What lateness
remains is taken out of each throughput ratio (kvprobe.stats.client_limit.lateness_move): the same lag on
both sides reads larger on the faster server and would pull every ratio toward 1.

Guardrails: every case x (throughput, TTFT/ITL/E2E p99), a paired t over the blocks with Holm's
step-down across the candidate's guardrails. They fail only past twice the bar, so a single
catastrophic case still shows, and otherwise they are information (`gating: false`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kvprobe.stats import sequential, t_quantile
from kvprobe.stats.client_limit import P99_KEYS, lateness_move, limited, paired_lateness
from kvprobe.verdict.checks._common import make_check, not_measured, pct

GUARD_FACTOR = 2.0  # a guardrail fails only past this multiple of its bar
# An undecided endpoint whose advice would need more than this multiple of the design's blocks is told that
# the design cannot settle it: a count like "+24,273 blocks" (a recorded H200 run) is no advice.
UNSETTLED_FACTOR = 10
UNSETTLED_WORDS = "this design cannot settle it: lengthen the budget or quiet the servers"
LATENESS_SAID = 0.001  # a mean lateness correction of a tenth of a percent or more is said in the words
THROUGHPUT = "output_tokens_per_s"
LATENCY_ENDPOINTS = {"itl_p99": ("itl_p99_s", "ITL p99"), "tpot_p99": ("tpot_p99_s", "TPOT p99"),
                     "ttft_p90": ("ttft_p90_s", "TTFT p90"), "e2e_p90": ("e2e_p90_s", "E2E p90"),
                     "ttft_p99": ("ttft_p99_s", "TTFT p99"), "e2e_p99": ("e2e_p99_s", "E2E p99")}


def case_key(case: dict[str, Any]) -> tuple[str, ...]:
    """A load case's identity: its workload shape (by name), concurrency and, open loop, its rate."""
    parts = [f"{k}={case[k]}" for k in ("shape", "name") if case.get(k) is not None]
    parts.append(f"agents={case.get('agents')}")
    if case.get("rate") is not None:
        parts.append(f"rate={case['rate']}")
    return tuple(parts)


def case_fields(case: dict[str, Any]) -> dict[str, Any]:
    """The parts of case_key as typed fields ({"shape": "default", "agents": 1}): a dashboard filters on
    them without parsing the case's words."""
    fields = {k: case[k] for k in ("shape", "name") if case.get(k) is not None}
    fields["agents"] = case.get("agents")
    if case.get("rate") is not None:
        fields["rate"] = case["rate"]
    return fields


def runs_by_case(cases: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Every run of each load case (a case's own repeats when it lists them, else the case itself),
    grouped by case_key."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for case in cases:
        groups[case_key(case)] += case.get("repeats") or [case]
    return groups


def natural_order(key: Iterable[str]) -> tuple[Any, ...]:
    out: list[Any] = []
    for part in key:
        name, _, value = part.partition("=")
        try:
            out.append((name, float(value), ""))
        except ValueError:
            out.append((name, float("inf"), value))
    return tuple(out)


def _limited(run: dict[str, Any], bars: Any) -> str | None:
    if not any(k.startswith("client_") and k != "client_limited_why" for k in run):
        return None  # recorded before kvprobe measured its client
    return limited(run, run, bars.p99_latency_rise_max, bars.throughput_drop_max)


def _throughput_limited(ref: dict[str, Any], cand: dict[str, Any], names: tuple[str, str],
                        bar: float) -> tuple[str, str] | None:
    """(the server, why) where the client, not the servers, could have moved one block's paired throughput
    ratio; None where it could not."""
    found = paired_lateness(ref, cand)
    if found is None:
        return None
    effect, lag_ref, lag_cand = found
    if math.isinf(effect):
        return names[1] if effect > 0 else names[0], "the client used a whole core"
    if abs(effect) > 0.25 * bar:
        return (names[1] if effect > 0 else names[0],
                f"the client sent its turns {abs(effect):.1%} of a request's median span later than the other's "
                f"({names[0]} {lag_ref * 1000:.2f} ms, {names[1]} {lag_cand * 1000:.2f} ms late on average, over "
                f"the span both share), over a quarter of the {bar:.0%} throughput bar")
    return None


class Blocks:
    """The paired runs of a reference and a candidate, by block (repeat index) and case."""

    def __init__(self, ref: dict[tuple[str, ...], list[dict[str, Any]]],
                 cand: dict[tuple[str, ...], list[dict[str, Any]]], bars: Any,
                 names: tuple[str, str] = ("reference", "candidate"),
                 open_loop: set[tuple[str, ...]] | None = None) -> None:
        def index(groups: dict[tuple[str, ...], list[dict[str, Any]]]) -> dict[tuple[tuple[str, ...], int], dict]:
            return {(key, int(run.get("repeat", i))): run for key, runs in groups.items()
                    for i, run in enumerate(runs)}

        self.ref, self.cand = index(ref), index(cand)
        # Open loop, arrivals keep their schedule whatever the client's lag: no cycle is stretched to correct.
        self.open_loop = open_loop or set()
        self.cases = sorted(set(ref) & set(cand), key=natural_order)
        self.bars = bars
        # (case, block) whose latency figures the client could have moved on either server, with the
        # first reason (the verdict carries it beside the count of blocks dropped)
        self.limited: dict[tuple[tuple[str, ...], int], str] = {}
        for name, runs in zip(names, (self.ref, self.cand), strict=True):
            for (key, b), run in runs.items():
                why = _limited(run, bars) if key in self.cases else None
                if why and (key, b) not in self.limited:
                    self.limited[(key, b)] = f"{name} block {b + 1} at {' '.join(key)}: {why}"
        # Throughput is paired: a closed-loop client that sends each turn late lightens that server's load by
        # about lag / span, so it moves the block's log ratio by about the lags' difference over the span. Each
        # side's lag is the client's own figure and both are read over one shared span (rules/6): judged over
        # each server's own span (rules/5), the same lag reads larger on the faster server, so the drop picked
        # blocks by their own ratio, and with a busy client (3.5% of a span late on both sides) skewed blocks
        # at the bar passed 12% (benchmarks/client_limited_selection.py). A block is the client's where the
        # difference is over a quarter of the bar, or where either client used a whole core. Equal lateness on
        # both sides (a busy 2-core box) drops nothing: judged side by side (rules/4), 7 of 13 blocks of a CPU
        # demo were dropped for lateness of 0.6-2.4% on one side; the paired rule drops 1 of them.
        self.limited_throughput: dict[tuple[tuple[str, ...], int], str] = {}
        for (key, b), ref_run in self.ref.items():
            cand_run = self.cand.get((key, b))
            if cand_run is None or key not in self.cases:
                continue
            found = _throughput_limited(ref_run, cand_run, names, bars.throughput_drop_max)
            if found:
                self.limited_throughput[(key, b)] = f"{found[0]} block {b + 1} at {' '.join(key)}: {found[1]}"

    def complete(self, scope: list[tuple[str, ...]]) -> list[int]:
        """Blocks with both servers' runs of every case in scope, in order."""
        ids = {b for (_, b) in self.ref} & {b for (_, b) in self.cand}
        return sorted(b for b in ids if all((k, b) in self.ref and (k, b) in self.cand for k in scope))

    def losses(self, scope: list[tuple[str, ...]], key: str, *, drop: bool) -> tuple[list[float], list[int], int]:
        """Per usable block, the mean over `scope` of the paired log loss (larger is worse); the usable
        block ids; and how many complete blocks were dropped as client-limited."""
        out, used, dropped = [], [], 0
        limited = self.limited_throughput if key == THROUGHPUT else self.limited
        for b in self.complete(scope):
            if any((k, b) in limited for k in scope):
                dropped += 1
                continue
            pairs = [(self.ref[(k, b)].get(key), self.cand[(k, b)].get(key)) for k in scope]
            if not all(isinstance(r, int | float) and isinstance(c, int | float) and r > 0 and c > 0
                       for r, c in pairs):
                continue
            logs = [math.log(r / c) if drop else math.log(c / r) for r, c in pairs]
            if key == THROUGHPUT and drop:  # what the client's lateness can have moved, taken out (rules/6)
                logs = [x - self.move(k, b) for x, k in zip(logs, scope, strict=True)]
            out.append(math.fsum(logs) / len(logs))
            used.append(b)
        return out, used, dropped

    def move(self, case: tuple[str, ...], block: int) -> float:
        """What the client's lateness can have moved this case's paired log throughput ratio in this block."""
        if case in self.open_loop:
            return 0.0
        return lateness_move(self.ref[(case, block)], self.cand[(case, block)])

    def correction(self, scope: list[tuple[str, ...]], used: list[int]) -> float | None:
        """The mean lateness correction over `used`, the blocks `losses` used for throughput (None: none)."""
        if not used:
            return None
        return math.fsum(self.move(k, b) for b in used for k in scope) / (len(used) * len(scope))

    def dropped_reason(self, scope: list[tuple[str, ...]], key: str) -> str | None:
        """Why the first block `losses` dropped was the client's, or None when none was."""
        limited = self.limited_throughput if key == THROUGHPUT else self.limited
        for b in self.complete(scope):
            for k in scope:
                if (k, b) in limited:
                    return limited[(k, b)]
        return None


def _scope(load: dict[str, Any], cases: list[tuple[str, ...]]) -> tuple[list[tuple[str, ...]], str] | None:
    endpoint = (load.get("design") or {}).get("endpoint", "sweep")
    if endpoint == "sweep":
        return cases, f"sweep mean of {len(cases)} case{'s' if len(cases) != 1 else ''}"
    picked = [k for k in cases if f"agents={endpoint}" in k]
    return (picked, f"agents={endpoint}") if picked else None


def _margin(bar: float, drop: bool) -> float:
    return -math.log1p(-bar) if drop else math.log1p(bar)


def _loss_of(log_loss: float, drop: bool) -> float:
    """A log loss back in the bar's units: a relative drop (throughput) or rise (latency)."""
    return -math.expm1(-log_loss) if drop else math.expm1(log_loss)


def endpoint_check(check_id: str, bar_name: str, metric: str, losses: list[float], dropped: int, scope_text: str,
                   limit: float, plan: sequential.Design, *, drop: bool, stop: str | None = None) -> dict[str, Any]:
    """The sequential decision on one primary endpoint. `stop`: why the probe ended before n_max blocks
    (a budget, a broken server), for the words of an undecided endpoint: past UNSETTLED_FACTOR x the
    design's blocks they say the design cannot settle it, not a count."""
    margin = _margin(limit, drop)
    at = sequential.settle(losses, margin, plan)
    seq: dict[str, Any] = {"design": plan.as_dict(), "blocks": len(losses), "dropped_client_limited": dropped,
                           "drift_per_block": sequential.drift(losses), "scope": scope_text}
    dropped_text = f"; {dropped} client-limited block{'s' if dropped != 1 else ''} dropped" if dropped else ""
    if at is None:
        # one usable block at most: no spread, so no interval; spent once the design has no more blocks
        state = "spent" if stop or len(losses) >= plan.n_max else "open"
        check = make_check(check_id, bar_name, metric, "load", "inconclusive",
                           f"{metric}: {len(losses)} paired block{'s' if len(losses) != 1 else ''}, "
                           f"no interval{dropped_text}: inconclusive" + (f" ({stop})" if stop else ""),
                           limit=limit, gating=True, sequential=seq, state=state)
        return check
    seq["look"] = at.as_dict()
    ratio = math.exp(-at.mean) if drop else math.exp(at.mean)
    value = _loss_of(at.mean, drop)
    bounded = math.isfinite(at.lo) and math.isfinite(at.hi)  # before the first look there is no boundary
    lo_r, hi_r = ((math.exp(-at.hi), math.exp(-at.lo)) if drop else (math.exp(at.lo), math.exp(at.hi))) \
        if bounded else (None, None)
    interval = [_loss_of(at.lo, drop), _loss_of(at.hi, drop)] if bounded else None
    looks = [n for n in plan.looks if n <= at.n]
    t_best = max(at.t_pass, at.t_fail)
    side = "pass" if at.t_pass >= at.t_fail else "fail"
    b = at.boundary if side == "pass" else plan.fail_boundary(min(at.n, plan.n_max))
    crossing = f"{side} boundary t > {b:.2f} (t = {t_best:.2f})" if math.isfinite(b) else "no boundary yet"
    if not at.at_look and math.isfinite(b):
        # A look the design did not plan never decides, so it quotes no boundary it could seem to
        # cross (rules/4 printed "pass boundary t > 4.86 (t = 5.30) ... inconclusive")
        crossing = f"{at.n} blocks is not a planned look: no decision there (t = {t_best:.2f})"
    drift = seq["drift_per_block"]
    drift_text = f"; drift {pct(-drift if drop else drift)}/block (information)" if drift is not None else ""
    band = f"[{lo_r:.3f}, {hi_r:.3f}]" if bounded else "(no interval before the first look)"
    head = (f"{metric}: ratio {ratio:.3f} {band} over {at.n} paired blocks, "
            f"looks at {', '.join(map(str, looks)) or 'none yet'} of {plan.n_max}, {crossing}")
    if at.outcome in ("pass", "fail"):
        outcome, state = at.outcome, "decided"
        tail = f": {outcome}"
    else:
        outcome = "inconclusive"
        if at.outcome == "inconclusive":
            state, why = "spent", f"all {plan.n_max} blocks used"
        else:
            state, why = ("spent", stop) if stop else ("open", "not yet")
        more = at.more_blocks if at.more_blocks is not None else sequential._more_blocks(
            at.n, at.mean, at.sd, margin, plan)
        if more and at.n + more > UNSETTLED_FACTOR * plan.n_max:
            advice = f"; {UNSETTLED_WORDS}"
        else:
            advice = (f"; about {more} more blocks would settle it {sequential.ADVICE_POWER:.0%} of the time if the "
                      "estimate holds") if more else ""
        tail = f": inconclusive ({why}{advice})" if state == "spent" else f": {why}"
    check = make_check(check_id, bar_name, metric, "load", outcome, head + dropped_text + drift_text + tail,
                       value=value, interval=interval, limit=limit, ratio=ratio,
                       ratio_interval=[lo_r, hi_r] if bounded else None,
                       gating=True, sequential=seq, state=state)
    return check


def _guardrails(blocks: Blocks, bars: Any, fields: dict[tuple[str, ...], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every case x metric, paired over the usable blocks; Holm over the family, at twice the bar.
    `fields`: each case's case_fields."""
    rows = []
    for key in blocks.cases:
        case = " ".join(key)
        base = f"load.{case.replace(' ', '.')}"
        specs = [(f"{base}.throughput_drop", "throughput_drop_max", "throughput drop", THROUGHPUT,
                  bars.throughput_drop_max, True)]
        specs += [(f"{base}.{k.removesuffix('_s')}_rise", "p99_latency_rise_max", f"{label} rise", k,
                   bars.p99_latency_rise_max, False) for k, label in P99_KEYS]
        for check_id, bar_name, metric, field, bar, drop in specs:
            losses, _, dropped = blocks.losses([key], field, drop=drop)
            rows.append((check_id, bar_name, metric, case, bar, drop, losses, dropped, key, field))
    family = [r for r in rows if len(r[6]) >= 2]  # r[6]: the usable block losses
    m = max(len(family), 1)
    alpha = sequential.ALPHA
    # Holm's step-down on H0: loss <= GUARD_FACTOR x bar, one-sided p from the paired t.
    pvals = {}
    for r in family:
        losses, margin = r[6], _margin(GUARD_FACTOR * r[4], r[5])
        n = len(losses)
        mean = math.fsum(losses) / n
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in losses) / (n - 1))
        se = sd / math.sqrt(n)
        pvals[r[0]] = (mean, se, n, _p_above(mean - margin, se, n - 1))
    rejected: set[str] = set()
    for i, (cid, (_, _, _, p)) in enumerate(sorted(pvals.items(), key=lambda kv: kv[1][3])):
        if p > alpha / (m - i):
            break
        rejected.add(cid)
    out = []
    for check_id, bar_name, metric, case, bar, drop, losses, dropped, key, field in rows:
        limit = GUARD_FACTOR * bar
        limited_text = f", {dropped} client-limited dropped" if dropped else ""
        structured = {"case_fields": fields[key], "dropped_client_limited": dropped,
                      "client_limited_reason": blocks.dropped_reason([key], field)}
        if check_id not in pvals:
            out.append(not_measured(check_id, bar_name, metric, "load",
                                    f"{len(losses)} usable paired block{'s' if len(losses) != 1 else ''} at {case}"
                                    + limited_text, limit, case) | {"gating": False} | structured)
            continue
        mean, se, n, _ = pvals[check_id]
        half = t_quantile(1 - alpha / m, n - 1) * se if se > 0 else 0.0
        lo, hi = mean - half, mean + half
        margin = _margin(limit, drop)
        outcome = "fail" if check_id in rejected else ("pass" if hi < margin else "inconclusive")
        ratio = math.exp(-mean) if drop else math.exp(mean)
        r_lo, r_hi = (math.exp(-hi), math.exp(-lo)) if drop else (math.exp(lo), math.exp(hi))
        text = (f"guardrail {metric} at {case}: ratio {ratio:.3f} [{r_lo:.3f}, {r_hi:.3f}] over {n} paired blocks "
                f"(Holm over {m}{limited_text}), {'drop' if drop else 'rise'} {pct(_loss_of(mean, drop))} vs guardrail "
                f"{pct(limit, False)} (2x the bar): {outcome}" + ("" if outcome == "fail" else ", never gates adopt"))
        out.append(make_check(check_id, bar_name, metric, "load", outcome, text, value=_loss_of(mean, drop),
                              interval=[_loss_of(lo, drop), _loss_of(hi, drop)], limit=limit, case=case,
                              ratio=ratio, ratio_interval=[r_lo, r_hi], gating=False, **structured))
    return out


def _p_above(diff: float, se: float, df: int) -> float:
    """One-sided p of a paired t test of H0: mean <= margin (diff = mean - margin)."""
    from scipy.stats import t as student

    if se <= 0:
        return 0.0 if diff > 0 else 1.0
    return float(student.sf(diff / se, df))


# What a load check carries beside its words from verdict schema 3 on (kvprobe.verdict.checks.STRUCTURED_KEYS):
# blocks dropped because the client, not the server, set the pace, and why the first one was.
_NONE_DROPPED = {"dropped_client_limited": 0, "client_limited_reason": None}


def load_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """The primary endpoint(s), then the guardrails."""
    return [_NONE_DROPPED | check for check in _load_checks(inputs, cand, bars)]


def _load_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    probe = inputs["probes"].get("load")
    if probe is None:
        from kvprobe.verdict.checks._common import probe_missing

        why = probe_missing(inputs, "load")
        return [not_measured("load.endpoint.throughput_drop", "throughput_drop_max", "throughput drop", "load", why,
                             bars.throughput_drop_max)]
    servers = probe.get("servers") or {}
    design = probe.get("design") or {}

    def grouped(name: str) -> dict[tuple[str, ...], list[dict[str, Any]]]:
        return runs_by_case((servers.get(name) or {}).get("cases") or [])

    ref_groups, cand_groups = grouped(inputs["reference"]), grouped(cand)
    if not ref_groups or not cand_groups:
        who = inputs["reference"] if not ref_groups else cand
        # why the probe left it out (a candidate another probe had already rejected), where it says
        why = (probe.get("stops") or {}).get(cand) if ref_groups else None
        return [not_measured("load.endpoint.throughput_drop", "throughput_drop_max", "throughput drop", "load",
                             why or f"no load cases for {who}", bars.throughput_drop_max)]
    cases = [c for name in (inputs["reference"], cand) for c in (servers.get(name) or {}).get("cases") or []]
    open_loop = {case_key(c) for c in cases if c.get("mode") == "open"}
    blocks = Blocks(ref_groups, cand_groups, bars, (inputs["reference"], cand), open_loop)
    fields = {case_key(c): case_fields(c) for c in cases}
    plan = sequential.of_settings(design)
    stop = (probe.get("stops") or {}).get(cand)
    out = []
    scoped = _scope(probe, blocks.cases)
    if scoped is None:
        out.append(not_measured("load.endpoint.throughput_drop", "throughput_drop_max", "throughput drop", "load",
                                f"the endpoint case agents={design.get('endpoint')} was not measured on both",
                                bars.throughput_drop_max))
    else:
        scope, scope_text = scoped
        scope_cases = [fields[k] for k in scope]
        losses, used, dropped = blocks.losses(scope, THROUGHPUT, drop=True)
        endpoint = endpoint_check("load.endpoint.throughput_drop", "throughput_drop_max",
                                  f"throughput drop, {scope_text}",
                                  losses, dropped, scope_text, bars.throughput_drop_max, plan, drop=True, stop=stop)
        correction = blocks.correction(scope, used)
        if correction is not None:
            endpoint["sequential"]["lateness_correction"] = round(correction, 6)
            if abs(correction) >= LATENESS_SAID:
                endpoint["text"] += ("; the client's lateness could have made the candidate look "
                                     f"{abs(correction):.2%} {'slower' if correction > 0 else 'faster'} on "
                                     "average: taken out of each block")
        out.append(endpoint | {"scope_cases": scope_cases, "dropped_client_limited": dropped,
                               "client_limited_reason": blocks.dropped_reason(scope, THROUGHPUT)})
        latency = design.get("latency_endpoint")
        if latency:
            key, label = LATENCY_ENDPOINTS[latency]
            losses, _, dropped = blocks.losses(scope, key, drop=False)
            out.append(endpoint_check(f"load.endpoint.{latency}_rise", "p99_latency_rise_max",
                                      f"{label} rise, {scope_text}", losses, dropped, scope_text,
                                      bars.p99_latency_rise_max, plan, drop=False, stop=stop)
                       | {"scope_cases": scope_cases, "dropped_client_limited": dropped,
                          "client_limited_reason": blocks.dropped_reason(scope, key)})
    out += _guardrails(blocks, bars, fields)
    if design.get("advisory"):
        # Declared before the run (a canary's --advisory-speed): reported, never deciding.
        for check in out:
            check.update(gating=False, advisory=True)
            check["text"] += " (advisory: never changes the decision)"
    return out

