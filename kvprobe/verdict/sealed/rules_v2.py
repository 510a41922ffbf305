"""kvprobe.rules/2, frozen: the checks and decisions of verdicts written before rules/3.

`kvprobe verify` re-derives a verdict under the rules it was written with; this module is those
rules exactly as they were (percentile bootstrap on paired outcomes, truncated cases left out of the
pairing, power as "detectable" and "needed"). Do not edit it to change behaviour: a new rule is a
new rules version in kvprobe.verdict.checks and kvprobe.verdict.build. Its tests re-derive real rules/2 verdicts
(tests/fixtures/runs/) byte for byte.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvprobe.verdict.sealed.exits import EXIT_BAR_FAILED, EXIT_BROKEN, EXIT_INVALID, EXIT_OK
from kvprobe.verdict.sealed.stats import (
    Interval,
    bar_outcome,
    log_ratio_se,
    loss_interval,
    paired_bootstrap,
    ratio_interval,
)

RULES = "kvprobe.rules/2"
SCHEMA = "kvprobe.verdict/1"
DEFAULT_KNOB = "kv_cache_dtype"
P99_KEYS = (("ttft_p99_s", "TTFT p99"), ("itl_p99_s", "ITL p99"), ("e2e_p99_s", "E2E p99"))
CPU_LIMIT = 0.9


@dataclass(frozen=True)
class _Bars:
    """The bars as a rules/2 verdict recorded them (every field present)."""

    perplexity_delta_max: float = 0.01
    needle_recall_drop_max: float = 0.0
    capacity_gain_min: float = 0.05
    throughput_drop_max: float = 0.05
    p99_latency_rise_max: float = 0.10
    kl_mean_max: float | None = None
    task_accuracy_drop_max: float | dict[str, float] = 0.02
    top1_agreement_min: float | None = None

    def task_bar(self, task: str) -> float | None:
        bar = self.task_accuracy_drop_max
        return bar if not isinstance(bar, dict) else bar.get(task, bar.get("default"))


def _bars(data: dict[str, Any]) -> _Bars:
    known = set(_Bars.__dataclass_fields__)
    return _Bars(**{k: v for k, v in data.items() if k in known})


# -- power (rules/2) ----------------------------------------------------------------------
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


# -- checks (rules/2) ---------------------------------------------------------------------

BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95}


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


def _with_power(check: dict[str, Any], n: int, unit: str, se: float | None) -> dict[str, Any]:
    """The check with its power figures, and for an inconclusive one what would settle it in its text."""
    if check["outcome"] == "not_measured":
        return check
    block = figures(n, unit, se, check["value"], check["limit"], check["outcome"]) if n >= 1 else None
    if block is not None:
        check["power"] = block
    if check["outcome"] == "inconclusive" and check.get("interval") is not None:
        said = advice(block)
        check["text"] += " (the interval straddles the bar" + (f": {said})" if said else ")")
    return check


def _interval_se(ci: Any) -> float | None:
    return se_from_interval(ci[0], ci[1]) if isinstance(ci, list) and len(ci) == 2 and None not in ci else None


# -- checks, one function per bar ----------------------------------------------------------------

def perplexity_check(inputs: dict[str, Any], cand: str, bars: _Bars) -> dict[str, Any]:
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
    check = _check(bar, metric, "perplexity", outcome, text, value=delta, interval=list(ci), limit=limit)
    return _with_power(check, int(row.get("docs") or 0), "passages", _interval_se(ci))


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


def needle_check(inputs: dict[str, Any], cand: str, bars: _Bars) -> dict[str, Any]:
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
        check = _check(bar, metric, "needle", outcome, text, value=iv.estimate, interval=iv.as_list(),
                       limit=limit, pairs=n, ref_only=st["ref_only"], cand_only=st["cand_only"])
        return _with_power(check, n, "needles", binary_se(n, st["ref_only"], st["cand_only"]))
    rows = probe.get("servers") or {}
    r_rec, c_rec = (rows.get(ref) or {}).get("recall"), (rows.get(cand) or {}).get("recall")
    if r_rec is None or c_rec is None:
        return _not_measured(bar, metric, "needle", f"no needle cases for {ref} and {cand}", limit)
    drop = r_rec - c_rec
    outcome = "pass" if drop <= limit else "fail"  # no case list: counts only, point estimate
    return _check(bar, metric, "needle", outcome,
                  f"needle recall {c_rec:.2f} vs reference {r_rec:.2f} (drop {drop:+.2f}, no paired cases: "
                  f"point estimate) vs bar {limit:.2f}: {outcome}", value=drop, limit=limit)


def agreement_checks(inputs: dict[str, Any], cand: str, bars: _Bars) -> list[dict[str, Any]]:
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
        check = _check(bar, metric, "agreement", outcome, f"{metric} {shown} vs bar {sign} {limit:.4f}: {outcome}",
                       value=value, interval=ci, limit=limit)
        out.append(_with_power(check, int(row.get("passages") or 0), "passages", _interval_se(ci)))
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
    if not ref or not cand:
        return _not_measured(bar, metric, "load", f"no {metric} samples at {case}", limit) | {"case": case}
    if min(ref + cand) <= 0:
        # A p99 ITL of 0 is real: the client read every token of nearly every request in one go.
        return _not_measured(bar, metric, "load", f"a run at {case} recorded 0, which has no ratio", limit) \
            | {"case": case}
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
    check = _check(bar, metric, "load", outcome, text, value=loss.estimate, interval=loss.as_list(), limit=limit,
                   case=case, ratio=iv.estimate, ratio_interval=iv.as_list())
    # The ratio's spread in loss units (delta method on the log ratio): runs per server, as measured.
    se = log_ratio_se(ref, cand)
    return _with_power(check, min(len(ref), len(cand)), "runs", iv.estimate * se if se is not None else None)


def load_checks(inputs: dict[str, Any], cand: str, bars: _Bars) -> list[dict[str, Any]]:
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
        first = len(out)
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
        why = _client_limited({inputs["reference"]: rc, cand: cc}, bars)
        if why:
            for check in out[first:]:
                check["client_limited"] = why
                judged = check["outcome"] in ("pass", "fail")
                check["outcome"] = "inconclusive" if judged else check["outcome"]
                check["text"] += f"; {'not judged' if judged else 'also'}: client-limited ({why})"
    return out


def _client_limited(groups: dict[str, list[dict[str, Any]]], bars: _Bars) -> str | None:
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


def task_checks(inputs: dict[str, Any], cand: str, bars: _Bars) -> list[dict[str, Any]]:
    """One check per task: the candidate's accuracy drop vs the reference on the documents both
    answered within the cap (the tasks probe's paired bootstrap interval), against the task's bar.
    Only when the tasks probe was asked for: it is opt-in, and an unasked probe holds nothing back."""
    probe = inputs["probes"].get("tasks")
    status = (inputs.get("probes_status") or {}).get("tasks")
    bar = "task_accuracy_drop_max"
    if probe is None:
        if status in (None, "not run"):
            return []
        return [_not_measured(bar, "task accuracy drop", "tasks", f"tasks probe {status}",
                              bars.task_bar("default"))]
    out = []
    for task, row in sorted((probe.get("tasks") or {}).items()):
        limit = bars.task_bar(task)
        metric = f"{task} {row.get('metric') or 'accuracy'} drop"
        got = (row.get("candidates") or {}).get(cand) or {}
        if limit is None:
            out.append(_not_measured(bar, metric, "tasks", f"no bar set for {task}", None) | {"case": task})
            continue
        drop, ci, pairs = got.get("drop"), got.get("ci95"), int(got.get("pairs") or 0)
        truncated = int(got.get("truncated") or 0)
        cut = f", {truncated} truncated at the cap on either side, not scored" if truncated else ""
        if drop is None or not (isinstance(ci, list) and len(ci) == 2 and None not in ci):
            why = (f"every document was cut at the cap on one side ({truncated})" if truncated and not pairs
                   else f"no {task} result for {cand}")
            out.append(_not_measured(bar, metric, "tasks", why, limit) | {"case": task})
            continue
        outcome = bar_outcome(Interval(drop, ci[0], ci[1]), limit)
        text = (f"{task} {row.get('metric')} {got.get('candidate_accuracy', 0):.3f} vs reference "
                f"{got.get('reference_accuracy', 0):.3f} on the same {pairs} documents: drop {drop:+.3f} "
                f"[{ci[0]:+.3f}, {ci[1]:+.3f}] vs bar {limit:.3f}: {outcome}")
        details = []
        if got.get("binary"):
            details.append(f"McNemar p {got.get('mcnemar_p', 1.0):.2g}, reference-only {got.get('ref_only', 0)}, "
                           f"candidate-only {got.get('cand_only', 0)}")
        if cut:
            details.append(cut.removeprefix(", "))
        text += f" ({'; '.join(details)})" if details else ""
        check = _check(bar, metric, "tasks", outcome, text, value=drop, interval=list(ci), limit=limit, case=task,
                       pairs=pairs, truncated=truncated, mcnemar_p=got.get("mcnemar_p"))
        se = (binary_se(pairs, int(got.get("ref_only") or 0), int(got.get("cand_only") or 0))
              if got.get("binary") else got.get("se"))
        out.append(_with_power(check, pairs, "documents", se))
    return out


def limited(client: dict[str, Any], case: dict[str, Any], latency_bar: float,
            throughput_bar: float = 0.05) -> str | None:
    """Why the client could have moved this case's numbers by more than a tenth of a bar, or None."""
    cpu = client.get("client_cpu_share")
    if isinstance(cpu, int | float) and cpu >= CPU_LIMIT:
        return f"the client used {cpu:.0%} of a core"
    lag = client.get("client_loop_lag_p99_s")
    if client.get("client_stamps") != "kernel":
        p99s = [case[k] for k in ("ttft_p99_s", "itl_p99_s") if isinstance(case.get(k), int | float) and case[k] > 0]
        allowed = 0.1 * latency_bar * min(p99s) if p99s else None
        if isinstance(lag, int | float) and allowed is not None and lag > allowed:
            return (f"the client's loop ran {lag * 1000:.2f} ms late (p99), over a tenth of the {latency_bar:.0%} bar "
                    f"on its smallest p99 latency ({allowed * 1000:.2f} ms; receive times from the loop)")
        return None
    read = client.get("client_read_lag_p99_s")
    itl = _p50(case, "itl")
    if isinstance(read, int | float) and isinstance(itl, int | float) and itl > 0 and read > itl:
        # Behind by more than a token gap: the kernel merges a socket's queued packets, newest stamp.
        return (f"the client read arrived bytes {read * 1000:.2f} ms late (p99), more than the median gap "
                f"between tokens ({itl * 1000:.2f} ms): queued chunks share one kernel stamp")
    mean = client.get("client_loop_lag_mean_s")
    e2e = _p50(case, "e2e")
    if isinstance(mean, int | float) and isinstance(e2e, int | float) and e2e > 0 and mean / e2e > 0.1 * throughput_bar:
        # Closed loop: each turn goes out late by about the mean lag, so the offered load is lighter.
        return (f"the client's loop ran {mean * 1000:.2f} ms late on average, {mean / e2e:.1%} of a request's "
                f"median span: over a tenth of the {throughput_bar:.0%} throughput bar")
    return None


def _p50(case: dict[str, Any], name: str) -> float | None:
    value = case.get(f"{name}_p50_s")
    if value is None and isinstance(case.get(f"{name}_s"), dict):
        value = case[f"{name}_s"].get("p50")
    return value if isinstance(value, int | float) else None


# -- the decision --------------------------------------------------------------------------------

def _broken(base: dict[str, Any], checks: list[dict[str, Any]], why: str) -> dict[str, Any]:
    """Broken stays the decision, but what was measured before the failure is judged and said: a
    candidate that fails a quality bar and then crashes fails that bar too."""
    measured = [c for c in checks if c["outcome"] != "not_measured"]
    reasons = [why] + [f"also fails {c['bar']}: {c['text']}" if c["outcome"] == "fail"
                       else f"measured before it broke: {c['text']}" for c in measured]
    return base | {"decision": "broken", "checks": checks, "reasons": reasons}


def _decide_candidate(inputs: dict[str, Any], cand: str, bars: _Bars) -> dict[str, Any]:
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
              needle_check(inputs, cand, bars), *task_checks(inputs, cand, bars), *load_checks(inputs, cand, bars)]
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
    bars = _bars(inputs.get("bars") or {})
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
