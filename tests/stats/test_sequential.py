"""The group-sequential speed decision (kvprobe/stats/sequential.py): looks, calibration, boundaries, the
decision at and between looks, drift and the Williams orders. Operating characteristics over many
simulated runs are benchmarks/speed_decision.py's; one small seeded simulation here guards the
false-pass rate on the bar."""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise
from statistics import NormalDist

import numpy as np
import pytest

from kvprobe.stats import t_quantile
from kvprobe.stats.sequential import (
    ADVICE_Z,
    MIN_LOOK,
    ROBUST,
    Design,
    calibrate,
    design,
    drift,
    fixed,
    look,
    of_settings,
    planned_looks,
    settle,
    williams,
)

MARGIN = -math.log(1 - 0.05)  # throughput_drop_max 0.05 on the log-loss scale
DEFAULT_LOOKS = (4, 8, 12, 16, 20)


@pytest.fixture(scope="module")
def plan() -> Design:
    return design(20, 4)


# -- planned_looks -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("max_blocks", "look_every", "first_look", "expected"), [
    (20, 4, None, (4, 8, 12, 16, 20)),
    (18, 4, None, (4, 8, 12, 16, 18)),  # the budget is always the last look, even off the grid
    (20, 1, None, tuple(range(3, 21))),  # every block, but never before MIN_LOOK
    (20, 2, None, (3, 5, 7, 9, 11, 13, 15, 17, 19, 20)),
    (20, 5, 2, (3, 8, 13, 18, 20)),  # a first look below MIN_LOOK is raised to it
    (20, 4, 6, (6, 10, 14, 18, 20)),
    (20, 4, 0, (4, 8, 12, 16, 20)),  # 0 means the default, as None does
    (4, 4, None, (4,)),
    (3, 4, None, (3,)),  # budget below the first look: one look at the budget
    (2, 4, None, (2,)),
    (20, 25, None, (20,)),
    (20, 4, 25, (20,)),
])
def test_planned_looks(max_blocks: int, look_every: int, first_look: int | None, expected: tuple[int, ...]) -> None:
    assert planned_looks(max_blocks, look_every, first_look) == expected


def test_planned_looks_always_increase_and_end_at_the_budget() -> None:
    for max_blocks in range(2, 41):
        for look_every in range(1, 12):
            looks = planned_looks(max_blocks, look_every)
            assert looks[-1] == max_blocks
            assert all(a < b for a, b in pairwise(looks))
            assert len(looks) == 1 or looks[0] >= MIN_LOOK


# -- calibrate and the boundary ------------------------------------------------------------------------

def test_calibrated_c_matches_the_audit_for_looks_every_four_to_twenty() -> None:
    # statistics-audit.md 4.3: c = 2.432 from 40k simulations; this one uses 200k and rounds up
    c = calibrate(DEFAULT_LOOKS)
    assert 2.40 <= c <= 2.46
    assert c == round(c, 3)


def test_calibration_is_seeded() -> None:
    fresh = calibrate.__wrapped__.__wrapped__  # past the lru_cache and the disk cache: a fresh simulation
    first = fresh(DEFAULT_LOOKS)
    assert first == fresh(DEFAULT_LOOKS) == calibrate(DEFAULT_LOOKS)


@pytest.mark.parametrize("n", [2, 3, 4, 10, 20])
def test_one_look_is_the_fixed_sample_t_test(n: int) -> None:
    q = t_quantile(0.975, n - 1)
    assert calibrate((n,)) == math.ceil(q * 1000) / 1000
    assert q <= calibrate((n,)) < q + 0.001
    assert fixed(n) == Design((n,), calibrate((n,)))


def test_one_block_has_no_boundary() -> None:
    assert calibrate((1,)) == math.inf
    assert fixed(1).as_dict()["c"] is None  # JSON has no infinity


def test_more_looks_cost_a_higher_final_boundary() -> None:
    # every extra look spends alpha, so the last boundary must rise above the fixed-sample t
    one, two, five = calibrate((20,)), calibrate((10, 20)), calibrate(DEFAULT_LOOKS)
    assert one < two < five


