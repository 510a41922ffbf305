"""Checks on answers under a budget: needle retrieval and lm-eval task accuracy, and the answers the
cap cut, each paired case by case against the reference.

The answer cap is a budget both servers get. Per pair of answers:
- an answer cut at the cap, or a request that failed, scores as wrong (0 for a 0/1 score, the
  metric's worst value otherwise) on either side: a candidate cut where the reference answered is
  the candidate's loss, a reference cut where the candidate answered the candidate's win;
- a pair that neither side answered (both cut, both failed) tells nothing: left out, and counted.
A pass needs MIN_SCORED_SHARE of the pairs scored; a score interval decides the rest, in the direction
where larger is worse (a lower-is-better score's rise is its loss):
- 0/1 scores, either direction: Tango's score interval on the lost and gained pairs; a fail and a pass
  each need the exact unconditional test at the bar as well (kvprobe.stats.paired_exact.paired_drop_interval);
- other scores (F1, ROUGE, ...): Tango's interval on the losses' mass within the score's range
  (kvprobe.stats.bounded_paired_interval), never narrower than a 0/1 score's, and a pass needs at least
  the zero-loss size (the fewest documents at which a candidate that loses nothing at all can pass).
  rules/4's t interval was [0, 0] when no document differed: 5 identical documents passed any bar.
A separate bar holds the rise in answers the cap cut. rules/4's version: kvprobe.verdict.sealed.answers_rules4.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kvprobe.verdict.sealed.rules5 import power
from kvprobe.verdict.sealed.rules5.common import (
    MIN_SCORED_SHARE,
    judged,
    make_check,
    not_measured,
    probe_missing,
    rules2_row,
    with_power,
)
from kvprobe.verdict.sealed.rules5.paired_exact import paired_drop_interval
from kvprobe.verdict.sealed.rules5.stats import Interval, bounded_paired_interval, mcnemar_p

PASS_HELD = "Tango's upper end is within the bar, the exact test at the bar does not: not a pass"


@dataclass(frozen=True)
class Answer:
    """One server's answer to one case: answered within the cap or not, and its score."""

    answered: bool
    score: float
    cut: bool = False  # the cap stopped it (not answered)


@dataclass
class Pairing:
    """Reference and candidate answers matched case by case."""

    pairs: int = 0
    both_unanswered: int = 0
    ref_scores: list[float] = field(default_factory=list)
    cand_scores: list[float] = field(default_factory=list)
    cand_cut_ref_answered: int = 0
    ref_cut_cand_answered: int = 0
    cand_failed_ref_answered: int = 0
    cut_pairs: int = 0  # pairs where neither request failed: the truncation comparison's n
    cand_cut: int = 0
    ref_cut: int = 0
    cut_lost: int = 0  # candidate cut, reference not
    cut_gained: int = 0

    @property
    def scored(self) -> int:
        return len(self.ref_scores)

    @property
    def binary(self) -> bool:
        return all(s in (0.0, 1.0) for s in self.ref_scores + self.cand_scores)


def pair_answers(ref: dict[Any, Answer], cand: dict[Any, Answer]) -> Pairing:
    out = Pairing()
    for key in sorted(set(ref) & set(cand), key=str):
        r, c = ref[key], cand[key]
        out.pairs += 1
        failed = (not r.answered and not r.cut) or (not c.answered and not c.cut)
        if not failed:
            out.cut_pairs += 1
            out.cand_cut += c.cut
            out.ref_cut += r.cut
            out.cut_lost += c.cut and not r.cut
            out.cut_gained += r.cut and not c.cut
        if not r.answered and not c.answered:
            out.both_unanswered += 1
            continue
        out.ref_scores.append(r.score)
        out.cand_scores.append(c.score)
        if r.answered and c.cut:
            out.cand_cut_ref_answered += 1
        elif r.answered and not c.answered:
            out.cand_failed_ref_answered += 1
        if c.answered and r.cut:
            out.ref_cut_cand_answered += 1
    return out


def score_range(observed: list[float]) -> tuple[float, float]:
    """The range a task score lies in, from the scores both servers gave within the cap: lm-eval does not
    say. [0, 1] when every score is there (accuracy, F1, ROUGE as fractions), [0, 100] when every score is
    (BLEU, chrF as sacrebleu reports them), else the range observed, widened to hold 0: a bound the
    documents themselves set, which a score past it on an unseen document would break."""
    if all(0.0 <= x <= 1.0 for x in observed):
        return 0.0, 1.0
    if all(0.0 <= x <= 100.0 for x in observed):
        return 0.0, 100.0
    return min([0.0, *observed]), max([0.0, *observed])


