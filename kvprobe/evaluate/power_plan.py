"""Before the run: how often this plan adopts a candidate equal to the reference, and, when under 0.8, the
sizes that would reach 0.8 and the time they cost.

An equal candidate is one the bars should let through. It still differs from the reference by chance, so
each gating check is a gamble with a pass probability the plan's sizes set. Each is computed by the
project's own rule at a stated spread, never a normal approximation of it:

- a paired 0/1 bar (needle recall, a task's score, the answers cut at the cap, each over the same pairs):
  each pair flips at random with probability d (DISAGREEMENT, 5%), half of them lost and half gained,
  and the check passes when Tango's upper end is within the bar: exact, summed over every (lost, gained)
  count (kvprobe.stats.paired_exact.equal_pass_probability). A bounded non-0/1 score is judged on its
  losses' mass, for which the 0/1 case is the widest: its figure is a floor;
- perplexity: passages whose log-perplexity rise per byte spreads PASSAGE_SPREAD around 0, on a reference
  that repeats itself exactly (the CPU build does); the t interval's upper end within log(1 + bar) is a
  noncentral t event, and fewer than MIN_PASSAGES passages never pass;
- speed: the declared sequential design (kvprobe.stats.sequential.of_settings) simulated by
  `operating` at a block spread of BLOCK_SPREAD (the CPU demos'), seeded, over the whole design (or, where
  budget_s holds fewer blocks, over the design the pilot fits to them), with what it becomes at the H200
  runs' GPU_SPREAD beside it. `eval` knows what the servers run on (kvprobe.server.platform): on GPU servers
  it plans at GPU_SPREAD and costs the budget at FAST_LOAD, on CPU servers at BLOCK_SPREAD and from
  XEON_LOAD down to SLOW_LOAD (PLATFORM_ASSUMED), all a 5M model's; the load probe's pilot re-plans at its own.

P(adopt | equal) is the product of the gating checks' probabilities: it treats them as independent. The
capacity gain is no sampled figure (a candidate frees memory or does not) and an agreement bar has no
stated spread: neither is in the product, and the plan says so.

When the product is under 0.8 the probes that can be enlarged (needles, each task's documents,
perplexity passages) share what the fixed checks leave equally: each is grown to the fewest units at
which its own checks reach (0.8 / fixed)^(1/k), a probe already there kept at its size and its share
given to the rest. Where the speed endpoint holds it under, the plan names the max_blocks that would
reach it (a budget_s must then hold those blocks). Each size is costed by the probe's own model (its
module's budget_cost, the task documents as `kvprobe check` costs them) at the speeds the caller gives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kvprobe.config import Config
from kvprobe.run.budget import LoadPace, Speed, load_pace
from kvprobe.stats import paired_exact, sequential, t_quantile
from kvprobe.verdict.checks import MIN_PASSAGES

TARGET = 0.8
DISAGREEMENT = 0.05
# The sd of one block's sweep-mean log throughput ratio, what the 2-core CPU demos measured on 2026-12-05 (fp8
# vs auto, the robust design): 0.048 over 13 blocks on an Intel Xeon AMX (family 6 model 167), 0.050 over 11 on
# family 6 model 207. Nothing is measured before the load probe's pilot, which re-plans at its own spread; an
# early Xeon pilot's 0.0215 was the quiet end, and planning there promised a pass the demos did not get.
BLOCK_SPREAD = 0.049
# The H200 runs of needle-llama (vLLM 0.26, the default budget): 0.047 to 0.117 over 7 blocks, 0.076 in the
# middle (tests/fixtures/runs/h200-*, docs/speed.md). The plan says what its speed figure becomes there.
GPU_SPREAD = 0.076
# The load probe's paces, fitted to recorded load cases of needle-llama (4 turns of 256 tokens, 64-token
# answers, 1-16 agents), case time = turns x (agents x fresh tokens / rate + answer tokens x decode step):
# the fast end an H100's (tests/fixtures/runs/h100-pinned: 1.6-2.0 s cases, 0.44 s around each once the
# servers are quiet), the slow end the AVX2-only EPYC's (amd-avx2-demo: 2.7-12.4 s cases; on CPUs the
# settle_s pause is slept whole). Each gives its run's block time within 5% (tests/load/test_paces.py); the
# first-prefill smoke's long-prompt rate priced the CPU blocks 2-4x too slow. `check` costs at both ends. A
# 2-core Intel Xeon with AMX ran the same blocks twice as fast as the EPYC (xeon-amx-rules6: 1.1-3.1 s cases,
# 2.15 s around each, a block of 2 servers in 41 s; xeon-amx-demo 57 s for 3): the fast end of CPU servers.
FAST_LOAD = LoadPace(64_000.0, 0.006, 0.45)
SLOW_LOAD = LoadPace(2_800.0, 0.008)
XEON_LOAD = LoadPace(13_600.0, 0.0042, 2.15)


class Assumed(NamedTuple):
    """What eval assumes of the speed blocks before the pilot, for servers of one platform."""

    paces: tuple[tuple[LoadPace, str], ...]  # each pace, and whose recorded blocks (a 5M model's) it fits
    spread: float
    servers: str  # whose: "GPU servers"
    spread_from: str  # the recorded runs the spread was measured on


PLATFORM_ASSUMED: dict[str, Assumed] = {
    "cuda": Assumed(((FAST_LOAD, "an H100's"),), GPU_SPREAD, "GPU servers", "the H200 runs'"),
    "cpu": Assumed(((XEON_LOAD, "a 2-core Xeon's"), (SLOW_LOAD, "a 2-core AVX2-only EPYC's")), BLOCK_SPREAD,
                   "CPU servers", "the 2-core CPU demos'"),
}
# The sd of a passage's log-perplexity rise per byte, fp8 against auto on the Xeon demo
# (tests/fixtures/runs/xeon-amx-demo; its delta's se over 16 passages was 0.28%).
PASSAGE_SPREAD = 0.0112
SPEED_SIMS = 2_000  # P(pass | equal) to about +-0.01 where it matters; `check` stays quick
SPEED_SEED = 20261207
# The shipped kvprobe_qa documents are 80-1,000 tokens; a task of one's own is costed the same way.
TASK_PROMPT_TOKENS = 500
MAX_UNITS = paired_exact.MAX_PAIRS


@functools.lru_cache(maxsize=8192)
def binary_pass(n: int, bar: float, disagreement: float) -> float:
    """P(pass | equal) of a paired 0/1 bar over n pairs, exactly."""
    if n < 1 or bar <= 0:
        return 0.0  # a bar of 0 can only fail or be inconclusive
    return min(1.0, paired_exact.equal_pass_probability(n, bar, disagreement))


@functools.lru_cache(maxsize=4096)
def perplexity_pass(n: int, bar: float, spread: float = PASSAGE_SPREAD) -> float:
    """P(pass | equal) of the perplexity bar over n passages of equal weight: the t interval's upper end
    (n - 1 df) under log(1 + bar) when the true rise is 0, a noncentral t tail."""
    from scipy import stats as st

    if n < MIN_PASSAGES or bar <= 0:
        return 0.0
    if spread <= 0:
        return 1.0
    ncp = math.log1p(bar) * math.sqrt(n) / spread
    return float(st.nct.sf(t_quantile(0.975, n - 1), n - 1, ncp))


def perplexity_fail(n: int, bar: float, rise: float, spread: float = PASSAGE_SPREAD) -> float:
    """P(fail) of the perplexity bar over n passages when the true relative rise is `rise`: the t interval's
    lower end (n - 1 df) over log(1 + bar), a noncentral t tail."""
    from scipy import stats as st

    if n < MIN_PASSAGES or spread <= 0:
        return 0.0 if n < MIN_PASSAGES else float(rise > bar)
    ncp = (math.log1p(rise) - math.log1p(bar)) * math.sqrt(n) / spread
    return float(st.nct.sf(t_quantile(0.975, n - 1), n - 1, ncp))


@functools.lru_cache(maxsize=64)
def _speed_pass(design: sequential.Design, spread: float, margin: float) -> float:
    return sequential.operating(design, spread, margin, 0.0, SPEED_SIMS, "normal", SPEED_SEED)[0]


def speed_pass(load: Any, bar: float, spread: float = BLOCK_SPREAD, *, drop: bool = True,
               stop: int | None = None) -> float:
    """P(pass | equal) of one speed endpoint under the declared design, simulated (seeded); `stop`: the
    blocks a budget holds, when fewer than the design's. The pilot then fits the design to them
    (kvprobe.load.sizing.plan sets max_blocks), so it is that design, its looks and its boundary, that
    runs: a look the budget cuts short never decides (sequential.settle)."""
    if bar <= 0:
        return 0.0
    margin = -math.log1p(-bar) if drop else math.log1p(bar)
    design = sequential.of_settings(load)
    if stop is not None and stop < design.n_max:
        design = sequential.of_settings(load.model_copy(update={"max_blocks": max(2, stop)}))
    return _speed_pass(design, spread, margin)


def budget_stops(config: Config, servers: int, paces: Sequence[LoadPace]) -> list[int | None]:
    """The blocks [load] budget_s holds at each of `paces`, None where it holds the whole design; [] when
    there is no budget or no pace to cost it at."""
    from kvprobe.probes.load import budget_blocks

    if config.load.budget_s is None or config.load.repeats is not None or not paces:
        return []
    n_max = sequential.of_settings(config.load).n_max
    held = [budget_blocks(config, servers, p) for p in paces]
    return [n if n is not None and n < n_max else None for n in held]


def _most(stops: list[int | None]) -> int | None:
    """The most blocks any costed speed's budget holds (None: the whole design)."""
    return None if not stops or None in stops else max(n for n in stops if n is not None)