def test_a_smaller_alpha_gives_a_larger_c() -> None:
    assert calibrate(DEFAULT_LOOKS, 0.0125) > calibrate(DEFAULT_LOOKS)


def test_boundary_is_obrien_fleming_shaped(plan: Design) -> None:
    assert plan.looks == DEFAULT_LOOKS
    assert plan.c == calibrate(DEFAULT_LOOKS)
    for n in plan.looks:
        assert plan.boundary(n) == pytest.approx(plan.c * math.sqrt(20 / n))
    assert plan.boundary(20) == plan.c
    assert plan.boundary(4) == pytest.approx(plan.c * math.sqrt(5))
    bounds = [plan.boundary(n) for n in plan.looks]
    assert all(a > b for a, b in pairwise(bounds))
    d = plan.as_dict()
    assert d["looks"] == list(DEFAULT_LOOKS) and d["c"] == plan.c and d["alpha"] == 0.025
    assert d["boundaries"] == [round(b, 3) for b in bounds]
    assert "c_fail" not in d
    # one endpoint: the fail side uses the same boundary
    assert all(plan.fail_boundary(n) == plan.boundary(n) for n in plan.looks)


def test_of_settings_reads_the_declared_design() -> None:
    assert of_settings({"max_blocks": 20, "look_every": 4}) == design(20, 4)
    assert of_settings({}) == design(20, 4)  # the defaults
    assert of_settings({"max_blocks": 12, "look_every": 3}).looks == (3, 6, 9, 12)
    assert of_settings({"repeats": 3}) == fixed(3)  # a fixed number of repeats is the fixed-sample t test

    class Settings:  # the attribute form (kvprobe.config.LoadSettings)
        max_blocks, look_every, repeats, latency_endpoint = 16, 4, None, None

    # a design declared now uses the robust statistic; a recorded plan names its own, rules/4's t when none
    assert of_settings(Settings()) == design(16, 4, statistic=ROBUST)
    assert of_settings(Settings()).looks == (8, 12, 16)  # no look before ROBUST_MIN_LOOK
    assert of_settings({"max_blocks": 16, "look_every": 4, "plan": {"statistic": ROBUST}}) == of_settings(Settings())


def test_a_second_endpoint_splits_alpha_on_the_fail_side_only() -> None:
    two = of_settings({"max_blocks": 20, "look_every": 4, "latency_endpoint": True})
    one = design(20, 4)
    assert two.c == one.c  # a pass needs both endpoints: no split
    assert two.c_fail == calibrate(DEFAULT_LOOKS, 0.0125) and two.c_fail > two.c
    for n in two.looks:
        assert two.fail_boundary(n) == pytest.approx(two.c_fail * math.sqrt(20 / n))
    assert two.as_dict()["c_fail"] == two.c_fail
    # a t of 2.6 at n_max fails a one-endpoint design but not the split one
    off = [(-1) ** i * 0.05 for i in range(20)]
    se = float(np.std(off, ddof=1)) / math.sqrt(20)
    losses = [MARGIN + 2.6 * se + x for x in off]
    assert two.c < 2.6 < two.c_fail
    one_at, two_at = look(losses, MARGIN, one), look(losses, MARGIN, two)
    assert one_at is not None and one_at.outcome == "fail"
    assert two_at is not None and two_at.outcome == "inconclusive"


# -- look --------------------------------------------------------------------------------------------

def _around(centre: float, n: int, spread: float = 0.01) -> list[float]:
    """n losses with mean exactly `centre` (up to rounding) and a fixed spread."""
    offsets = np.linspace(-spread, spread, n)
    return [centre + float(x) for x in offsets - offsets.mean()]


def test_fewer_than_two_blocks_say_nothing(plan: Design) -> None:
    assert look([], MARGIN, plan) is None
    assert look([0.0], MARGIN, plan, final=True) is None


def test_two_blocks_never_decide_a_multi_look_design(plan: Design) -> None:
    lk = look([0.0, 0.001], MARGIN, plan, final=True)
    assert lk is not None
    assert lk.boundary == math.inf and lk.outcome == "inconclusive"
    assert lk.lo == -math.inf and lk.hi == math.inf


