"""rules/4's checks on answers (needles, lm-eval tasks), frozen so `kvprobe verify` re-derives a rules/4
verdict under its own rules (kvprobe.verdict.checks.answers is the current one).

rules/4 sent a 0/1 score to Tango's interval only when higher was better, and every other score (a
lower-is-better 0/1 metric, F1, ROUGE) to a t interval over paired differences, which is [0, 0] when no
document differs; it failed a 0/1 bar on Tango's lower end alone, and sized an inconclusive one with a
normal approximation (sd = sqrt(discordant share)). What a pair is (pair_answers) is shared with the
current rules.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvprobe.verdict.sealed import power
from kvprobe.verdict.sealed.answers import Answer, Pairing, _cap_words, _count, pair_answers
from kvprobe.verdict.sealed.common import (
    MIN_SCORED_SHARE,
    judged,
    make_check,
    not_measured,
    probe_missing,
    with_power,
)
from kvprobe.verdict.sealed.stats import Interval, mcnemar_p, mean_t_interval, paired_binary_interval


def _score_interval(p: Pairing, higher_is_better: bool) -> tuple[Interval, dict[str, Any]]:
    """The drop (reference minus candidate, in the direction where larger is worse) with its interval."""
    sign = 1.0 if higher_is_better else -1.0
    if p.binary and higher_is_better:
        lost = sum(r == 1.0 and c == 0.0 for r, c in zip(p.ref_scores, p.cand_scores, strict=True))
        gained = sum(r == 0.0 and c == 1.0 for r, c in zip(p.ref_scores, p.cand_scores, strict=True))
        iv = paired_binary_interval(p.scored, lost, gained)
        return iv, {"lost": lost, "gained": gained, "mcnemar_p": mcnemar_p(lost, gained),
                    "interval_method": "Tango score interval for paired proportions"}
    diffs = [sign * (r - c) for r, c in zip(p.ref_scores, p.cand_scores, strict=True)]
    return mean_t_interval(diffs), {"interval_method": "t over paired differences"}


def score_check(p: Pairing, *, check_id: str, bar: str, metric: str, probe: str, cand: str, limit: float,
                unit: str, cap: int | None, case: str | None, higher_is_better: bool = True,
                label: str) -> dict[str, Any]:
    """The candidate's loss of right answers against `limit`, every planned pair accounted for."""
    if p.pairs == 0:
        return not_measured(check_id, bar, metric, probe, f"no {unit} both servers ran", limit, case)
    if p.scored == 0:
        return make_check(check_id, bar, metric, probe, "inconclusive",
                          f"{metric}: all {p.pairs} {unit} were unanswered on both sides (cut at the cap or "
                          "failed): nothing to compare", limit=limit, case=case, pairs=p.pairs, scored=0)
    iv, extra = _score_interval(p, higher_is_better)
    outcome = judged(iv, limit)
    share = p.scored / p.pairs
    mean_r, mean_c = sum(p.ref_scores) / p.scored, sum(p.cand_scores) / p.scored
    if p.binary and higher_is_better:
        shown = f"{int(sum(p.cand_scores))}/{p.scored} vs reference {int(sum(p.ref_scores))}/{p.scored}"
    else:
        shown = f"{mean_c:.3f} vs reference {mean_r:.3f} over {p.scored} {unit}"
    text = (f"{label} {shown} within the cap: drop {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] vs bar "
            f"{limit:.3f}: {outcome}")
    details = []
    if outcome == "pass" and share < MIN_SCORED_SHARE:
        outcome = "inconclusive"
        details.append(f"only {_count(p.scored, unit)} of {p.pairs} scored ({share:.0%}), under the "
                       f"{MIN_SCORED_SHARE:.0%} a pass needs")
        text = text.removesuffix(": pass") + ": inconclusive"
    if limit == 0 and outcome == "inconclusive":
        details.append("a bar of 0 can only fail or be inconclusive")
    if "lost" in extra:
        details.append(f"lost {extra['lost']}, gained {extra['gained']}, McNemar p {extra['mcnemar_p']:.2g}")
    details += _cap_words(p, cand, unit, cap)
    if details:
        text += f" ({'; '.join(details)})"
    check = make_check(check_id, bar, metric, probe, outcome, text, value=iv.estimate, interval=[iv.lo, iv.hi],
                       limit=limit, case=case, pairs=p.pairs, scored=p.scored, reference_score=mean_r,
                       candidate_score=mean_c, unanswered_both=p.both_unanswered,
                       candidate_cut_reference_answered=p.cand_cut_ref_answered,
                       reference_cut_candidate_answered=p.ref_cut_cand_answered, **extra)
    if p.binary and higher_is_better:
        return with_power(check, p.scored, unit, iv.se, iv.df, limit, binary=True, exact_fail=False, df_kind="z",
                          **_binary_sizing(p.scored, extra["lost"] + extra["gained"], limit))
    return with_power(check, p.scored, unit, iv.se, iv.df, limit, sd_df=iv.df, df_kind="paired")


