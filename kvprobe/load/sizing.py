"""Cases sized by precision: from a pilot's measured cost and noise, the case length and the number of
paired blocks that let an equal candidate settle within the load budget.

The pilot is the first PILOT_BLOCKS blocks at the default case size (one conversation per agent). It
gives what a case costs on these servers (its measured time, the unmeasured time around it) and how noisy
a paired case is: the pooled within-case variance of the log throughput ratio across the pilot's blocks,
which does not depend on how far apart the servers are, so sizing from it leaves the test's level alone.

The model: a case T seconds long has a paired log-ratio variance v * (t / T)^NOISE_EXPONENT, v measured
at the pilot's length t. Noise that averages over a case would give an exponent of 1. The H200 does not
average it: a request's time per output token is steady within a case (within a few percent) while its
level moves by up to half between cases (3.6 vs 5.3 ms at one agent), a state the servers keep for a case
and change between cases. Over thirteen recorded run segments of 1.1 to 5.2 s cases (vLLM 0.26,
needle-llama, 2026-12-04 to 12-06; tests/fixtures/runs/h200-*; tests/load/test_h200_speed_runs.py fits it)
the exponent is -0.16 pooled and -0.02 within the runs that ran two case lengths: the level moves between
sessions (a per-case variance of 0.011 to 0.048 at 1-1.5 s cases), not with a case's length. Eleven of
them once fitted 0.27, and the model took 0.2; two runs of one session on 2026-12-06 (h200-placement-*)
brought it to none. So a longer case buys nothing there: the plan keeps the default size and spends the
budget on blocks. The lengthening below stays for noise that does average (an exponent above 0), none
measured yet.

A block of K cases in the endpoint's scope then has spread sigma_b = sqrt(v * (t / T)^e / K), costs
S * C * (T + overrun + overhead) seconds (S servers, C cases), and the design fits n_max = the blocks
the budget holds. Each candidate length is judged by the probability that a candidate equal to the
reference passes at the design's final boundary (noncentral t); the shortest length reaching
TARGET_POWER wins, else the most powerful. The plan takes the 80% upper confidence limit of the pilot's
variance (PLAN_UCL, as for an internal pilot): a pilot of a few degrees of freedom that happened to be
quiet would otherwise plan too short a run.

The pilot's blocks count whenever the plan keeps the default size, the size they ran at (and always when
the operator sized the cases: the pilot then chose only how many blocks the budget holds, from their time).
Whether the plan lengthens the cases depends on the pilot's within-case variance, which under normal noise
is independent of the block means the test compares; benchmarks/speed_decision.py shows the level holds.
When the plan lengthens the cases, the pilot's blocks ran at another size and are a pilot only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvprobe.stats import sequential

PILOT_BLOCKS = 2
POWER_SIMS = 8_000  # the plan's P(pass | equal) to about +-0.005 (seeded)
TARGET_POWER = 0.95  # P(an equal candidate passes): the shortest case length reaching it is planned
DECIDE_POWER = 0.80  # the power at which "the smallest difference this budget can decide" is quoted
PLAN_UCL = 0.80
MULTIPLIERS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
MAX_CASE_S = 60.0
NOISE_EXPONENT = 0.0  # the H200 runs' fit (module docstring); 1: noise that averages over a case
MIN_RESIZED_BLOCKS = 6  # a longer case is planned only while the budget still holds this many blocks of it
BUDGET_SLACK = 0.95  # plan on this share of the time left: block times vary


@dataclass(frozen=True)
class Pilot:
    """What the pilot blocks measured."""

    blocks: int
    case_s: float  # mean measured case time (first request sent to last finished)
    overhead_s: float  # mean wall time around a case that measures nothing (settle, reset, bookkeeping)
    turn_s: float  # median request time: a case bounded by duration_s overruns it by about one turn
    case_var: float | None  # pooled variance of a case's paired log throughput ratio; None: no pair repeated
    df: int

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CasePlan:
    """The case length and design the pilot chose, fixed before the blocks it governs."""

    duration_s: float | None  # None: the default size, and the pilot's blocks count
    multiplier: float
    max_blocks: int
    looks: tuple[int, ...]
    c: float
    block_s: float  # predicted wall time of one block
    sigma_block: float | None  # predicted spread of a block's endpoint log ratio
    p_pass_equal: float | None  # P(an equal candidate passes), noncentral t at the final boundary
    decidable: float | None  # log-ratio distance from the bar decided with DECIDE_POWER
    budget_s: float | None  # the time the plan had
    pilot: Pilot
    counts_pilot: bool = False  # the pilot's blocks are blocks of this design (it keeps the default size)
    case_var_planned: float | None = None  # the variance planned on: the pilot's, at its PLAN_UCL upper limit
    # P(an equal candidate passes) at the pilot's own variance: the likelier figure, which p_pass_equal (at the
    # upper limit, what the length is chosen on) understates by a third at the median of a 5-df pilot on the H200
    p_pass_equal_at_pilot: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "pilot"}
        out["looks"] = list(self.looks)
        out["pilot"] = self.pilot.as_dict()
        return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in out.items()}


def pilot_figures(cases: Iterable[dict[str, Any]], reference: str, walls: Iterable[float],
                  turn_times: Iterable[float]) -> Pilot:
    """From the pilot's `load_case` events, each unit's wall time (settle and reset included) and the
    requests' end-to-end times."""
    cases = list(cases)
    walls, turns = list(walls), sorted(t for t in turn_times if t and t > 0)
    measured = [float(e["summary"]["duration_s"]) for e in cases]
    case_s = sum(measured) / len(measured) if measured else 0.0
    overhead = max(0.0, (sum(walls) - sum(measured)) / len(walls)) if walls and measured else 0.0
    tps: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    for e in cases:
        value = e["summary"].get("output_tokens_per_s")
        if isinstance(value, int | float) and value > 0:
            tps[(e["shape"], e["agents"], e["repeat"])][e["server"]] = float(value)
    per_case: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for (shape, agents, _), by_server in tps.items():
        ref = by_server.get(reference)
        for server, value in by_server.items():
            if ref is not None and server != reference:
                per_case[(server, shape, agents)].append(math.log(ref / value))
    ss, df = 0.0, 0
    for logs in per_case.values():
        if len(logs) >= 2:
            mean = sum(logs) / len(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    blocks = len({e["repeat"] for e in cases})
    return Pilot(blocks, case_s, overhead, turns[len(turns) // 2] if turns else 0.0, ss / df if df else None, df)


def _power(margin: float, sigma: float, design: sequential.Design) -> float:
    """P(pass | equal) of the design, at any of its looks, with normal block losses of spread sigma (seeded
    simulation: the robust statistic has no closed form)."""
    if design.n_max < 2 or not math.isfinite(design.c):
        return 0.0
    if sigma <= 0:
        return 1.0
    return sequential.operating(design, sigma, margin, sims=POWER_SIMS)[0]


def _z(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def plan(pilot: Pilot, *, servers: int, cases: int, scope: int, margin: float, max_blocks: int, look_every: int,
         budget_s: float | None, resize: bool) -> CasePlan:
    """The case length and design for the blocks after the pilot. `servers`: in a block (the reference and
    the open candidates); `cases`: per server per block; `scope`: cases in the endpoint; `budget_s`: the
    time left after the pilot (None: no budget, the design keeps max_blocks); `resize`: False when the
    operator sized the cases, which then keep their size and only the design is fitted."""
    options = []
    var = _upper(pilot.case_var, pilot.df)
    for m in MULTIPLIERS if resize and pilot.case_s > 0 else (1.0,):
        if m > 1 and m * pilot.case_s > MAX_CASE_S:
            break
        length = pilot.case_s if m == 1 else m * pilot.case_s + pilot.turn_s
        block_s = servers * cases * (length + pilot.overhead_s)
        counted = pilot.blocks if m == 1 else 0  # the pilot ran at the default size
        if budget_s is None:
            n = max_blocks
        else:
            n = min(max_blocks, counted + int(BUDGET_SLACK * budget_s // block_s) if block_s > 0 else max_blocks)
        if m > 1 and n < MIN_RESIZED_BLOCKS:
            break  # fewer, longer blocks: a t on a handful of blocks has too few degrees of freedom to gain
        n = max(n, counted, 2)
        looks = sequential.planned_looks(n, look_every, statistic=sequential.STATISTIC)
        c = sequential.calibrate(looks, statistic=sequential.STATISTIC)
        sigma = math.sqrt(var * (pilot.case_s / length) ** NOISE_EXPONENT / scope) if var is not None else None
        power = _power(margin, sigma, sequential.Design(looks, c, statistic=sequential.STATISTIC)) \
            if sigma is not None else None
        decidable = (c + _z(DECIDE_POWER)) * sigma / math.sqrt(n) if sigma is not None else None
        options.append(CasePlan(None if m == 1 else round(m * pilot.case_s, 2), m, n, looks, c, block_s, sigma,
                                power, decidable, budget_s, pilot, m == 1, var))
    enough = [o for o in options if o.p_pass_equal is not None and o.p_pass_equal >= TARGET_POWER]
    chosen = enough[0] if enough else max(options, key=lambda o: (round(o.p_pass_equal or 0.0, 2), -o.multiplier))
    if chosen.sigma_block is None or var is None or pilot.case_var is None:
        return chosen
    at_pilot = _power(margin, _block_at_pilot(chosen),
                      sequential.Design(chosen.looks, chosen.c, statistic=sequential.STATISTIC))
    return replace(chosen, p_pass_equal_at_pilot=at_pilot)


def _upper(var: float | None, df: int) -> float | None:
    """The PLAN_UCL upper confidence limit of a variance estimated on `df` degrees of freedom."""
    from scipy.stats import chi2

    if var is None or df < 1:
        return var
    return var * df / float(chi2.ppf(1 - PLAN_UCL, df))


def _passes(slower: float) -> str:
    """Who the plan passes with power: "up to -2.3% slower" read as a slower candidate passing."""
    if slower >= 0:
        return f"a candidate up to {slower:+.1%} slower"
    return f"only a candidate at least {-slower:.1%} faster"


def _block_at_pilot(p: CasePlan) -> float:
    """The block spread at the pilot's own variance (sigma_block is at its upper limit)."""
    if p.sigma_block is None or not p.case_var_planned or p.pilot.case_var is None:
        return p.sigma_block or 0.0
    return p.sigma_block * math.sqrt(p.pilot.case_var / p.case_var_planned)


def describe(p: CasePlan, margin: float, bar: float) -> list[str]:
    """The plan in words, before the blocks it governs: the case length, the blocks, and what the budget
    can decide."""
    pilot = p.pilot
    length = (f"cases of the default size ({pilot.case_s:.1f} s measured)" if p.duration_s is None
              else f"cases of {p.duration_s:.1f} s ({p.multiplier:g}x the pilot's {pilot.case_s:.1f} s)")
    counted = f", the pilot's {pilot.blocks} counted" if p.counts_pilot else ""
    budget = f" in the {p.budget_s:.0f} s left" if p.budget_s is not None else ""
    lines = [f"load plan: {length}; {p.max_blocks} blocks of ~{p.block_s:.0f} s{budget}{counted}; looks at "
             f"{', '.join(map(str, p.looks))} (final boundary t > {p.c:.2f})"]
    if p.sigma_block is None or p.decidable is None or p.p_pass_equal is None:
        lines.append("load plan: no paired case repeated in the pilot, so no noise figure: the design is only fitted "
                     "to the budget")
        return lines
    slow_pass = -math.expm1(-(margin - p.decidable))
    slow_fail = -math.expm1(-(margin + p.decidable))
    likely = p.p_pass_equal if p.p_pass_equal_at_pilot is None else p.p_pass_equal_at_pilot
    lines.append(f"load plan: at the pilot's noise (one case {math.sqrt(pilot.case_var or 0):.3f}; a block "
                 f"{_block_at_pilot(p):.3f} in log ratio) an equal candidate passes with P ~ {likely:.2f}, and "
                 f"{p.p_pass_equal:.2f} at the {PLAN_UCL:.0%} upper limit of the pilot's {pilot.df}-df noise "
                 f"({math.sqrt(p.case_var_planned or 0):.3f} a case), which the plan is sized on; at "
                 f"{DECIDE_POWER:.0%} power there it passes {_passes(slow_pass)} and fails one "
                 f"{slow_fail:+.1%} slower or more (bar {bar:.0%})")
    if likely < 0.5:  # an impossibility claim: made on the likelier figure, not the cautious one
        need = math.ceil(((p.c + _z(DECIDE_POWER)) * p.sigma_block / margin) ** 2)  # cautious: at the upper limit
        lines.append(f"load plan: speed cannot settle for an equal candidate in this budget (P ~ "
                     f"{likely:.2f}); about {need} blocks of this length (~{need * p.block_s / 60:.0f} min) "
                     f"would give it {DECIDE_POWER:.0%} even at the upper limit: a clearly slower candidate can "
                     "still fail")
    return lines