@dataclass(frozen=True)
class CheckPower:
    """One gating check's pass probability for an equal candidate at the plan's size."""

    id: str
    bar: str
    limit: float
    probe: str
    n: int
    unit: str
    p_pass: float


@dataclass(frozen=True)
class Resize:
    """What one enlargeable probe would need: its size now, the size that reaches its share, and their time
    (seconds at each speed the caller gave)."""

    probe: str
    setting: str
    unit: str
    have: int
    need: int | None
    p_have: float
    p_need: float | None
    seconds_have: list[float]
    seconds_need: list[float] | None
    note: str | None = None


@dataclass
class PowerPlan:
    checks: list[CheckPower]
    p_adopt: float
    assumed: dict[str, Any]
    not_in_product: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # where an assumed figure meets a measured one
    resizes: list[Resize] = field(default_factory=list)
    p_adopt_resized: float | None = None
    why_not: str | None = None  # under TARGET and no size reaches it

    @property
    def reaches(self) -> bool:
        return self.p_adopt >= TARGET

    def as_dict(self) -> dict[str, Any]:
        return {"target": TARGET, "assumed": self.assumed, "independent": True,
                "checks": [asdict(c) for c in self.checks], "p_adopt_equal": self.p_adopt,
                "reaches_target": self.reaches, "not_in_product": self.not_in_product, "caveats": self.caveats,
                "would_reach": None if self.reaches else {
                    "sizes": [asdict(r) for r in self.resizes if r.need != r.have],
                    "p_adopt_equal": self.p_adopt_resized, "why_not": self.why_not}}


