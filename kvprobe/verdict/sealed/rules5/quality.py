"""Checks on the candidate's distributions against the reference's: the perplexity delta and the
optional agreement bars (mean KL, top-1 agreement), each a ratio of sums over passages with a t
interval, judged from the per-passage numbers the probes recorded.

The reference's own run-to-run noise is said as it was seen: "deterministic" when its repeated runs
were bit-identical passage by passage (the CPU build is), else the measured delta between its runs
enters the interval as a variance component, and a bar with noise over a third of it is not judged.
"""

from __future__ import annotations

import math
from typing import Any

from kvprobe.verdict.sealed.rules5.common import (
    MIN_PASSAGES,
    iv_text,
    judged,
    make_check,
    not_measured,
    pct,
    probe_missing,
    rules2_row,
    with_power,
)
from kvprobe.verdict.sealed.rules5.stats import Interval, ratio_t_interval

NOISE_SHARE_MAX = 1 / 3


def reference_noise(ref_row: dict[str, Any], units: list[float]) -> dict[str, Any]:
    """The reference's repeated runs against its first: how many passages were bit-identical, and the
    run-to-run delta (log scale, per unit) with its mean square as a variance estimate."""
    first = ref_row.get("passage_ll") or []
    repeats = [r for r in ref_row.get("repeat_ll") or [] if isinstance(r, list) and len(r) == len(first)]
    out: dict[str, Any] = {"runs": 1 + len(repeats), "passages": len(first)}
    if not repeats:
        return out | {"var": 0.0, "df": None, "text": "reference run once: its run-to-run noise is not measured"}
    identical = sum(all(r[i] == first[i] for r in repeats) for i in range(len(first)))
    out["identical"] = identical
    total = sum(units)
    deltas = [math.fsum(a - b for a, b in zip(first, r, strict=True)) / total for r in repeats]
    if identical == len(first):
        return out | {"deterministic": True, "var": 0.0, "df": None, "rms": 0.0,
                      "text": f"reference deterministic: {identical}/{len(first)} passages bit-identical over "
                              f"{out['runs']} runs"}
    # A candidate's delta carries both servers' run offsets; the reference-vs-reference delta has the
    # same two, so its square estimates that variance with one degree of freedom per repeat.
    var = sum(d * d for d in deltas) / len(deltas)
    rms = math.expm1(math.sqrt(var))
    return out | {"deterministic": False, "var": var, "df": len(deltas), "rms": rms, "deltas": deltas,
                  "text": f"reference run-to-run {pct(rms, False)} ({identical}/{len(first)} passages "
                          f"bit-identical over {out['runs']} runs), in the interval"}


