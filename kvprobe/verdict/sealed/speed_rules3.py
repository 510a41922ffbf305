"""rules/3's speed checks, frozen so `kvprobe verify` re-derives a rules/3 verdict under its own rules
(kvprobe.verdict.checks.speed is the current design).

Per load case, the output-token throughput drop and the p99 latency rises (TTFT,
ITL, E2E) against the reference, each with a Welch t interval on log values over the case's repeated
runs (kvprobe.stats.welch_log_ratio). A case whose client could have moved its numbers is not
judged (client_limited), and its power figures say so: more runs would not help, a quieter client
would.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from kvprobe.verdict.sealed.client_limit import P99_KEYS, limited
from kvprobe.verdict.sealed.common import iv_text, judged, make_check, not_measured, pct, probe_missing, with_power
from kvprobe.verdict.sealed.speed import case_key, natural_order  # the case identity rules/3 and /4 share
from kvprobe.verdict.sealed.stats import loss_interval, welch_log_ratio


def _samples(cases: list[dict[str, Any]], key: str) -> list[float]:
    out: list[float] = []
    for case in cases:
        rows = case.get("repeats") or [case]
        out += [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return out


def _ratio_check(check_id: str, bar: str, metric: str, case: str, ref: list[float], cand: list[float],
                 limit: float, *, drop: bool) -> dict[str, Any]:
    describe = "drop" if drop else "rise"

    def loss_of(r: float) -> float:
        return 1 - r if drop else r - 1

    if not ref or not cand:
        return not_measured(check_id, bar, metric, "load", f"no {metric} samples at {case}", limit, case)
    if min(ref + cand) <= 0:
        # A p99 ITL of 0 is real: the client read every token of nearly every request in one go.
        return not_measured(check_id, bar, metric, "load", f"a run at {case} recorded 0, which has no ratio",
                            limit, case)
    if min(len(ref), len(cand)) < 2:
        point = (sum(cand) / len(cand)) / (sum(ref) / len(ref))
        return make_check(check_id, bar, metric, "load", "inconclusive",
                          f"{metric} at {case}: {describe} {pct(loss_of(point))} from one run each, no interval "
                          f"(set load.repeats >= 2) vs bar {pct(limit, False)}: inconclusive",
                          value=loss_of(point), limit=limit, case=case, ratio=point)
    iv = welch_log_ratio(ref, cand)
    loss = loss_interval(iv, loss_of)
    outcome = judged(loss, limit)
    text = (f"{metric} at {case}: ratio {iv.estimate:.3f} [{iv.lo:.3f}, {iv.hi:.3f}] over "
            f"{len(ref)}+{len(cand)} runs, {describe} {pct(loss.estimate)} {iv_text(loss.lo, loss.hi)} vs bar "
            f"{pct(limit, False)}: {outcome}")
    if outcome == "fail":
        text += f" (over the bar by at least {pct(loss.lo - limit, False)})"
    check = make_check(check_id, bar, metric, "load", outcome, text, value=loss.estimate, interval=loss.as_list(),
                       limit=limit, case=case, ratio=iv.estimate, ratio_interval=iv.as_list())
    se, df = iv.se, iv.df
    # Power on the log scale, where the interval is built: the bar there, and the figures back in loss units.
    log_bar = -math.log1p(-limit) if drop else math.log1p(limit)
    check = with_power(check, min(len(ref), len(cand)), "runs", se, df, log_bar, log_margin=log_bar, sd_df=df,
                       df_kind="welch")
    block = check.get("power")
    if block:
        back = (lambda v: -math.expm1(-v)) if drop else math.expm1
        block["scale"] = "log ratio"
        for key in ("passes_at_most", "fails_at_least"):
            if block.get(key) is not None:
                block[key] = back(block[key])
    return check


def _p99_metric(label: str) -> str:
    return f"{label} rise"  # "TTFT p99 rise": the metric and its percentile, never just the bar's name


def load_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """Per load case: output-token throughput drop and p99 latency rises vs the reference."""
    probe = inputs["probes"].get("load")
    if probe is None:
        why = probe_missing(inputs, "load")
        return [not_measured("load.throughput_drop", "throughput_drop_max", "throughput drop", "load", why,
                             bars.throughput_drop_max),
                not_measured("load.p99_latency_rise", "p99_latency_rise_max", "p99 latency rise", "load", why,
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
        return [not_measured("load.throughput_drop", "throughput_drop_max", "throughput drop", "load",
                             f"no load cases for {who}", bars.throughput_drop_max)]
    out = []
    for key in sorted(set(ref_groups) | set(cand_groups), key=natural_order):
        case = " ".join(key)
        tp_id = f"load.{case.replace(' ', '.')}.throughput_drop"
        if key not in ref_groups or key not in cand_groups:
            who = inputs["reference"] if key not in ref_groups else cand
            out.append(not_measured(tp_id, "throughput_drop_max", "throughput drop", "load",
                                    f"{case} not measured on {who}", bars.throughput_drop_max, case))
            continue
        rc, cc = ref_groups[key], cand_groups[key]
        first = len(out)
        failed = {kind: sum(int(c.get(kind) or 0) for c in cc) for kind in ("errors", "incomplete")}
        check = _ratio_check(tp_id, "throughput_drop_max", "throughput drop", case,
                             _samples(rc, "output_tokens_per_s"), _samples(cc, "output_tokens_per_s"),
                             bars.throughput_drop_max, drop=True)
        if any(failed.values()):
            check["text"] += f"; {failed['errors']} failed and {failed['incomplete']} cut-off requests on {cand}"
        out.append(check)
        for key_p99, label in P99_KEYS:
            r, c = _samples(rc, key_p99), _samples(cc, key_p99)
            if not r and not c:
                continue  # the probe does not report this percentile
            metric_id = key_p99.removesuffix("_s")
            out.append(_ratio_check(f"load.{case.replace(' ', '.')}.{metric_id}_rise", "p99_latency_rise_max",
                                    _p99_metric(label), case, r, c, bars.p99_latency_rise_max, drop=False))
        why = _client_limited({inputs["reference"]: rc, cand: cc}, bars)
        if why:
            for check in out[first:]:
                check["client_limited"] = why
                judged_before = check["outcome"] in ("pass", "fail")
                check["outcome"] = "inconclusive" if judged_before else check["outcome"]
                check["text"] += f"; {'not judged' if judged_before else 'also'}: client-limited ({why})"
                if "power" in check:
                    check["power"]["client_limited"] = True
    return out


def _client_limited(groups: dict[str, list[dict[str, Any]]], bars: Any) -> str | None:
    """The first run of this case, on either server, whose client could have moved a p99 by more than
    a tenth of the bar (kvprobe.stats.client_limit.limited, on the recorded client figures)."""
    for name, cases in groups.items():
        for run in (r for case in cases for r in (case.get("repeats") or [case])):
            if not any(k.startswith("client_") and k != "client_limited_why" for k in run):
                continue  # recorded before kvprobe measured its client
            why = limited(run, run, bars.p99_latency_rise_max, bars.throughput_drop_max)
            if why:
                return f"{name} run {int(run.get('repeat', 0)) + 1}: {why}"
    return None