@dataclass(frozen=True)
class _Unit:
    """A probe whose size sets some gating checks' power: P at n is the product of theirs."""

    probe: str
    setting: str
    unit: str
    have: int
    checks: tuple[tuple[str, str, float], ...]  # (id, bar name, limit)
    p_at: Callable[[int], float]
    most: int | None = None  # what its source holds (the shipped task's documents), if known
    source: str = ""


def _check_pass(bar: str, limit: float, n: int, d: float, d_cut: float, spread: float) -> float:
    """One gating check's P(pass | equal) at n units, by the rule its bar is judged with."""
    if bar == "perplexity_delta_max":
        return perplexity_pass(n, limit, spread)
    return binary_pass(n, limit, d_cut if bar == "truncation_rise_max" else d)


def _unit(probe: str, setting: str, unit: str, have: int, checks: list[tuple[str, str, float]], d: float,
          d_cut: float, spread: float, most: int | None = None, source: str = "") -> _Unit:
    def p_at(n: int) -> float:
        p = 1.0
        for _, bar, limit in checks:  # a check that cannot pass ends it: the rest are exact sums, costly at large n
            p *= _check_pass(bar, limit, n, d, d_cut, spread)
            if p == 0.0:
                break
        return p
    return _Unit(probe, setting, unit, have, tuple(checks), p_at, most, source)