def test_a_clearly_equal_candidate_passes_at_the_first_look(plan: Design) -> None:
    losses = _around(0.0, 4)
    lk = look(losses, MARGIN, plan)
    assert lk is not None and lk.outcome == "pass" and lk.at_look
    assert lk.mean == pytest.approx(0.0, abs=1e-12)
    assert lk.sd == pytest.approx(float(np.std(losses, ddof=1)))
    assert lk.se == pytest.approx(lk.sd / 2)
    assert lk.boundary == pytest.approx(plan.boundary(4))
    assert lk.t_pass == pytest.approx((MARGIN - lk.mean) / lk.se)
    assert lk.t_pass > lk.boundary
    # the repeated CI is mean -/+ b_n * se, and passing means it lies wholly below the margin
    assert lk.lo == pytest.approx(lk.mean - lk.boundary * lk.se)
    assert lk.hi == pytest.approx(lk.mean + lk.boundary * lk.se)
    assert lk.hi < MARGIN
    assert lk.more_blocks is None


def test_a_clearly_slower_candidate_fails_at_the_first_look(plan: Design) -> None:
    lk = look(_around(-math.log(0.90), 4), MARGIN, plan)
    assert lk is not None and lk.outcome == "fail"
    assert lk.t_fail == pytest.approx(-lk.t_pass) and lk.t_fail > lk.boundary
    assert lk.lo > MARGIN
    assert lk.more_blocks is None


def test_between_looks_it_continues_even_when_a_look_would_settle_it(plan: Design) -> None:
    for n in (3, 5, 7):
        lk = look(_around(0.0, n), MARGIN, plan)
        assert lk is not None and lk.outcome == "continue" and not lk.at_look
        assert lk.t_pass > lk.boundary  # it would pass, were this a look
    # the budget spent between looks (final) settles it on the boundary of that n
    lk = look(_around(0.0, 5), MARGIN, plan, final=True)
    assert lk is not None and lk.outcome == "pass"
    assert lk.boundary == pytest.approx(plan.boundary(5))


def test_at_a_look_short_of_the_bar_it_continues(plan: Design) -> None:
    # equal on average but noisy: t_pass about 2, under the first boundary (5.43)
    lk = look(_around(0.0, 4, spread=0.06), MARGIN, plan)
    assert lk is not None and lk.at_look and lk.outcome == "continue"
    assert 0 < lk.t_pass < lk.boundary
    assert lk.more_blocks is None


def test_on_the_bar_at_the_budget_it_is_inconclusive_with_more_blocks(plan: Design) -> None:
    centre = MARGIN - 0.005  # just on the good side, too close to settle in 20 blocks
    losses = _around(centre, 20, spread=0.04)
    lk = look(losses, MARGIN, plan)
    assert lk is not None and lk.at_look and lk.outcome == "inconclusive"
    assert lk.boundary == plan.c
    assert lk.lo < MARGIN < lk.hi
    gap = MARGIN - lk.mean
    expected = math.ceil(((plan.c + ADVICE_Z) * lk.sd / gap) ** 2) - 20
    assert lk.more_blocks == expected and expected > 0
    # a candidate truly at this estimate then crosses c with power 0.8 (its t's mean clears c by z_0.8); the
    # estimate as the truth (rules/4's count) would cross only about half the time
    assert abs(ADVICE_Z - NormalDist().inv_cdf(0.8)) < 1e-12
    assert gap / (lk.sd / math.sqrt(20 + expected)) >= plan.c + ADVICE_Z
    assert gap / (lk.sd / math.sqrt(20 + expected - 1)) < plan.c + ADVICE_Z


def test_beyond_the_budget_the_boundary_stays_at_c(plan: Design) -> None:
    lk = look(_around(MARGIN - 0.005, 24, spread=0.04), MARGIN, plan)
    assert lk is not None and lk.at_look and lk.boundary == plan.c and lk.outcome == "inconclusive"


