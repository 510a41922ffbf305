"""The answers checks (kvprobe.verdict.checks.answers): every planned pair accounted for under the answer cap."""

from __future__ import annotations

import pytest
from verdict_inputs import tasks_summary

from kvprobe.config import Bars
from kvprobe.stats import mean_t_interval, paired_binary_interval
from kvprobe.verdict.checks import judge_probe
from kvprobe.verdict.checks.answers import Answer, pair_answers
from kvprobe.verdict.evidence import read_tasks

HIT, MISS, CUT, ERR = Answer(True, 1.0), Answer(True, 0.0), Answer(False, 0.0, cut=True), Answer(False, 0.0)


def _pairs(ref: str, cand: str):
    names = {"h": HIT, "m": MISS, "c": CUT, "e": ERR}
    return pair_answers({i: names[s] for i, s in enumerate(ref)}, {i: names[s] for i, s in enumerate(cand)})


def test_a_cut_candidate_where_the_reference_answered_is_a_loss_and_both_cut_is_left_out() -> None:
    p = _pairs("hhmcc", "cmccc")
    assert p.pairs == 5 and p.both_unanswered == 2 and p.scored == 3
    assert p.ref_scores == [1.0, 1.0, 0.0] and p.cand_scores == [0.0, 0.0, 0.0]
    assert p.cand_cut_ref_answered == 2  # the hit and the miss the reference answered within the cap
    assert (p.cand_cut, p.ref_cut, p.cut_lost, p.cut_gained) == (4, 2, 2, 0)


def test_a_reference_cut_where_the_candidate_answered_is_a_win() -> None:
    p = _pairs("ch", "hh")
    assert p.ref_scores == [0.0, 1.0] and p.cand_scores == [1.0, 1.0] and p.ref_cut_cand_answered == 1


def test_failed_requests_score_as_wrong_but_are_not_cap_events() -> None:
    p = _pairs("hhe", "ehe")
    assert p.scored == 2 and p.both_unanswered == 1 and p.cand_failed_ref_answered == 1
    assert p.cut_pairs == 1  # only the pair where neither request failed counts for the truncation bar


def _task_check(ref, cand, **kw):
    inputs = {"reference": "ref", "probes": {"tasks": read_tasks(tasks_summary(ref, cand, **kw))},
              "probes_status": {"tasks": "ran"}}
    checks = judge_probe("tasks", inputs, "cand", Bars())
    return checks[0], checks[1]


def test_too_few_scored_documents_cannot_pass() -> None:
    # 60 documents, 20 cut on both sides: the 40 left agree (enough for the interval to clear 0.10),
    # but a pass needs 80% of the planned pairs scored
    drop, _ = _task_check([1.0] * 60, [1.0] * 60, truncated=tuple(range(20)), ref_truncated=tuple(range(20)))
    assert drop["scored"] == 40 and drop["interval"][1] < 0.10 and drop["outcome"] == "inconclusive"
    assert "only 40 documents of 60 scored (67%), under the 80% a pass needs" in drop["text"]
    assert "20 documents unanswered on both sides, not scored" in drop["text"]


def test_continuous_scores_get_tangos_interval_on_their_mass_and_cut_answers_the_metrics_worst_value() -> None:
    ref = [0.8 + 0.01 * (i % 5) for i in range(40)]
    drop, _ = _task_check(ref, list(ref))
    assert drop["interval_method"] == "Tango score interval on the losses' mass within the score's range"
    # no document differs: the interval is a 0/1 score's with nothing lost or gained, not [0, 0]
    tango = paired_binary_interval(40, 0, 0)
    assert drop["interval"] == [tango.lo, tango.hi] and drop["outcome"] == "pass"
    cut, _ = _task_check(ref, list(ref), truncated=(0, 1, 2, 3))
    assert cut["value"] == pytest.approx(sum(ref[:4]) / 40)  # the 4 cut answers score 0, the worst value
    assert cut["candidate_cut_reference_answered"] == 4


def _t_upper(diffs: list[float]) -> float:
    return mean_t_interval(diffs).hi


@pytest.mark.parametrize("higher", [True, False])
def test_five_identical_documents_no_longer_pass(higher: bool) -> None:
    """rules/4's t interval was [0, 0] here, which passes any bar; a 0/1 score of either direction and a
    continuous one now get Tango's width at 5 pairs."""
    assert _t_upper([0.0] * 5) == 0.0  # what rules/4 judged on
    for scores in ([1.0, 0.0, 1.0, 1.0, 0.0], [0.31, 0.72, 0.55, 0.9, 0.12]):
        drop, _ = _task_check(scores, list(scores), higher_is_better=higher)
        assert drop["outcome"] == "inconclusive", drop["text"]
        assert drop["interval"][1] == pytest.approx(paired_binary_interval(5, 0, 0).hi)


def test_a_lower_is_better_01_metric_goes_through_tango_negated() -> None:
    # an error rate: the candidate errs on 3 documents the reference got right, and is right on 1 it erred on
    ref = [0.0] * 40
    ref[0] = 1.0
    cand = [0.0] * 40
    cand[1] = cand[2] = cand[3] = 1.0
    drop, _ = _task_check(ref, cand, higher_is_better=False)
    tango = paired_binary_interval(40, 3, 1)
    assert (drop["lost"], drop["gained"]) == (3, 1) and drop["interval"] == [tango.lo, tango.hi]
    assert drop["value"] == pytest.approx(2 / 40) and "lost 3, gained 1" in drop["text"]


def test_a_cut_answer_scores_a_lower_is_better_01_metrics_worst_end_even_when_every_score_is_0() -> None:
    """rules/4 took the largest score seen as the worst: 0 here, the best score of an error rate."""
    drop, _ = _task_check([0.0] * 40, [0.0] * 40, higher_is_better=False, truncated=(0, 1))
    assert drop["candidate_score"] == pytest.approx(2 / 40) and drop["lost"] == 2


def test_a_continuous_pass_needs_the_zero_loss_size() -> None:
    """20 documents on which the candidate scores better each time: the interval clears 0.10, but a 0/1
    score with nothing lost needs 35 documents to pass, and so does this."""
    ref = [0.5] * 20
    drop, _ = _task_check(ref, [0.9] * 20)
    assert drop["interval"][1] <= 0.10 and drop["outcome"] == "inconclusive"
    assert "a pass needs at least 36 documents" in drop["text"]
    again, _ = _task_check([0.5] * 40, [0.9] * 40)
    assert again["outcome"] == "pass"


def test_the_truncation_bar_fails_a_candidate_that_rambles_to_the_cap() -> None:
    _, cut = _task_check([1.0] * 40, [1.0] * 40, truncated=tuple(range(20)))
    assert cut["outcome"] == "fail" and cut["candidate_cut"] == 20 and cut["reference_cut"] == 0
    assert "cand: 20 of 40 qa answers ran past the 1024-token cap; the reference answered 20 of them within it" \
        in cut["text"]