def planned_passages(config: Config) -> tuple[int | None, str]:
    """The perplexity passages a run scores and where they come from (None: a task of one's own, counted
    only when lm-eval loads it)."""
    from kvprobe.config import check_passages
    from kvprobe.corpus import TASKS_DIR

    settings = config.perplexity
    if settings.passages:
        count: int | None = check_passages(Path(settings.passages))
        source = f"passages {settings.passages}"
    elif settings.include_path:
        count, source = None, f"task {settings.task} in {settings.include_path}"
    else:
        count, source = check_passages(TASKS_DIR / "perplexity" / "passages.jsonl"), f"shipped {settings.task}"
    if settings.limit is not None:
        count = min(count, settings.limit) if count is not None else settings.limit
    return count, source


def task_seconds(config: Config, documents: int, servers: int, speed: Speed) -> float:
    """Task documents costed like needles: a prompt of TASK_PROMPT_TOKENS and an answer on every server."""
    from kvprobe.probes.needle import NEEDLE_ANSWER_TOKENS

    answer = NEEDLE_ANSWER_TOKENS * speed.s_per_decoded_token
    return documents * servers * (TASK_PROMPT_TOKENS / speed.prompt_tokens_per_s + answer) / config.tasks.num_concurrent


def unit_seconds(config: Config, probe: str, n: int, servers: int, speed: Speed, max_model_len: int) -> float:
    """Seconds of `probe` at n of its units, by its module's own cost model."""
    from kvprobe.probes import PROBES

    if probe.startswith("tasks"):
        return task_seconds(config, n, servers, speed)
    cost = PROBES[probe].budget_cost
    return cost(config, servers, speed, max_model_len).seconds(n) if cost is not None else 0.0


def _units(config: Config, probes: Sequence[str], documents: dict[str, int], passages: int | None, source: str,
           d: float, d_cut: float, spread: float) -> tuple[list[_Unit], list[str]]:
    bars, units, left = config.bars, [], []
    if "perplexity" in probes:
        if passages is None:
            left.append("perplexity.delta: its passages are counted only when lm-eval loads the task")
        else:
            # With a limit the source may hold more than the run scores: how many is not known here.
            units.append(_unit("perplexity", "perplexity passages", "passages", passages,
                               [("perplexity.delta", "perplexity_delta_max", bars.perplexity_delta_max)], d, d_cut,
                               spread, passages if config.perplexity.limit is None else None, source))
    if "needle" in probes:
        units.append(_unit("needle", "needle.count", "needles", config.needle.count,
                           [("needle.recall_drop", "needle_recall_drop_max", bars.needle_recall_drop_max),
                            ("needle.truncation_rise", "truncation_rise_max", bars.truncation_rise_max)],
                           d, d_cut, spread))
    if "tasks" in probes:
        for task, count in sorted(documents.items()):
            limit = bars.task_bar(task)
            if limit is None:
                continue
            most = count if config.tasks.limit is None else None
            units.append(_unit(f"tasks.{task}", f"{task} documents", "documents", count,
                               [(f"tasks.{task}.drop", "task_accuracy_drop_max", limit),
                                (f"tasks.{task}.truncation_rise", "truncation_rise_max", bars.truncation_rise_max)],
                               d, d_cut, spread, most, task))
    if "agreement" in probes:
        left += [f"agreement {b}: no stated spread to model it" for b in ("kl_mean_max", "top1_agreement_min")
                 if getattr(bars, b) is not None]
    if "capacity" in probes:
        left.append(f"capacity_gain_min {bars.capacity_gain_min:g}: not sampled (a candidate frees memory or not)")
    return units, left


def _unit_checks(unit: _Unit, n: int, d: float, d_cut: float, spread: float) -> list[CheckPower]:
    return [CheckPower(check_id, bar, limit, unit.probe.split(".")[0], n, unit.unit,
                       _check_pass(bar, limit, n, d, d_cut, spread)) for check_id, bar, limit in unit.checks]


