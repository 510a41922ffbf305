"""A candidate exactly at a bar passes at most 2.5% of the time: a seeded simulation through the checks the
verdict uses (kvprobe.verdict.checks.judge_probe), at the shipped sizes and default bars (180 needles, the 180
documents of kvprobe_qa, a 0.10 margin on each) and at 40, the sizes shipped before issue 33, where the same
data under rules/2's percentile bootstrap passes far more often: the test tells the two apart. Exact sweeps
over every size from 10 to 130, and the shipped sizes, hold both sides of the 0/1 bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvprobe.config import Bars, NeedleSettings
from kvprobe.stats import paired_binary_interval
from kvprobe.stats import paired_exact as pe
from kvprobe.verdict.checks import judge_probe
from kvprobe.verdict.sealed import rules_v2
from kvprobe.verdict.sealed.checks import RULES4_PROBES

SIMS = 2000
LEGACY_N = 40  # the size at which the older rules' excess was measured (the shipped sizes until issue 33)
NOMINAL = 0.025
MC_SLACK = 2.58 * (NOMINAL * (1 - NOMINAL) / SIMS) ** 0.5
QA_DOCUMENTS = sum(1 for line in (Path(__file__).parents[3] / "tasks" / "qa" / "qa.jsonl").open() if line.strip())


def _needle_inputs(ref: np.ndarray, cand: np.ndarray, cand_cut: np.ndarray) -> dict:
    cases = []
    for i, (r, c, cut) in enumerate(zip(ref, cand, cand_cut, strict=True)):
        cases.append({"id": f"n{i:02d}", "server": "ref", "status": "hit" if r else "miss"})
        cases.append({"id": f"n{i:02d}", "server": "cand", "status": "truncated" if cut else ("hit" if c else "miss")})
    return {"reference": "ref", "probes": {"needle": {"cases": cases, "cap": 1024}}, "probes_status": {}}


def _task_inputs(ref: np.ndarray, cand: np.ndarray, cand_cut: np.ndarray) -> dict:
    rows = {"ref": [[i, float(r), False] for i, r in enumerate(ref)],
            "cand": [[i, 0.0 if cut else float(c), bool(cut)] for i, (c, cut) in enumerate(zip(cand, cand_cut,
                                                                                               strict=True))]}
    task = {"metric": "exact_match", "higher_is_better": True,
            "servers": {name: {"rows": r} for name, r in rows.items()}}
    return {"reference": "ref", "probes": {"tasks": {"tasks": {"qa": task}, "cap": 1024}}, "probes_status": {}}


def _draw(rng: np.random.Generator, n: int, p_ref: float, lose: float, gain: float, cut_share: float):
    """Reference right with p_ref; the candidate loses a right answer with `lose` (a `cut_share` of those
    losses by running to the cap), gains a wrong one with `gain`."""
    ref = rng.random(n) < p_ref
    u, v = rng.random(n), rng.random(n)
    cand = np.where(ref, u >= lose, u < gain)
    cut = ref & ~cand & (v < cut_share)
    return ref, cand, cut


# (reference accuracy, gain) pairs; `lose` is solved so the true drop is exactly the bar.
SCENARIOS = [(1.0, 0.0, 0.0), (0.95, 0.2, 0.5), (0.9, 0.1, 1.0)]


@pytest.mark.parametrize(("probe", "n"), [("needle", 40), ("needle", NeedleSettings().count), ("tasks", QA_DOCUMENTS)])
@pytest.mark.parametrize(("p_ref", "gain", "cut_share"), SCENARIOS)
def test_a_candidate_at_the_bar_passes_at_most_nominally(probe: str, n: int, p_ref: float, gain: float,
                                                          cut_share: float) -> None:
    bars = Bars()
    bar = bars.needle_recall_drop_max if probe == "needle" else bars.task_bar("qa")
    lose = (bar + (1 - p_ref) * gain) / p_ref  # p_ref * lose - (1 - p_ref) * gain == bar
    rng = np.random.default_rng(20261203)
    make = _needle_inputs if probe == "needle" else _task_inputs
    new = old = 0
    legacy_sims = 400  # rules/2's bootstrap is slow: a few hundred show its rate well enough
    for sim in range(SIMS):
        inputs = make(*_draw(rng, n, p_ref, lose, gain, cut_share))
        check = judge_probe(probe, inputs, "cand", bars)[0]
        new += check["outcome"] == "pass"
        if probe == "needle" and n == LEGACY_N and sim < legacy_sims:
            legacy = rules_v2.needle_check(inputs, "cand", rules_v2._bars(bars.model_dump()))
            old += legacy["outcome"] == "pass"
    rate = new / SIMS
    print(f"{probe} n={n} bar={bar} p_ref={p_ref} gain={gain} cut_share={cut_share}: P(pass) {rate:.4f} "
          f"(rules/2 bootstrap: {old / legacy_sims:.4f})")
    # The guarantee is the exact sweep's (below); this checks the verdict's own checks keep it, within the
    # simulation's error: at 180 pairs the exact P(pass) with nothing gained is 0.0245, and 2,000 paths drew
    # 0.0265 (sd 0.0035), so the bound is nominal plus 2.58 sd (a 0.5% false alarm).
    assert rate <= NOMINAL + MC_SLACK
    if probe == "needle" and n == LEGACY_N and cut_share < 1.0:
        # rules/2 dropped the cut cases and passed on a bootstrap that collapses with no lost pair
        assert old / legacy_sims > 2 * NOMINAL


def _needle_counts(n: int, lost: int, gained: int) -> dict:
    ref = np.array([True] * lost + [False] * gained + [True] * (n - lost - gained))
    cand = np.array([False] * lost + [True] * gained + [True] * (n - lost - gained))
    return _needle_inputs(ref, cand, np.zeros(n, dtype=bool))


@pytest.mark.parametrize("n", [47, 63])
def test_the_needle_check_fails_exactly_where_the_enumeration_says(n: int) -> None:
    """The exact sweep (tests/stats/test_paired_exact.py) holds a candidate at the bar to 2.5% on the fail side
    at these sizes, where Tango's lower end alone failed it 4.7-4.8% of the time: the check fails on the same
    cells, so the sweep is the check's."""
    bar = Bars().needle_recall_drop_max
    for gained in range(3):
        first = next(k for k in range(n - gained + 1) if pe.fails(n, k, gained, bar))
        tango_first = next(k for k in range(n - gained + 1) if paired_binary_interval(n, k, gained).lo > bar)
        at, below = (judge_probe("needle", _needle_counts(n, k, gained), "cand", Bars())[0] for k in (first, first - 1))
        assert at["outcome"] == "fail" and below["outcome"] != "fail", (at["text"], below["text"])
        assert first >= tango_first
        if first > tango_first:  # Tango alone would have failed here: the words say why the check does not
            held = judge_probe("needle", _needle_counts(n, tango_first, gained), "cand", Bars())[0]
            assert held["outcome"] == "inconclusive" and held["interval"][0] == bar
            assert "the exact test at the bar does not: not a fail" in held["text"]


