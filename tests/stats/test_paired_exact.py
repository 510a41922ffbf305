"""Paired 0/1 bars decided exactly (kvprobe.stats.paired_exact): each figure here is a sum of the trinomial over
every (lost, gained) count, at a 0.10 bar, so the assertions are the enumeration's own numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvprobe.stats import bar_outcome, paired_binary_interval, power
from kvprobe.stats import paired_exact as pe

BAR = 0.10
SIX = 0.8 ** (1 / 6)  # each of six gating checks, for 0.8 together
NUISANCE = np.linspace(0.0, 0.45, 901)  # gained-pair probabilities the sweeps take the worst over


@pytest.mark.parametrize("n", [20, 40, 104])
def test_tangos_pass_region_is_tangos_interval_cell_for_cell(n: int) -> None:
    """Where Tango's region says pass, paired_binary_interval's upper end is within the bar, and one more
    lost pair is not: per gained count, the boundary on both sides of it."""
    gained = np.arange(n + 1, dtype=float)
    for g in range(n + 1):
        lost = np.arange(n - g + 1, dtype=float)
        ok = pe.tango_passes(n, lost, np.full_like(lost, g), BAR)
        k = int(ok.sum()) - 1  # passing is a prefix of lost counts
        assert ok[: k + 1].all() and not ok[k + 1:].any()
        if k >= 0:
            assert paired_binary_interval(n, k, g).hi <= BAR
        if k + 1 <= n - g:
            assert paired_binary_interval(n, k + 1, g).hi > BAR
    assert gained.size == n + 1


@pytest.mark.parametrize("n", [20, 40, 63])
def test_the_pass_region_is_the_exact_tests_cell_for_cell(n: int) -> None:
    """Brute force over every cell: a cell passes when Tango's upper end is within the bar and the largest
    probability over the nuisance (on the same grid) of a statistic at most its own is at most 2.5%."""
    lost, gained = (a.astype(int) for a in pe._cells(n))
    t = pe.tango_statistic(n, lost, gained, BAR)
    masses = pe._cell_masses(n, lost, gained, BAR)  # cells x nuisance
    order = np.argsort(t, kind="stable")
    cum = np.cumsum(masses[order], axis=0)
    last = np.searchsorted(t[order], t[order], side="right") - 1  # ties count in the tail
    pvalue = np.empty(len(t))
    pvalue[order] = cum[last].max(axis=1)
    expected = (t <= -pe.Z) & (pvalue <= pe.ALPHA)
    assert (pe.passes(n, lost, gained, BAR) == expected).all()
    # Tango's region alone is larger here: the exact test takes cells out of it
    assert (pe.tango_passes(n, lost, gained, BAR) & ~expected).any()


@pytest.mark.parametrize(("n", "p_lost", "p_gained"), [(40, 0.025, 0.025), (104, 0.025, 0.025), (55, 0.2, 0.1),
                                                      (150, 0.3, 0.2)])
def test_pass_probability_is_the_trinomial_summed_over_every_passing_cell(n: int, p_lost: float,
                                                                           p_gained: float) -> None:
    p_same = 1 - p_lost - p_gained
    total = 0.0
    for g in range(n + 1):
        for k in range(n - g + 1):
            if pe.paired_drop_interval(n, k, g, BAR).hi > BAR:  # the interval the check judges by
                break
            total += math.comb(n, k) * math.comb(n - k, g) * p_lost**k * p_gained**g * p_same ** (n - k - g)
    assert pe.pass_probability(n, BAR, p_lost, p_gained) == pytest.approx(total, abs=1e-12)


def test_an_equal_candidate_needs_85_and_111_pairs_for_six_gating_checks() -> None:
    """Issue 33 measured 76 pairs at 2.5% disagreeing and about 104 at 5% with Tango's pass side alone; with the
    exact test on the pass side too (so a candidate at the bar passes at most 2.5%), 85 and 111: the first
    sizes that reach 0.8^(1/6) = 0.9635 (110 gives 0.9590)."""
    assert pe.equal_size(BAR, 0.025, SIX) == 85
    assert pe.equal_size(BAR, 0.05, SIX) == 111
    assert pe.equal_pass_probability(110, BAR, 0.05) == pytest.approx(0.95901, abs=5e-5)
    # alone (power 0.8): 54 and 71; with nothing disagreeing, the zero-loss size
    assert (pe.equal_size(BAR, 0.025, 0.8), pe.equal_size(BAR, 0.05, 0.8)) == (54, 71)
    assert pe.equal_size(BAR, 0.0, SIX) == power.zero_loss_size(BAR) == 36
    assert power.zero_loss_size(BAR, tango=True) == 35  # rules/4's
    # the size is the first n that reaches the power
    for d, size in ((0.025, 85), (0.05, 111)):
        assert pe.equal_pass_probability(size, BAR, d) >= SIX > pe.equal_pass_probability(size - 1, BAR, d)


def test_the_normal_approximation_named_sizes_an_equal_candidate_passes_too_rarely() -> None:
    """rules/4's power.needed (sd = sqrt(discordant share)) named 38 and 73 pairs; exactly, an equal candidate
    passes there 0.64 and 0.83 of the time, not 0.9635."""
    block = {"se": 0.05, "n": 40}
    old = {d: power.needed(block, BAR, 6, sd_unit=math.sqrt(d), floor=35)["needed"] for d in (0.025, 0.05)}
    assert old == {0.025: 38, 0.05: 73}
    assert pe.equal_pass_probability(38, BAR, 0.025) == pytest.approx(0.64, abs=0.01)
    assert pe.equal_pass_probability(73, BAR, 0.05) == pytest.approx(0.83, abs=0.01)
    new = {d: power.needed(block, BAR, 6, disagreement=d)["needed"] for d in (0.025, 0.05)}
    assert new == {0.025: 85, 0.05: 111}


def test_needed_says_in_words_when_no_practical_run_settles_it() -> None:
    sized = power.needed({"se": 0.05, "n": 40, "unit": "needles"}, 0.001, 1, disagreement=0.5)
    assert sized["needed"] is None
    assert power.advice(sized) == f"no practical run settles it: over {pe.MAX_PAIRS:,} needles would be needed at " \
                                  "50.0% of them disagreeing"


def _worst_fail_at_the_bar(n: int, *, tango_only: bool = False) -> float:
    return max(pe.fail_probability(n, BAR, g + BAR, g, tango_only=tango_only) for g in NUISANCE)


@pytest.mark.parametrize("n", [40, 47, 55, 56, 63, 100, 108])
def test_a_candidate_exactly_at_the_bar_fails_at_most_2_5_percent(n: int) -> None:
    """Tango's lower end alone failed it up to 4.7-4.8% at 47, 55 and 63 pairs and 4.0% at 100 (few gained
    pairs); with the exact test at the bar, the worst over the gained-pair probability is under 2.5% (56 and
    108: where the exact test's own nuisance grid comes closest)."""
    worst = _worst_fail_at_the_bar(n)
    tango = _worst_fail_at_the_bar(n, tango_only=True)
    print(f"n={n}: worst P(fail | at the bar) {worst:.4f}, Tango's lower end alone {tango:.4f}")
    assert worst <= pe.ALPHA
    if n in (47, 55, 63, 100):
        assert tango > 0.039


def test_the_exact_test_costs_little_power_against_twice_the_bar() -> None:
    """A candidate that loses 20% of answers (twice the bar), and gains none: failed 0.87 of the time at 100
    pairs under Tango's lower end alone, 0.81 with the exact test; at 200 pairs 0.98 and 0.97."""
    for n, tango, exact in ((100, 0.871, 0.808), (200, 0.982, 0.972)):
        assert pe.fail_probability(n, BAR, 0.2, 0.0, tango_only=True) == pytest.approx(tango, abs=0.001)
        assert pe.fail_probability(n, BAR, 0.2, 0.0) == pytest.approx(exact, abs=0.001)


@pytest.mark.parametrize("n", [30, 55])
def test_one_cells_pvalue_is_the_tables(n: int) -> None:
    """exact_pvalue sums a suffix of lost counts per gained count; exact_pvalues sorts every cell: the same
    tail, two ways."""
    table = pe.exact_pvalues(n, BAR)
    rng = np.random.default_rng(n)
    cells = [(12, 0), (15, 3), (20, 8), (5, 5), (0, 0), (n, 0), (0, n)]
    cells += [(int(k), int(rng.integers(0, n - k + 1))) for k in rng.integers(0, n + 1, 60)]
    for lost, gained in cells:
        assert pe.exact_pvalue(n, lost, gained, BAR) == pytest.approx(table[lost, gained], abs=1e-12), (lost, gained)


def test_where_tango_fails_and_the_exact_test_does_not_the_check_cannot_fail() -> None:
    n = 63
    table = pe.exact_pvalues(n, BAR)
    cells = [(lost, gained) for gained in range(4) for lost in range(n - gained + 1)
             if paired_binary_interval(n, lost, gained).lo > BAR and table[lost, gained] > pe.ALPHA]
    assert cells  # Tango's liberal corner: few gained pairs
    lost, gained = cells[0]
    iv = pe.paired_drop_interval(n, lost, gained, BAR)
    assert iv.lo == BAR and iv.hi == paired_binary_interval(n, lost, gained).hi
    assert bar_outcome(iv, BAR) == "inconclusive"
    # one lost pair more, the exact test rejects too: a fail, on Tango's own interval
    assert pe.fails(n, lost + 1, gained, BAR)
    assert pe.paired_drop_interval(n, lost + 1, gained, BAR) == paired_binary_interval(n, lost + 1, gained)


@pytest.mark.parametrize(("bar", "disagreement", "power"), [(0.1, 0.05, 0.963), (0.2, 0.3, 0.8), (0.1, 0.1, 0.8)])
def test_the_exact_size_is_never_under_the_z_tests_which_screens_out_sizes_past_reach(
        bar: float, disagreement: float, power: float) -> None:
    """equal_size answers None at once where a z test would need over 4x MAX_PAIRS: safe while the exact size is
    at least the z test's (1.02-1.58 times it, measured from 70 to 2,000 pairs)."""
    z = pe.t_quantile(1.0 - pe.ALPHA, None) + pe.t_quantile(power, None)
    exact = pe.equal_size(bar, disagreement, power)
    assert exact is not None and exact >= z * z * disagreement / bar**2


@pytest.mark.parametrize(("bar", "disagreement", "power_"), [(0.2, 0.05, 0.9), (0.2, 0.1, 0.8), (0.1, 0.0, 0.8)])
def test_the_exact_size_is_the_first_size_the_exact_region_reaches(bar: float, disagreement: float,
                                                                   power_: float) -> None:
    """equal_size skips sizes where Tango's region passes too rarely: it finds the size a plain search over
    every size finds, and Tango's pass probability is never under the exact one."""
    n = 1
    while pe.equal_pass_probability(n, bar, disagreement) < power_:
        assert pe._tango_equal_pass_probability(n, bar, disagreement) >= pe.equal_pass_probability(
            n, bar, disagreement) - 1e-12
        n += 1
    assert pe.equal_size(bar, disagreement, power_) == n