def fewest_reaching(p_at: Callable[[int], float], target: float, start: int) -> int | None:
    """The fewest n >= start with p_at(n) >= target: every n up to LINEAR_UP_TO, then 5% steps and a
    bisection (the pass probabilities are sawtooths in n, as paired_exact.equal_size says)."""
    top = min(paired_exact.LINEAR_UP_TO, MAX_UNITS)
    for n in range(max(1, start), top + 1):
        if p_at(n) >= target:
            return n
    below = max(top, start)
    while below < MAX_UNITS:
        above = min(MAX_UNITS, math.ceil(below * 1.05))
        if p_at(above) >= target:
            while above - below > 1:
                mid = (above + below) // 2
                below, above = (below, mid) if p_at(mid) >= target else (mid, above)
            return above
        below = above
    return None


def _share(units: list[_Unit], fixed: float) -> dict[str, int | None]:
    """Each unit's size: those under an equal share of what the fixed checks leave grow to reach it, those
    over it keep their size and give their share to the rest."""
    kept: dict[str, int] = {}
    while True:
        grow = [u for u in units if u.probe not in kept]
        held = fixed * math.prod(u.p_at(u.have) for u in units if u.probe in kept)
        if not grow or held <= 0:
            return {**kept, **{u.probe: None for u in grow}}
        share = (TARGET / held) ** (1 / len(grow))
        if share > 1:
            return {**kept, **{u.probe: None for u in grow}}
        over = [u for u in grow if u.p_at(u.have) >= share]
        if not over:
            return {**kept, **{u.probe: fewest_reaching(u.p_at, share, u.have) for u in grow}}
        kept.update({u.probe: u.have for u in over})


def assumed_for(devices: Sequence[str | None]) -> str | None:
    """The PLATFORM_ASSUMED key eval plans speed at, for servers on `devices` ("cuda", "cpu", None: not said):
    "cuda" when every server runs on a GPU, "cpu" when any runs on a CPU and every one said; else None (the
    budget is not costed, the spread is the CPU demos')."""
    kinds = set(devices)
    if not kinds or None in kinds:
        return None
    return "cpu" if "cpu" in kinds else "cuda"


