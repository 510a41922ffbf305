"""The task-accuracy bar and the power figures in the verdict, from recorded numbers (tasks.json as
the probe writes it): pass, fail and inconclusive by the interval rule, per-task or global bars,
truncated answers counted apart, and `verify`'s re-derivation."""

from __future__ import annotations

from pathlib import Path

import pytest
from verdict_inputs import Measurements, tasks_summary

from kvprobe.report.tables import power_table, tasks_table
from kvprobe.verdict import build_verdict, rederive


def with_tasks(ref: list[float], cand: list[float], **kw) -> Measurements:
    m = Measurements()
    m.probes_requested.append("tasks")
    m.tasks = tasks_summary(ref, cand, **kw)
    return m


def task_check(v: dict, cand: str = "cand") -> dict:
    (check,) = [c for c in v["decisions"][cand]["checks"] if c["bar"] == "task_accuracy_drop_max"]
    return check


def test_the_same_answers_pass_with_a_zero_drop(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 30, [1.0] * 30).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "pass" and check["value"] == 0.0 and check["interval"] == [0.0, 0.0]
    assert check["mcnemar_p"] == 1.0 and "30 documents" in check["text"]
    assert v["decisions"]["cand"]["decision"] == "adopt"
    # 30 matching answers still cannot rule out a loss of about 0.13: the power block says so.
    assert 0.10 < check["power"]["detectable"] < 0.16 and check["power"]["unit"] == "documents"
    assert rederive(v) == []


def test_a_wrecked_candidate_fails_in_words_and_numbers(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 30, [1.0] * 3 + [0.0] * 27).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "fail" and check["value"] == pytest.approx(0.9)
    d = v["decisions"]["cand"]
    assert d["decision"] == "reject" and v["exit_code"] == 1
    assert d["reasons"][0].startswith("fails task_accuracy_drop_max: qa exact_match 0.100 vs reference 1.000")
    assert "McNemar p" in d["reasons"][0] and "reference-only 27" in d["reasons"][0]


def test_a_small_loss_is_inconclusive_and_says_how_many_documents_would_settle_it(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 40, [1.0] * 39 + [0.0]).write(tmp_path / "r"))
    check = task_check(v)
    assert check["outcome"] == "inconclusive"
    needed = check["power"]["needed"]
    assert needed > 40 and f"about {needed:,} documents would settle it" in check["text"]
    assert v["exit_code"] == 1  # a measured bar not shown to pass fails the run


def test_truncated_answers_are_counted_apart_not_as_wrong(tmp_path: Path) -> None:
    # The candidate's last 5 answers were cut by the cap: scored 0 by lm-eval, but not paired.
    m = with_tasks([1.0] * 30, [1.0] * 25 + [0.0] * 5, truncated=(25, 26, 27, 28, 29))
    v = build_verdict(m.write(tmp_path / "r"))
    check = task_check(v)
    assert check["pairs"] == 25 and check["truncated"] == 5 and check["value"] == 0.0
    assert "5 truncated at the cap on either side, not scored" in check["text"]
    cand = v["probes"]["tasks"]["tasks"]["qa"]["servers"]["cand"]
    assert cand == {"accuracy": 1.0, "documents": 30, "scored": 25, "truncated": 5}


def test_every_answer_cut_is_not_measured(tmp_path: Path) -> None:
    m = with_tasks([1.0] * 4, [0.0] * 4, truncated=(0, 1, 2, 3))
    check = task_check(build_verdict(m.write(tmp_path / "r")))
    assert check["outcome"] == "not_measured" and "cut at the cap" in check["text"]


def test_per_task_bars_and_a_default(tmp_path: Path) -> None:
    m = with_tasks([1.0] * 30, [1.0] * 28 + [0.0] * 2)
    m.bars["task_accuracy_drop_max"] = {"qa": 0.5}
    assert task_check(build_verdict(m.write(tmp_path / "a")))["outcome"] == "pass"
    m.bars["task_accuracy_drop_max"] = {"default": 0.0}
    assert task_check(build_verdict(m.write(tmp_path / "b")))["limit"] == 0.0
    m.bars["task_accuracy_drop_max"] = {"other": 0.5}
    check = task_check(build_verdict(m.write(tmp_path / "c")))
    assert check["outcome"] == "not_measured" and "no bar set for qa" in check["text"]


def test_not_asked_for_adds_no_check_and_asked_for_without_results_holds_back(tmp_path: Path) -> None:
    v = build_verdict(Measurements().write(tmp_path / "a"))
    assert not [c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "task_accuracy_drop_max"]
    m = Measurements()
    m.probes_requested.append("tasks")  # asked for, no tasks.json
    v = build_verdict(m.write(tmp_path / "b"))
    check = task_check(v)
    assert check["outcome"] == "not_measured" and v["decisions"]["cand"]["decision"] == "inconclusive"
    assert v["exit_code"] == 1


def test_a_tampered_task_drop_fails_verify(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 30, [1.0] * 3 + [0.0] * 27).write(tmp_path / "r"))
    v["probes"]["tasks"]["tasks"]["qa"]["candidates"]["cand"].update(drop=0.0, ci95=[0.0, 0.0])
    assert any("recorded decision 'reject'" in p for p in rederive(v))


def test_every_measured_check_carries_power_figures(tmp_path: Path) -> None:
    m = with_tasks([1.0] * 30, [1.0] * 30)
    m.perplexity["servers"]["cand"]["docs"] = 16
    v = build_verdict(m.write(tmp_path / "r"))
    checks = {(c["bar"], c.get("case")): c for c in v["decisions"]["cand"]["checks"]}
    assert checks[("perplexity_delta_max", None)]["power"]["n"] == 16
    # 20 matching needles: the pseudo-pair se, not 0 (which would claim any loss is ruled out).
    needle = checks[("needle_recall_drop_max", None)]["power"]
    assert needle["n"] == 20 and 0.12 < needle["detectable"] < 0.2
    load = [c for c in v["decisions"]["cand"]["checks"] if c["probe"] == "load"]
    assert load and all(c["power"]["unit"] == "runs" and c["power"]["detectable"] > 0 for c in load)
    assert "power" in v["method"]


def test_the_reports_show_the_task_and_power_tables(tmp_path: Path) -> None:
    v = build_verdict(with_tasks([1.0] * 30, [1.0] * 3 + [0.0] * 27).write(tmp_path / "r"))
    tasks = tasks_table(v)
    assert [r[1] for r in tasks.rows] == ["ref", "cand"] and tasks.rows[1][-1] == "fail"
    assert tasks.rows[1][6] == "+0.900"
    power = power_table(v)
    row = next(r for r in power.rows if r[1] == "task_accuracy_drop_max")
    assert row[3] == "30 documents" and row[6] == "fail"