def _score_interval(p: Pairing, higher_is_better: bool, limit: float,
                    span: float) -> tuple[Interval, dict[str, Any], dict[str, Any]]:
    """The loss (reference minus candidate where higher is better, candidate minus reference where lower
    is), its interval, what the check records of it, and how `needed` sizes it."""
    sign = 1.0 if higher_is_better else -1.0
    losses = [sign * (r - c) for r, c in zip(p.ref_scores, p.cand_scores, strict=True)]
    if p.binary:
        lost, gained = sum(x == 1.0 for x in losses), sum(x == -1.0 for x in losses)
        iv = paired_drop_interval(p.scored, lost, gained, limit)
        extra = {"lost": lost, "gained": gained, "mcnemar_p": mcnemar_p(lost, gained),
                 "interval_method": "Tango score interval for paired proportions; a fail and a pass need the "
                                    "exact unconditional test at the bar too"}
        return iv, extra, {"disagreement": (lost + gained) / p.scored}
    iv = bounded_paired_interval(losses, span)
    lost_mass = sum(max(x, 0.0) for x in losses) / span
    gained_mass = sum(max(-x, 0.0) for x in losses) / span
    extra = {"lost_mass": lost_mass, "gained_mass": gained_mass, "score_span": span,
             "interval_method": "Tango score interval on the losses' mass within the score's range"}
    return iv, extra, {"disagreement": min(1.0, (lost_mass + gained_mass) / p.scored), "span": span}


def _count(n: int, unit: str) -> str:
    """'1 document', '3 documents': units are given in the plural."""
    return f"{n} {unit.removesuffix('s') if n == 1 else unit}"


def _cap_words(p: Pairing, cand: str, unit: str, cap: int | None) -> list[str]:
    cap_text = f"the {cap}-token cap" if cap else "the cap"
    words = []
    if p.cand_cut_ref_answered:
        words.append(f"{cand} ran past {cap_text} on {_count(p.cand_cut_ref_answered, unit)} the reference "
                     "answered within it (scored as wrong)")
    if p.cand_failed_ref_answered:
        words.append(f"{cand} failed {_count(p.cand_failed_ref_answered, unit)} the reference answered (scored as "
                     "wrong)")
    if p.ref_cut_cand_answered:
        words.append(f"the reference ran past {cap_text} on {_count(p.ref_cut_cand_answered, unit)} {cand} "
                     "answered (scored as wrong for the reference)")
    if p.both_unanswered:
        words.append(f"{_count(p.both_unanswered, unit)} unanswered on both sides, not scored")
    return words


def score_check(p: Pairing, *, check_id: str, bar: str, metric: str, probe: str, cand: str, limit: float,
                unit: str, cap: int | None, case: str | None, higher_is_better: bool = True,
                label: str, span: float = 1.0) -> dict[str, Any]:
    """The candidate's loss of right answers against `limit`, every planned pair accounted for. `span`: the
    width of the score's range (score_range), for a score that is not 0/1."""
    if p.pairs == 0:
        return not_measured(check_id, bar, metric, probe, f"no {unit} both servers ran", limit, case)
    if p.scored == 0:
        return make_check(check_id, bar, metric, probe, "inconclusive",
                          f"{metric}: all {p.pairs} {unit} were unanswered on both sides (cut at the cap or "
                          "failed): nothing to compare", limit=limit, case=case, pairs=p.pairs, scored=0)
    iv, extra, sizing = _score_interval(p, higher_is_better, limit, span)
    outcome = judged(iv, limit)
    share = p.scored / p.pairs
    mean_r, mean_c = sum(p.ref_scores) / p.scored, sum(p.cand_scores) / p.scored
    if p.binary:
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
    floor = None if p.binary else power.zero_loss_size(limit / span)
    if outcome == "pass" and floor is not None and p.scored < floor:
        # Scores that spread little can give a narrow interval on few documents; a pass needs at least
        # the documents at which one with no loss at all would pass, as a 0/1 score does.
        outcome = "inconclusive"
        details.append(f"a pass needs at least {_count(floor, unit)}, the fewest at which a candidate with no "
                       "loss at all passes this bar")
        text = text.removesuffix(": pass") + ": inconclusive"
    if limit == 0 and outcome == "inconclusive":
        details.append("a bar of 0 can only fail or be inconclusive")
    if "lost" in extra:
        details.append(f"lost {extra['lost']}, gained {extra['gained']}, McNemar p {extra['mcnemar_p']:.2g}")
    if iv.lo == limit and outcome == "inconclusive" and p.binary:
        details.append("Tango's lower end clears the bar, the exact test at the bar does not: not a fail")
    if iv.hi == math.nextafter(limit, math.inf) and outcome == "inconclusive" and p.binary:
        details.append(PASS_HELD)
    details += _cap_words(p, cand, unit, cap)
    if details:
        text += f" ({'; '.join(details)})"
    check = make_check(check_id, bar, metric, probe, outcome, text, value=iv.estimate, interval=[iv.lo, iv.hi],
                       limit=limit, case=case, pairs=p.pairs, scored=p.scored, reference_score=mean_r,
                       candidate_score=mean_c, unanswered_both=p.both_unanswered,
                       candidate_cut_reference_answered=p.cand_cut_ref_answered,
                       reference_cut_candidate_answered=p.ref_cut_cand_answered, **extra)
    return with_power(check, p.scored, unit, iv.se, iv.df, limit, binary=p.binary, df_kind="z", **sizing)