def plan_power(config: Config, probes: Sequence[str], *, documents: dict[str, int] | None = None,
               passages: int | None = None, servers: int | None = None, max_model_len: int = 8192,
               speeds: Sequence[Speed] = (), disagreement: float = DISAGREEMENT, cut_disagreement: float | None = None,
               passage_spread: float = PASSAGE_SPREAD, block_spread: float = BLOCK_SPREAD,
               load_paces: Sequence[LoadPace] | None = None, platform: str | None = None) -> PowerPlan:
    """The power of `probes` as `config` sizes them. `documents`: each task's documents (its preflight);
    `passages`: the perplexity passages (planned_passages when None); `speeds`: what each size is costed
    at (none: no time); `cut_disagreement`: the share of cut-at-the-cap answers that flip (default d);
    `load_paces`: the paces [load] budget_s and more blocks are costed at (default: `speeds` as paces, see
    load_pace; none: not costed); `platform`: a PLATFORM_ASSUMED key, when the paces and `block_spread` are
    that platform's (assumed_for), which the words then say."""
    d = disagreement
    d_cut = d if cut_disagreement is None else cut_disagreement
    servers = servers or len(config.servers)
    source = ""
    if "perplexity" in probes:  # counted once: the passages file is read to count them
        counted, source = planned_passages(config)
        passages = counted if passages is None else passages
    units, left = _units(config, probes, documents or {}, passages, source, d, d_cut, passage_spread)
    checks = [c for u in units for c in _unit_checks(u, u.have, d, d_cut, passage_spread)]
    load = config.load
    # With assumed paces (`check`: a GPU's and the 2-core CPU's) the figure is at the fastest, the most the
    # budget can hold, and the caveat gives the slowest's.
    paces = [load_pace(s) for s in speeds] if load_paces is None else list(load_paces)
    stops = budget_stops(config, servers, paces) if "load" in probes else []
    stop = _most(stops)
    budget_note = None
    if "load" in probes and not load.advisory:
        blocks = load.blocks if stop is None else stop
        checks.append(CheckPower("load.endpoint.throughput_drop", "throughput_drop_max",
                                 config.bars.throughput_drop_max, "load", blocks, "blocks",
                                 speed_pass(load, config.bars.throughput_drop_max, block_spread, stop=stop)))
        if load.latency_endpoint:
            # Its own spread is not known before the pilot: the throughput's, stated.
            checks.append(CheckPower(f"load.endpoint.{load.latency_endpoint}_rise", "p99_latency_rise_max",
                                     config.bars.p99_latency_rise_max, "load", blocks, "blocks",
                                     speed_pass(load, config.bars.p99_latency_rise_max, block_spread, drop=False,
                                                stop=stop)))
        else:
            left.append(latency_not_gated(config.bars.p99_latency_rise_max))
        budget_note = budget_said(config, servers, paces, stops, block_spread, platform)
    assumed = {"disagreement": d, "cut_disagreement": d_cut, "passage_spread": passage_spread,
               "block_spread": block_spread, "speed_sims": SPEED_SIMS, "platform": platform,
               "speeds": [{"prompt_tokens_per_s": s.prompt_tokens_per_s, "s_per_decoded_token": s.s_per_decoded_token}
                          for s in speeds],
               "load_paces": [p._asdict() for p in paces]}
    out = PowerPlan(checks, math.prod(c.p_pass for c in checks), assumed, left)
    if budget_note:
        out.caveats.append(budget_note)
    if "load" in probes and not load.advisory and block_spread < GPU_SPREAD and platform is None:
        out.caveats.append(measured_speed(load, config.bars.throughput_drop_max, block_spread, stop))
    if out.reaches or not units:
        if not out.reaches:
            out.why_not = "no planned probe's size can be raised to reach it" + _more_blocks(
                config, out, block_spread, servers, paces)
        return out

    def seconds(probe: str, n: int) -> list[float]:
        return [unit_seconds(config, probe, n, servers, s, max_model_len) for s in speeds]

    fixed = math.prod(c.p_pass for c in checks if c.probe == "load")
    sizes = _share(units, fixed)
    for u in units:
        need = sizes[u.probe]
        note = None
        if need is not None and u.most is not None and need > u.most:
            note = (f"{u.source or u.probe} has {u.most} {u.unit}: more needs {u.unit} of your own"
                    if u.unit == "documents" else f"the {u.source} set has {u.most}: give passages of your own")
        out.resizes.append(Resize(u.probe, u.setting, u.unit, u.have, need, u.p_at(u.have),
                                  u.p_at(need) if need is not None else None, seconds(u.probe, u.have),
                                  seconds(u.probe, need) if need is not None else None, note))
    if any(r.need is None for r in out.resizes):
        out.why_not = ("the checks that cannot be resized hold it under 0.8"
                       + _more_blocks(config, out, block_spread, servers, paces)
                       if fixed < TARGET else f"no size up to {MAX_UNITS:,} reaches it")
        return out
    out.p_adopt_resized = fixed * math.prod(r.p_need or 0.0 for r in out.resizes)
    return out


def plan_at_the_servers(config: Config, probes: Sequence[str], inventories: Sequence[Any],
                        documents: dict[str, int] | None = None) -> PowerPlan:
    """The plan eval says before its probes, from what the inventory found (kvprobe.server.inventory): each size
    costed at the slowest first-prefill smoke's speed, when one was measured; speed planned at the spread, and
    the load budget costed at the paces, of the platform the serving servers report (PLATFORM_ASSUMED). The
    smoke prices one long prompt, where the load's short turns batch several times faster, so it never prices
    the blocks; the load probe's pilot times real ones and re-plans."""
    from kvprobe.run.budget import smoke_rate

    serving = [inv for inv in inventories if inv.serving]
    lengths = [inv.max_model_len for inv in serving if inv.max_model_len]
    rate = smoke_rate(list(inventories))
    platform = assumed_for([inv.platform.device if inv.platform else None for inv in serving])
    said = PLATFORM_ASSUMED.get(platform or "")
    return plan_power(config, probes, documents=documents, max_model_len=min(lengths, default=8192),
                      speeds=(Speed(rate),) if rate else (),
                      load_paces=tuple(pace for pace, _ in said.paces) if said else (),
                      block_spread=said.spread if said else BLOCK_SPREAD, platform=platform)


def measured_speed(load: Any, bar: float, assumed: float, stop: int | None = None) -> str:
    """The speed endpoint's P(pass | equal) at the H200 runs' spread, beside the one planned at."""
    p = speed_pass(load, bar, GPU_SPREAD, stop=stop)
    over = (f"the {stop} blocks its budget holds" if stop is not None
            else f"all its {load.blocks} blocks (fewer when budget_s stops it first)")
    return (f"speed is planned at a block spread of {assumed:g} (the 2-core CPU demos'); the H200 runs of a 5M "
            f"model measured {GPU_SPREAD:g}, where this design passes an equal candidate {p:.2f} over {over}, "
            "and P(adopt | equal) is that times the rest: the load probe's pilot measures the spread and says "
            "what would settle it")