def test_ci_and_outcome_agree_at_every_look(plan: Design) -> None:
    # pass <=> the repeated CI lies below the margin; fail <=> above it
    rng = np.random.default_rng(7)
    seen: Counter[str] = Counter()
    for _ in range(200):
        x = rng.normal(MARGIN + rng.normal(0, 0.03), 0.03, 20)
        for n in plan.looks:
            lk = look(x[:n].tolist(), MARGIN, plan)
            assert lk is not None
            seen[lk.outcome] += 1
            assert (lk.outcome == "pass") == (lk.hi < MARGIN)
            assert (lk.outcome == "fail") == (lk.lo > MARGIN)
    assert seen["pass"] and seen["fail"] and seen["continue"] and seen["inconclusive"]


def test_zero_spread(plan: Design) -> None:
    # 4 and 8 copies: a power-of-two count keeps the mean exact, so the sd is exactly 0
    good = look([0.01] * 4, MARGIN, plan)
    assert good is not None and good.sd == 0 and good.se == 0
    assert good.outcome == "pass" and good.t_pass == math.inf
    assert good.lo == good.hi == good.mean == 0.01
    bad = look([0.2] * 8, MARGIN, plan)
    assert bad is not None and bad.outcome == "fail" and bad.t_fail == math.inf
    # between looks zero spread still waits for the look
    between = look([0.01] * 5, MARGIN, plan)
    assert between is not None and between.outcome == "continue"


def test_zero_spread_on_the_bar_is_inconclusive(plan: Design) -> None:
    # 0.0625 and its multiples are exact in binary, so the mean is exactly the margin
    lk = look([0.0625] * 20, 0.0625, plan)
    assert lk is not None and lk.outcome == "inconclusive"
    assert lk.t_pass == lk.t_fail == 0.0 and lk.more_blocks is None


def test_a_one_look_design_is_the_paired_t_test() -> None:
    ten = design(10, 10)
    assert ten.looks == (10,) and ten == fixed(10)
    losses = _around(0.02, 10, spread=0.05)
    lk = look(losses, MARGIN, ten)
    assert lk is not None and lk.boundary == ten.c and lk.at_look
    t = (MARGIN - 0.02) / (float(np.std(losses, ddof=1)) / math.sqrt(10))
    assert lk.t_pass == pytest.approx(t) and t > ten.c  # about 3.1 against t_0.975,9 = 2.263
    assert lk.outcome == "pass"
    early = look(losses[:6], MARGIN, ten)
    assert early is not None and early.outcome == "continue" and not early.at_look


def test_a_candidate_on_the_bar_rarely_passes() -> None:
    # 2000 seeded runs of normal noise at the bar through the calibrated default design: at most
    # alpha (0.025) plus Monte Carlo error (se 0.0035) pass
    plan = design(20, 4)
    rng = np.random.default_rng(20261204)
    outcomes: Counter[str] = Counter()
    for row in rng.normal(MARGIN, 0.0215, (2000, plan.n_max)):
        for n in plan.looks:
            lk = look(row[:n].tolist(), MARGIN, plan)
            assert lk is not None
            if lk.outcome != "continue":
                break
        outcomes[lk.outcome] += 1
    assert set(outcomes) <= {"pass", "fail", "inconclusive"}
    assert 0 < outcomes["pass"] / 2000 <= 0.03
    assert outcomes["fail"] / 2000 <= 0.04  # the fail side is symmetric, and stops some would-be passes
    assert outcomes["inconclusive"] / 2000 > 0.9


# -- settle --------------------------------------------------------------------------------------------

def test_settle_stops_at_the_first_look_that_crosses(plan: Design) -> None:
    # blocks 1-4 equal (passes at 4), then much slower: the decision stays the pass at look 4
    losses = _around(0.0, 4) + [0.3] * 16
    at = settle(losses, MARGIN, plan)
    assert at is not None and at.outcome == "pass" and at.n == 4
    # the same blocks in the other order fail at the first look
    at = settle([0.3, 0.31, 0.29, 0.3, *_around(0.0, 16)], MARGIN, plan)
    assert at is not None and at.outcome == "fail" and at.n == 4