def _task_scores(losses: np.ndarray, rng: np.random.Generator) -> dict:
    """Scores in [0, 1] whose reference-minus-candidate differences are `losses`."""
    ref = rng.uniform(np.maximum(0.0, losses), np.minimum(1.0, 1.0 + losses))
    rows = {"ref": [[i, float(r), False] for i, r in enumerate(ref)],
            "cand": [[i, float(r - x), False] for i, (r, x) in enumerate(zip(ref, losses, strict=True))]}
    task = {"metric": "f1", "higher_is_better": True, "servers": {name: {"rows": r} for name, r in rows.items()}}
    return {"reference": "ref", "probes": {"tasks": {"tasks": {"qa": task}, "cap": 1024}}, "probes_status": {}}


# Document losses with mean exactly 0.10: a tenth of documents losing the whole score (F1 from 1 to 0); a few
# moving half the range both ways; a twentieth losing everything and the rest spread a little.
BOUNDED = {
    "a tenth lose all": lambda rng, n: np.where(rng.random(n) < 0.1, 1.0, 0.0),
    "a few move half": lambda rng, n: np.select([(u := rng.random(n)) < 0.3, u < 0.4], [0.5, -0.5], 0.0),
    "skewed": lambda rng, n: np.where(rng.random(n) < 0.05, 1.0, rng.uniform(-0.147, 0.253, n)),
}