def cut_check(p: Pairing, *, check_id: str, probe: str, cand: str, limit: float, unit: str, cap: int | None,
              case: str | None, label: str) -> dict[str, Any]:
    """The paired rise in answers the cap cut: a candidate that rambles to the cap loses here even
    where every answer it did finish is right."""
    bar, metric = "truncation_rise_max", f"{label} cut at the cap"
    if p.cut_pairs == 0:
        return not_measured(check_id, bar, metric, probe, f"no {unit} both servers answered or cut", limit, case)
    iv = paired_drop_interval(p.cut_pairs, p.cut_lost, p.cut_gained, limit)
    outcome = judged(iv, limit)
    cap_text = f"the {cap}-token cap" if cap else "the cap"
    text = (f"{label} cut at {cap_text}: {p.cand_cut}/{p.cut_pairs} vs reference {p.ref_cut}/{p.cut_pairs} on the "
            f"same {unit}: rise {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] vs bar {limit:.3f}: {outcome}")
    if p.cand_cut:
        text += (f" ({cand}: {p.cand_cut} of {p.cut_pairs} {label} ran past {cap_text}; the reference answered "
                 f"{p.cut_lost} of them within it)")
    if iv.lo == limit and outcome == "inconclusive":
        text += " (Tango's lower end clears the bar, the exact test at the bar does not: not a fail)"
    if iv.hi == math.nextafter(limit, math.inf) and outcome == "inconclusive":
        text += f" ({PASS_HELD})"
    check = make_check(check_id, bar, metric, probe, outcome, text, value=iv.estimate, interval=[iv.lo, iv.hi],
                       limit=limit, case=case, pairs=p.cut_pairs, candidate_cut=p.cand_cut, reference_cut=p.ref_cut,
                       lost=p.cut_lost, gained=p.cut_gained)
    # `needed`: a candidate equal to the reference, disagreeing on the share of pairs this run saw
    return with_power(check, p.cut_pairs, unit, iv.se, None, limit, binary=True, df_kind="z",
                      disagreement=(p.cut_lost + p.cut_gained) / p.cut_pairs)


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
            why = rules2_row("tasks", servers.get(who) or {}, (metric_name, "accuracy"), who,
                             f"per-document {task} scores") or f"no {task} result for {who}"
            out.append(not_measured(check_id, bar, metric, "tasks", why, limit, task))
            continue
        higher = bool(row.get("higher_is_better", True))
        observed = [float(r[1]) for r in ref_rows + cand_rows if isinstance(r, list) and len(r) == 3 and not r[2]]
        low, high = score_range(observed)
        # A cut answer scores the range's worst end: for a lower-is-better 0/1 metric that is 1, even when
        # every answer within the cap scored 0 (rules/4 took the largest score seen, 0 there: a best score).
        worst = low if higher else high
        p = pair_answers(_task_answers(ref_rows, worst), _task_answers(cand_rows, worst))
        out.append(score_check(p, check_id=check_id, bar=bar, metric=metric, probe="tasks", cand=cand, limit=limit,
                               unit="documents", cap=cap, case=task, higher_is_better=higher,
                               label=f"{task} {metric_name}", span=high - low))
        out.append(cut_check(p, check_id=f"tasks.{task}.truncation_rise", probe="tasks", cand=cand,
                             limit=bars.truncation_rise_max, unit="documents", cap=cap, case=task,
                             label=f"{task} answers"))
    for check in out:
        # A task's case is its name; as a field too, so that `case_fields` reads the same for every probe.
        check["case_fields"] = {"task": check["case"]}
    return out