def test_settle_never_decides_between_looks(plan: Design) -> None:
    # 7 blocks: undecided at look 4 (t 4.4 < 5.43), clearly equal by block 7 (t 8.3 > 4.11), but 7 is no look
    losses = [0.02, -0.02, 0.02, -0.02, 0.0, 0.0, 0.0]
    first = look(losses[:4], MARGIN, plan)
    assert first is not None and first.outcome == "continue"
    at = settle(losses, MARGIN, plan)
    assert at is not None and at.n == 7 and at.outcome == "continue"
    assert at.t_pass > at.boundary  # look(final=True) would have passed it here


def test_settle_at_and_past_the_budget(plan: Design) -> None:
    on_bar = [MARGIN - 0.005 + (-1) ** i * 0.025 for i in range(20)]  # no trend: no early look crosses
    at = settle(on_bar, MARGIN, plan)
    assert at is not None and at.n == 20 and at.outcome == "inconclusive" and at.more_blocks
    # blocks past n_max are not used
    past = settle([*on_bar, *([-0.5] * 10)], MARGIN, plan)
    assert past == at
    assert settle([0.0], MARGIN, plan) is None
    assert settle([], MARGIN, plan) is None


def test_settle_agrees_with_looking_by_hand(plan: Design) -> None:
    rng = np.random.default_rng(11)
    for _ in range(100):
        x = rng.normal(MARGIN + rng.normal(0, 0.04), 0.03, 20).tolist()
        by_hand = None
        for n in plan.looks:
            by_hand = look(x[:n], MARGIN, plan)
            if by_hand is not None and by_hand.outcome in ("pass", "fail"):
                break
        assert settle(x, MARGIN, plan) == by_hand


# -- drift and williams ------------------------------------------------------------------------------------

def test_drift_is_the_least_squares_slope() -> None:
    assert drift([0.5 + 0.01 * i for i in range(10)]) == pytest.approx(0.01)
    assert drift([0.3 - 0.002 * i for i in range(7)]) == pytest.approx(-0.002)
    assert drift([0.1] * 6) == 0
    noisy = [0.01 * i + (-1) ** i * 0.005 for i in range(12)]
    assert drift(noisy) == pytest.approx(float(np.polyfit(np.arange(12), noisy, 1)[0]))
    assert drift([0.1, 0.2]) is None


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_williams_balances_positions_and_neighbours(k: int) -> None:
    rows = williams(k)
    assert len(rows) == (k if k % 2 == 0 else 2 * k)
    for row in rows:
        assert sorted(row) == list(range(k))
    # every server in every position equally often
    for pos in range(k):
        counts = Counter(row[pos] for row in rows)
        assert set(counts) == set(range(k)) and len(set(counts.values())) == 1
    # every ordered pair of distinct servers adjacent equally often (once for even k, twice for odd k)
    pairs = Counter(p for row in rows for p in pairwise(row))
    assert set(pairs) == {(a, b) for a in range(k) for b in range(k) if a != b}
    assert set(pairs.values()) == {1 if k % 2 == 0 else 2}


def test_williams_of_one_server() -> None:
    assert williams(1) == [[0]]


# -- defects found by these tests, fixed --------------------------------------------------------------

def test_zero_spread_exactly_on_an_inexact_margin_is_not_decided(plan: Design) -> None:
    lk = look([MARGIN] * 12, MARGIN, plan)  # 12 copies: the mean rounds 7e-18 below the margin
    assert lk is not None and lk.outcome == "continue"


def test_the_repeated_ci_agrees_with_the_outcome_when_alpha_is_split() -> None:
    two = of_settings({"max_blocks": 20, "look_every": 4, "latency_endpoint": True})
    off = [(-1) ** i * 0.05 for i in range(20)]
    se = float(np.std(off, ddof=1)) / math.sqrt(20)
    lk = look([MARGIN + 2.6 * se + x for x in off], MARGIN, two)  # c 2.43 < t_fail 2.6 < c_fail 2.83
    assert lk is not None and lk.outcome == "inconclusive"
    assert lk.lo <= MARGIN