def cut_check(p: Pairing, *, check_id: str, probe: str, cand: str, limit: float, unit: str, cap: int | None,
              case: str | None, label: str) -> dict[str, Any]:
    """The paired rise in answers the cap cut: a candidate that rambles to the cap loses here even
    where every answer it did finish is right."""
    bar, metric = "truncation_rise_max", f"{label} cut at the cap"
    if p.cut_pairs == 0:
        return not_measured(check_id, bar, metric, probe, f"no {unit} both servers answered or cut", limit, case)
    iv = paired_binary_interval(p.cut_pairs, p.cut_lost, p.cut_gained)
    outcome = judged(iv, limit)
    cap_text = f"the {cap}-token cap" if cap else "the cap"
    text = (f"{label} cut at {cap_text}: {p.cand_cut}/{p.cut_pairs} vs reference {p.ref_cut}/{p.cut_pairs} on the "
            f"same {unit}: rise {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] vs bar {limit:.3f}: {outcome}")
    if p.cand_cut:
        text += (f" ({cand}: {p.cand_cut} of {p.cut_pairs} {label} ran past {cap_text}; the reference answered "
                 f"{p.cut_lost} of them within it)")
    check = make_check(check_id, bar, metric, probe, outcome, text, value=iv.estimate, interval=[iv.lo, iv.hi],
                       limit=limit, case=case, pairs=p.cut_pairs, candidate_cut=p.cand_cut, reference_cut=p.ref_cut,
                       lost=p.cut_lost, gained=p.cut_gained)
    return with_power(check, p.cut_pairs, unit, iv.se, None, limit, binary=True, exact_fail=False, df_kind="z",
                      **_binary_sizing(p.cut_pairs, p.cut_lost + p.cut_gained, limit))


def _binary_sizing(n: int, discordant: int, limit: float) -> dict[str, Any]:
    """How `needed` sizes a 0/1 comparison for a candidate equal to the reference: pairs disagreeing
    (both ways alike) at the share this run saw, and never fewer than a pass needs with none lost."""
    return {"sd_unit": (discordant / n) ** 0.5, "floor": power.zero_loss_size(limit, tango=True)}


# -- needles -------------------------------------------------------------------------------------

_NEEDLE = {"hit": Answer(True, 1.0), "miss": Answer(True, 0.0), "truncated": Answer(False, 0.0, cut=True),
           "error": Answer(False, 0.0)}