def budget_said(config: Config, servers: int, paces: Sequence[LoadPace], stops: list[int | None],
                spread: float = BLOCK_SPREAD, platform: str | None = None) -> str | None:
    """What [load] budget_s does to the speed figure: the blocks it holds at each pace (with whose blocks each
    pace was fitted to, when they are `platform`'s), or that it is not costed."""
    from kvprobe.probes.load import block_seconds

    load = config.load
    if load.budget_s is None or load.repeats is not None:
        return None
    if not paces:
        return (f"[load] budget_s {load.budget_s:g} s is not costed before the pilot: speed is planned over the "
                f"design's {load.blocks} blocks, and the pilot re-plans within the budget at its blocks' measured "
                "time (the recorded runs of a 5M model: ~32 s a block of 3 servers on an H100, 56 s on a 2-core Xeon, "
                "82 s a block of 2 on an AVX2-only EPYC; the first-prefill smoke's long-prompt rate would price "
                "them 2-4x too slow)")
    if all(n is None for n in stops):
        return None
    bar = config.bars.throughput_drop_max
    said = PLATFORM_ASSUMED.get(platform or "")
    whose = dict(said.paces) if said else {}

    def note(pace: LoadPace, n: int | None) -> str:
        parts = ([whose[pace]] if pace in whose else []) + (
            [f"speed P(pass | equal) {speed_pass(load, bar, spread, stop=n):.3f}"] if len(paces) > 1 else [])
        return f" ({'; '.join(parts)})" if parts else ""

    held = [f"{'all' if n is None else f'about {n}'} of the design's {load.blocks} blocks at "
            f"{block_seconds(config, servers, s)[1]:.0f} s a block{note(s, n)}"
            for s, n in zip(paces, stops, strict=True)]
    stop = _most(stops)
    planned = (f"as a design of {stop} blocks, the one the pilot fits to what the budget holds" if stop is not None
               else "over the whole design")
    assumed = f", a 5M model's blocks assumed for {said.servers} (a larger model's are longer)" if said else ""
    return (f"[load] budget_s {load.budget_s:g} s holds {'; '.join(held)}{assumed}: speed is planned {planned}; "
            "the pilot re-plans at the blocks' measured time")


MOST_BLOCKS = 400  # past this a design is no plan: the cases must be longer or the servers quieter