def perplexity_check(inputs: dict[str, Any], cand: str, bars: Any) -> dict[str, Any]:
    check_id, bar, metric, limit = "perplexity.delta", "perplexity_delta_max", "perplexity delta", \
        bars.perplexity_delta_max
    probe = inputs["probes"].get("perplexity")
    if probe is None:
        return not_measured(check_id, bar, metric, "perplexity", probe_missing(inputs, "perplexity"), limit)
    servers = probe.get("servers") or {}
    ref, row = servers.get(inputs["reference"]) or {}, servers.get(cand) or {}
    if not row.get("passage_ll") or not ref.get("passage_ll"):
        who = cand if not row.get("passage_ll") else inputs["reference"]
        got = servers.get(who) or {}
        why = got.get("error") or rules2_row("perplexity", got, ("bits_per_byte", "loglikelihood"), who,
                                             "per-passage figures") or f"no perplexity result for {who}"
        return not_measured(check_id, bar, metric, "perplexity", why, limit)
    ref_ll = dict(zip(ref.get("passage_doc") or [], ref["passage_ll"], strict=False))
    units_of = dict(zip(ref.get("passage_doc") or [], ref.get("passage_units") or [], strict=False))
    docs = [d for d in row.get("passage_doc") or [] if d in ref_ll]
    cand_ll = dict(zip(row.get("passage_doc") or [], row["passage_ll"], strict=False))
    if not docs:
        return not_measured(check_id, bar, metric, "perplexity", "no passage scored on both servers", limit)
    rise = [ref_ll[d] - cand_ll[d] for d in docs]
    units = [float(units_of[d]) for d in docs]
    noise = reference_noise(ref, [float(units_of[d]) for d in ref.get("passage_doc") or []])
    iv = ratio_t_interval(rise, units, extra_var=noise["var"], extra_df=noise["df"])
    delta = Interval(math.expm1(iv.estimate), math.expm1(iv.lo), math.expm1(iv.hi))
    outcome = judged(delta, limit)
    n = len(docs)
    df_text = f"{iv.df:.0f} df" if iv.df is not None and math.isfinite(iv.df) else "z"
    text = (f"{metric} {pct(delta.estimate)} {iv_text(delta.lo, delta.hi)} over {n} passages vs bar "
            f"{pct(limit, False)}: {outcome}")
    why = []
    if outcome != "fail" and noise.get("rms") and noise["rms"] > NOISE_SHARE_MAX * limit:
        # Not passed on a platform this noisy; a fail stands: the noise is in its interval.
        outcome = "inconclusive"
        why.append(f"the reference moves {pct(noise['rms'], False)} between its own runs, over a third of the "
                   f"bar: this platform's run-to-run noise is too large to judge it")
    elif outcome == "pass" and n < MIN_PASSAGES:
        outcome = "inconclusive"
        why.append(f"{n} passages: a pass needs at least {MIN_PASSAGES}")
    if why:
        text = text.rsplit(": ", 1)[0] + ": inconclusive"
    text += f" (t interval, {df_text}; {noise['text']}" + "".join(f"; {w}" for w in why) + ")"
    if outcome == "fail":
        text += f" (over the bar by at least {pct(delta.lo - limit, False)})"
    se = math.exp(iv.estimate) * iv.se if iv.se is not None else None
    check = make_check(check_id, bar, metric, "perplexity", outcome, text, value=delta.estimate,
                       interval=[delta.lo, delta.hi], limit=limit, passages=n,
                       noise={k: v for k, v in noise.items() if k not in ("var", "text", "deltas")})
    return with_power(check, n, "passages", se, iv.df, limit, sd_df=iv.df, df_kind="paired")


def agreement_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """Optional bars (unset by default): mean KL divergence and top-1 agreement, pooled over every
    position (a ratio of sums over passages) with a t interval over passages."""
    out = []
    probe = inputs["probes"].get("agreement")
    row = ((probe or {}).get("servers") or {}).get(cand) or {}
    for bar, key, metric, larger_is_worse in (("kl_mean_max", "kl", "mean KL divergence", True),
                                              ("top1_agreement_min", "top1", "top-1 agreement", False)):
        limit = getattr(bars, bar)
        check_id = f"agreement.{'kl_mean' if larger_is_worse else 'top1'}"
        if limit is None:
            continue
        sums, positions = row.get(f"passage_{key}_sum"), row.get("passage_positions")
        if probe is None or not sums or not positions or sum(positions) <= 0:
            why = probe_missing(inputs, "agreement") if probe is None else (
                row.get("error") or rules2_row("agreement", row, ("kl_mean", "top1_agreement"), cand,
                                               "per-passage figures") or f"no agreement result for {cand}")
            out.append(not_measured(check_id, bar, metric, "agreement", why, limit))
            continue
        iv = ratio_t_interval(sums, positions)
        outcome = judged(iv, limit, larger_is_worse=larger_is_worse)
        n = len(sums)
        sign = "<=" if larger_is_worse else ">="
        text = (f"{metric} {iv.estimate:.4f} [{iv.lo:.4f}, {iv.hi:.4f}] over {n} passages vs bar {sign} "
                f"{limit:.4f}: {outcome}")
        if outcome == "pass" and n < MIN_PASSAGES:
            outcome = "inconclusive"
            text = text.removesuffix(": pass") + f": inconclusive ({n} passages: a pass needs at least {MIN_PASSAGES})"
        check = make_check(check_id, bar, metric, "agreement", outcome, text, value=iv.estimate,
                           interval=[iv.lo, iv.hi], limit=limit, passages=n)
        loss_bar = limit if larger_is_worse else 1 - limit
        out.append(with_power(check, n, "passages", iv.se, iv.df, loss_bar, sd_df=iv.df, df_kind="paired"))
    return out