def needle_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """Needle recall drop (every planned case, cut and failed answers scored as misses) and the rise
    in needle answers the cap cut."""
    probe = inputs["probes"].get("needle")
    limit, cut_limit = bars.needle_recall_drop_max, bars.truncation_rise_max
    recall_id, cut_id = "needle.recall_drop", "needle.truncation_rise"
    if probe is None:
        why = probe_missing(inputs, "needle")
        return [not_measured(recall_id, "needle_recall_drop_max", "needle recall drop", "needle", why, limit),
                not_measured(cut_id, "truncation_rise_max", "needle answers cut at the cap", "needle", why,
                             cut_limit)]
    by_server: dict[str, dict[Any, Answer]] = defaultdict(dict)
    for case in probe.get("cases") or []:
        status = case.get("status")
        if status in _NEEDLE:
            by_server[case["server"]][case.get("id")] = _NEEDLE[status]
    ref = inputs["reference"]
    p = pair_answers(by_server.get(ref, {}), by_server.get(cand, {}))
    cap = probe.get("cap")
    return [score_check(p, check_id=recall_id, bar="needle_recall_drop_max", metric="needle recall drop",
                        probe="needle", cand=cand, limit=limit, unit="needles", cap=cap, case=None,
                        label="needle recall"),
            cut_check(p, check_id=cut_id, probe="needle", cand=cand, limit=cut_limit, unit="needles", cap=cap,
                      case=None, label="needle answers")]


# -- lm-eval tasks -------------------------------------------------------------------------------

def _task_answers(rows: list[Any], worst: float) -> dict[Any, Answer]:
    out: dict[Any, Answer] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            continue
        doc, score, cut = row
        out[doc] = Answer(False, worst, cut=True) if cut else Answer(True, float(score))
    return out


def task_checks(inputs: dict[str, Any], cand: str, bars: Any) -> list[dict[str, Any]]:
    """Per task: the accuracy drop on every document (an answer cut at the cap scores the metric's
    worst value), and the rise in answers the cap cut. Only when the tasks probe was asked for: it is
    opt-in, and the verdict says so when it was not."""
    probe = inputs["probes"].get("tasks")
    status = (inputs.get("probes_status") or {}).get("tasks")
    bar = "task_accuracy_drop_max"
    if probe is None:
        if status in (None, "not run"):
            return []
        return [not_measured("tasks.accuracy_drop", bar, "task accuracy drop", "tasks",
                             probe_missing(inputs, "tasks"), bars.task_bar("default"))]
    out = []
    ref = inputs["reference"]
    cap = probe.get("cap")
    for task, row in sorted((probe.get("tasks") or {}).items()):
        limit = bars.task_bar(task)
        metric_name = row.get("metric") or "accuracy"
        metric = f"{task} {metric_name} drop"
        check_id = f"tasks.{task}.drop"
        if limit is None:
            out.append(not_measured(check_id, bar, metric, "tasks", f"no bar set for {task}", None, task))
            continue
        servers = row.get("servers") or {}
        ref_rows, cand_rows = (servers.get(ref) or {}).get("rows"), (servers.get(cand) or {}).get("rows")
        if ref_rows is None or cand_rows is None:
            who = ref if ref_rows is None else cand
            out.append(not_measured(check_id, bar, metric, "tasks", f"no {task} result for {who}", limit, task))
            continue
        higher = bool(row.get("higher_is_better", True))
        observed = [float(r[1]) for r in ref_rows + cand_rows if isinstance(r, list) and len(r) == 3 and not r[2]]
        worst = min([0.0, *observed]) if higher else max(observed, default=0.0)
        p = pair_answers(_task_answers(ref_rows, worst), _task_answers(cand_rows, worst))
        out.append(score_check(p, check_id=check_id, bar=bar, metric=metric, probe="tasks", cand=cand, limit=limit,
                               unit="documents", cap=cap, case=task, higher_is_better=higher,
                               label=f"{task} {metric_name}"))
        out.append(cut_check(p, check_id=f"tasks.{task}.truncation_rise", probe="tasks", cand=cand,
                             limit=bars.truncation_rise_max, unit="documents", cap=cap, case=task,
                             label=f"{task} answers"))
    for check in out:
        # A task's case is its name; as a field too, so that `case_fields` reads the same for every probe.
        check["case_fields"] = {"task": check["case"]}
    return out