def blocks_reaching(load: Any, bar: float, spread: float, target: float, start: int | None = None) -> int | None:
    """The fewest max_blocks from `start` (default: the declared max_blocks; in steps of look_every) whose
    design passes an equal candidate with `target` at `spread`; None past MOST_BLOCKS. Coarse on purpose:
    each size is a calibration and a simulation."""
    if load.repeats is not None or bar <= 0:
        return None
    step = max(1, load.look_every)
    n = max(load.max_blocks if start is None else start, sequential.ROBUST_MIN_LOOK)
    while n <= MOST_BLOCKS:
        if speed_pass(load.model_copy(update={"max_blocks": n}), bar, spread) >= target:
            return n
        n += step * max(1, n // 32)  # ever coarser: 4 apart to 32, 8 to 64, ...
    return None


def _more_blocks(config: Config, plan: PowerPlan, spread: float, servers: int, paces: Sequence[LoadPace]) -> str:
    """Where the speed endpoint holds the product under TARGET: the max_blocks that would lift it there,
    and the budget_s those blocks need at the paces given."""
    load = config.load
    speed = next((c for c in plan.checks if c.id == "load.endpoint.throughput_drop"), None)
    if speed is None or load.repeats is not None:
        return ""
    rest = plan.p_adopt / speed.p_pass if speed.p_pass > 0 else 0.0
    if rest < TARGET:
        return ""
    cut = speed.n < load.blocks  # the budget stops the design before its last look
    # Where the budget cuts the design short, a smaller whole design may need less time than a longer budget.
    need = blocks_reaching(load, config.bars.throughput_drop_max, spread, TARGET / rest,
                           sequential.ROBUST_MIN_LOOK if cut else None)
    if need is None:
        return (f"; speed cannot reach it within {MOST_BLOCKS} blocks at a block spread of {spread:g}: lengthen the "
                "cases or quiet the servers")
    p_need = speed_pass(load.model_copy(update={"max_blocks": need}), config.bars.throughput_drop_max, spread)
    blocks = f"[load] max_blocks = {need}"
    if cut:
        blocks = f"{f'its {need} blocks' if need == load.max_blocks else blocks} run whole"
    return (f"; speed would with {blocks} (P {speed.p_pass:.3f} -> {p_need:.3f}), "
            + _holding(config, need, servers, paces))


def _holding(config: Config, blocks: int, servers: int, paces: Sequence[LoadPace]) -> str:
    """'and a budget_s that holds them (~N min)' at the paces given, or without a time when none is."""
    from kvprobe.probes.load import block_seconds

    if not paces:
        return "and a budget_s that holds them"
    times = [warmup + blocks * block for warmup, block in (block_seconds(config, servers, p) for p in paces)]
    return f"and a budget_s that holds them ({_time(times)})"


def latency_not_gated(bar: float) -> str:
    """What p99_latency_rise_max does when no latency endpoint is declared, said where the power is."""
    return (f"p99_latency_rise_max {bar:g}: latency is not gated (no [load] latency_endpoint): each case's p99 "
            f"rise is a guardrail that fails only past {2 * bar:+.0%}, twice the bar; latency_endpoint = "
            "\"itl_p99\" gates it")


# -- words ---------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def span(low: float, high: float) -> str:
    a, b = duration(low), duration(high)
    if a == b:
        return f"~{a}"
    if a.split()[-1] == b.split()[-1]:
        return f"{a.split()[0]}-{b}"
    return f"{a} to {b}"


def _time(seconds: list[float] | None) -> str:
    return span(min(seconds), max(seconds)) if seconds else ""


def lines(data: dict[str, Any]) -> list[str]:
    """The power block (PowerPlan.as_dict) as the lines `check` and `eval` print, each starting `power:`."""
    a = data["assumed"]
    probes = {c["probe"] for c in data["checks"]}
    model = []
    if probes & {"needle", "tasks"}:
        model.append(f"0/1 answers flipping at d = {a['disagreement']:.1%} (half lost, half gained), answers cut at "
                     f"the cap at {a['cut_disagreement']:.1%}")
    if "perplexity" in probes:
        model.append(f"passages' perplexity rise spread {a['passage_spread']:.2%}")
    if "load" in probes:
        said = PLATFORM_ASSUMED.get(a.get("platform") or "")
        source = f", {said.spread_from} assumed for {said.servers}" if said else ""
        model.append(f"speed blocks spread {a['block_spread']:g} (log ratio{source}, {a['speed_sims']:,} seeded runs)")
    out = ["power: P(pass | equal) per gating check, for a candidate equal to the reference"
           + (f": {'; '.join(model)}" if model else "")]
    for c in data["checks"]:
        out.append(f"power:   {c['id']:<34} {c['n']:>5,} {c['unit']:<9} {c['p_pass']:.3f}")
    for why in data["not_in_product"]:
        out.append(f"power:   not in the product: {why}")
    out.append(f"power: P(adopt | equal) = {data['p_adopt_equal']:.3f} (the product: the checks taken as "
               "independent)")
    out += [f"power: caveat: {why}" for why in data.get("caveats") or []]
    would = data["would_reach"]
    if would is None:
        return out
    if would["why_not"]:
        out.append(f"power: cannot reach {data['target']:g}: {would['why_not']}")
        return out
    parts = []
    for r in would["sizes"]:
        cost = f", {_time(r['seconds_need'])} (now {_time(r['seconds_have'])})" if r["seconds_need"] else ""
        note = f"; {r['note']}" if r["note"] else ""
        parts.append(f"{r['setting']} {r['have']:,} -> {r['need']:,} (P {r['p_have']:.3f} -> {r['p_need']:.3f}"
                     f"{cost}{note})")
    out.append(f"power: cannot reach {data['target']:g}: " + "; ".join(parts)
               + f" would give P(adopt | equal) = {would['p_adopt_equal']:.3f}")
    return out
