"""The task-accuracy bars and their power figures in the verdict, from recorded numbers (tasks.json as
the probe writes it): pass, fail and inconclusive by the score interval, per-task or global bars, answers
cut at the cap scored as wrong and held by their own bar, and `verify`'s re-derivation."""

from __future__ import annotations

from pathlib import Path

import pytest
from verdict_inputs import Measurements, tasks_summary

from kvprobe.stats.paired_exact import equal_pass_probability
from kvprobe.verdict.build import build_verdict, rederive


def with_tasks(ref: list[float], cand: list[float], **kw) -> Measurements:
    m = Measurements()
    m.probes_requested.append("tasks")
    m.tasks = tasks_summary(ref, cand, **kw)
    return m


def task_check(v: dict, cand: str = "cand", kind: str = "drop") -> dict:
    return next(c for c in v["decisions"][cand]["checks"] if c["id"] == f"tasks.qa.{kind}")


def test_forty_same_answers_pass_the_default_bar_and_the_interval_is_honest(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 40).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "pass" and check["value"] == 0.0
    lo, hi = check["interval"]
    assert lo < 0 < hi < 0.10  # not [0, 0]: 40 matching answers rule out a loss of 0.09, not of 0.01
    assert check["mcnemar_p"] == 1.0 and "40/40 vs reference 40/40" in check["text"]
    assert task_check(v, kind="truncation_rise")["outcome"] == "pass"
    assert v["decisions"]["cand"]["decision"] == "adopt"
    assert check["power"]["unit"] == "documents" and check["power"]["passes_at_most"] < 0.10
    assert rederive(v) == []


def test_thirty_same_answers_cannot_show_a_ten_point_margin(tmp_path: Path) -> None:
    check = task_check(build_verdict(with_tasks([1.0] * 30, [1.0] * 30).write(tmp_path / "r")))
    assert check["outcome"] == "inconclusive" and check["interval"][1] > 0.10
    assert check["power"]["needed"] == 36 and "about 36 documents" in check["text"]


def test_a_wrecked_candidate_fails_in_words_and_numbers(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 4 + [0.0] * 36).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "fail" and check["value"] == pytest.approx(0.9)
    d = v["decisions"]["cand"]
    assert d["decision"] == "reject" and v["exit_code"] == 1
    assert d["reasons"][0].startswith("fails task_accuracy_drop_max: qa exact_match 4/40 vs reference 40/40")
    assert "McNemar p" in d["reasons"][0] and "lost 36, gained 0" in d["reasons"][0]


def test_a_small_loss_is_inconclusive_and_says_what_would_settle_it(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 39 + [0.0]).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "inconclusive"
    # sized exactly: an equal candidate disagreeing as often (1 pair in 40, half each way) passes with the
    # family's power from this many documents; rules/4's normal approximation said 40 would usually do, where
    # such a candidate passes 0.63 of the time
    block = check["power"]
    size, each = block["needed"], block["power_each"]
    assert block["method"] == "exact" and block["disagreement"] == 1 / 40
    assert equal_pass_probability(size, 0.10, 1 / 40) >= each > equal_pass_probability(size - 1, 0.10, 1 / 40)
    assert size > 40 and equal_pass_probability(40, 0.10, 1 / 40) == pytest.approx(0.63, abs=0.01)
    assert f"about {size} documents would let a candidate equal to the reference pass it" in check["text"]
    assert v["exit_code"] == 1  # a measured bar not shown to pass fails the run


def test_answers_cut_at_the_cap_are_losses_and_fail_their_own_bar(tmp_path: Path) -> None:
    # The candidate's last 12 answers were cut by the cap where the reference answered: under the budget
    # both sides get, they are wrong answers (rules/2 left them out and compared the other 28).
    m = with_tasks([1.0] * 40, [1.0] * 28 + [0.0] * 12, truncated=tuple(range(28, 40)))
    v = build_verdict(m.write(tmp_path / "r"))
    check = task_check(v)
    assert check["scored"] == 40 and check["value"] == pytest.approx(0.3) and check["outcome"] == "fail"
    assert "cand ran past the 1024-token cap on 12 documents the reference answered within it" in check["text"]
    cut = task_check(v, kind="truncation_rise")
    assert cut["value"] == pytest.approx(0.3) and cut["candidate_cut"] == 12 and cut["outcome"] == "fail"
    cand = v["probes"]["tasks"]["tasks"]["qa"]["servers"]["cand"]
    assert (cand["accuracy"], cand["scored"], cand["truncated"]) == (1.0, 28, 12)


def test_every_answer_cut_on_both_sides_tells_nothing(tmp_path: Path) -> None:
    m = with_tasks([1.0] * 4, [0.0] * 4, truncated=(0, 1, 2, 3), ref_truncated=(0, 1, 2, 3))
    check = task_check(build_verdict(m.write(tmp_path / "r")))
    assert check["outcome"] == "inconclusive" and "unanswered on both sides" in check["text"]


def test_per_task_bars_and_a_default(tmp_path: Path) -> None:
    m = with_tasks([1.0] * 40, [1.0] * 38 + [0.0] * 2)
    m.bars["task_accuracy_drop_max"] = {"qa": 0.5}
    assert task_check(build_verdict(m.write(tmp_path / "a")))["outcome"] == "pass"
    m.bars["task_accuracy_drop_max"] = {"default": 0.0}
    check = task_check(build_verdict(m.write(tmp_path / "b")))
    assert check["limit"] == 0.0 and check["outcome"] == "inconclusive"
    assert "a bar of 0 can only fail or be inconclusive" in check["text"]
    m.bars["task_accuracy_drop_max"] = {"other": 0.5}
    check = task_check(build_verdict(m.write(tmp_path / "c")))
    assert check["outcome"] == "not_measured" and "no bar set for qa" in check["text"]


def test_not_asked_for_adds_no_check_but_says_so_and_asked_for_without_results_holds_back(tmp_path: Path) -> None:
    v = build_verdict(Measurements().write(tmp_path / "a"))
    assert not [c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "task_accuracy_drop_max"]
    assert any("tasks probe is opt-in" in r for r in v["decisions"]["cand"]["reasons"])
    m = Measurements()
    m.probes_requested.append("tasks")  # asked for, no tasks.json
    v = build_verdict(m.write(tmp_path / "b"))
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "task_accuracy_drop_max")
    assert check["outcome"] == "not_measured" and v["decisions"]["cand"]["decision"] == "inconclusive"
    assert v["exit_code"] == 1


def test_a_tampered_task_score_fails_verify(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 4 + [0.0] * 36).write(tmp_path / "r"))
    v["probes"]["tasks"]["tasks"]["qa"]["servers"]["cand"]["rows"] = [[i, 1.0, False] for i in range(40)]
    assert any("recorded decision 'reject'" in p for p in rederive(v))


def test_every_measured_check_carries_power_figures(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 40).write(tmp_path / "r"))
    checks = {c["id"]: c for c in v["decisions"]["cand"]["checks"]}
    assert checks["perplexity.delta"]["power"]["n"] == 16
    needle = checks["needle.recall_drop"]["power"]
    assert needle["n"] == 40 and needle["passes_at_most"] < 0.10 < needle["fails_at_least"]
    # speed: the sequential design's own figures (looks, boundary, blocks used) instead of power
    speed = checks["load.endpoint.throughput_drop"]["sequential"]
    assert speed["design"]["looks"] == [4, 8, 12, 16, 20] and speed["blocks"] == 4
    assert "power" in v["method"]