@pytest.mark.parametrize("scenario", sorted(BOUNDED))
def test_a_bounded_score_at_the_bar_passes_at_most_about_nominally(scenario: str) -> None:
    """F1-like scores, 40 documents, a true mean loss on the 0.10 bar: Tango's interval on the losses' mass
    passes at most about 2.5%; rules/4's t interval passed the all-or-nothing losses 8% of the time."""
    sims, n = 600, LEGACY_N
    rng = np.random.default_rng(20261205)
    new = old = 0
    for _ in range(sims):
        inputs = _task_scores(BOUNDED[scenario](rng, n), rng)
        new += judge_probe("tasks", inputs, "cand", Bars())[0]["outcome"] == "pass"
        old += RULES4_PROBES["tasks"](inputs, "cand", Bars())[0]["outcome"] == "pass"
    print(f"{scenario}: P(pass | at the bar) {new / sims:.4f} (rules/4's t interval: {old / sims:.4f})")
    assert new / sims <= 0.03
    if scenario == "a tenth lose all":
        assert old / sims > 2 * NOMINAL


# The nuisance (the share of pairs gained) on the null's boundary p_lost = p_gained + bar, off the grid the
# exact tests take their supremum over (paired_exact.NUISANCE_GRID): a grid's supremum can sit a hair under
# the true one between its points, so the sweep allows 2e-5 over nominal.
GRID_SLACK = 2e-5


@pytest.mark.parametrize("bar", [0.05, 0.10])
def test_the_0_1_bars_hold_at_the_bar_for_every_size_and_nuisance_exactly(bar: float) -> None:
    """Exact enumeration, both sides, every n from 10 to 130 and the shipped sizes (180 needles, 180 QA
    documents), 61 nuisance values: a candidate exactly at the bar passes at most 2.5% and fails at most 2.5%.
    Tango's upper end alone passed one up to 2.60% (40 pairs at a 0.10 bar): the sweep finds sizes where it
    was over, so it can tell the two rules apart."""
    nuisance = np.linspace(0.0, (1 - bar) / 2, 61)
    tango_over = []
    for n in [*range(10, 131), *sorted({NeedleSettings().count, QA_DOCUMENTS})]:
        worst_pass = max(pe.pass_probability(n, bar, bar + g, g) for g in nuisance)
        worst_fail = max(pe.fail_probability(n, bar, bar + g, g) for g in nuisance)
        assert worst_pass <= NOMINAL + GRID_SLACK, (n, worst_pass)
        assert worst_fail <= NOMINAL + GRID_SLACK, (n, worst_fail)
        limits = pe.tango_most_lost(n, np.arange(n + 1), bar)
        if pe._largest_pass_tail(n, limits, bar) > NOMINAL:
            tango_over.append(n)
    assert tango_over, "no size where Tango's pass side alone was over 2.5%: the exact test is untested here"


def test_the_needle_check_passes_exactly_where_the_enumeration_says() -> None:
    """At 40 needles Tango's upper end alone passes some cells the exact test of the pass side does not: the
    check passes on the enumeration's cells, and a cell Tango alone would pass is inconclusive, its interval's
    upper end held just past the bar."""
    n, bar = 40, Bars().needle_recall_drop_max
    held = 0
    for gained in range(n // 2):
        exact = int(pe.most_lost_passing(n, np.array([gained]), bar)[0])
        tango = int(pe.tango_most_lost(n, np.array([gained]), bar)[0])
        if exact >= 0:
            check = judge_probe("needle", _needle_counts(n, exact, gained), "cand", Bars())[0]
            assert check["outcome"] == "pass", check["text"]
        for lost in range(exact + 1, tango + 1):
            check = judge_probe("needle", _needle_counts(n, lost, gained), "cand", Bars())[0]
            assert check["outcome"] == "inconclusive" and check["interval"][1] > bar, check["text"]
            held += 1
    assert held, "no cell where Tango alone passes at 40 needles"
