"""The H200 speed runs (tests/fixtures/runs/h200-*, ORIGIN.md): what their evidence says, replayed here
without a GPU: the recorded verdicts re-derive, the plan each pilot made follows from its figures, and the
block spreads that set the sizing model's noise exponent."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections import defaultdict

import orjson
import pytest
from recorded import RUNS

from kvprobe.load.sizing import NOISE_EXPONENT, Pilot, plan
from kvprobe.verdict.verify import rederive

MARGIN = -math.log1p(-0.05)


def _load(run: str) -> dict:
    return json.loads((RUNS / run / "load.json").read_text())


def _block_losses(run: str, cand: str) -> list[float]:
    """Each complete block's sweep-mean log(ref / cand) throughput ratio, from the events log."""
    tps: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    with gzip.open(RUNS / run / "events.jsonl.gz", "rt") as fh:
        for line in fh:
            if '"load_case"' in line:
                e = json.loads(line)
                tps[(e["repeat"], e["agents"])][e["server"]] = e["summary"]["output_tokens_per_s"]
    blocks: dict[int, list[float]] = defaultdict(list)
    for (repeat, _), by in tps.items():
        if "auto" in by and cand in by:
            blocks[repeat].append(math.log(by["auto"] / by[cand]))
    cases = max(len(v) for v in blocks.values())
    return [statistics.fmean(v) for _, v in sorted(blocks.items()) if len(v) == cases]


@pytest.mark.parametrize("run", ["h200-speed-sized", "h200-canary-5m", "h200-long-cases", "h200-slow-twin"])
def test_the_recorded_verdict_rederives(run: str) -> None:
    verdict = orjson.loads((RUNS / run / "verdict.json").read_bytes())
    assert rederive(verdict) == []


def _endpoint(run: str, cand: str) -> dict:
    verdict = json.loads((RUNS / run / "verdict.json").read_text())
    return next(c for c in verdict["decisions"][cand]["checks"] if c["id"] == "load.endpoint.throughput_drop")


def test_the_sized_run_fails_the_slow_candidate_and_records_its_plan_and_duty_cycle() -> None:
    assert _endpoint("h200-speed-sized", "int8_per_token_head")["outcome"] == "fail"
    for cand in ("twin", "fp8"):  # undecided at the budget, and said so
        check = _endpoint("h200-speed-sized", cand)
        assert check["outcome"] == "inconclusive" and check["state"] == "spent"
    load = _load("h200-speed-sized")
    sizing = load["sizing"]
    assert load["design"]["max_blocks"] == sizing["max_blocks"] == 15 and sizing["counts_pilot"]
    assert 0.7 < load["duty_cycle"] < 0.8  # 1.45 s cases at the default size: the quiet wait is a quarter of it
    terminal = (RUNS / "h200-speed-sized" / "terminal.txt").read_text()
    assert terminal.index("load plan:") < terminal.index("paired blocks")  # printed before the blocks it governs


def test_under_the_measured_noise_model_the_same_pilot_plans_longer_cases() -> None:
    recorded = _load("h200-speed-sized")["sizing"]
    pilot = Pilot(**recorded["pilot"])
    now = plan(pilot, servers=4, cases=5, scope=5, margin=MARGIN, max_blocks=20, look_every=4,
               budget_s=recorded["budget_s"], resize=True)
    assert now.duration_s is not None and now.duration_s > pilot.case_s
    assert now.p_pass_equal > recorded["p_pass_equal"]
    # two servers (one candidate) in the same budget: an equal candidate passes with P >= 0.95
    alone = plan(pilot, servers=2, cases=5, scope=5, margin=MARGIN, max_blocks=20, look_every=4,
                 budget_s=recorded["budget_s"], resize=True)
    assert alone.p_pass_equal >= 0.95


def test_the_canary_said_before_its_blocks_that_speed_could_not_settle() -> None:
    terminal = (RUNS / "h200-canary-5m" / "terminal.txt").read_text()
    said = terminal.index("speed cannot settle for an equal candidate in this budget")
    assert said < terminal.index("paired blocks")
    assert _load("h200-canary-5m")["sizing"]["p_pass_equal"] < 0.5


def test_longer_cases_cut_the_block_spread_faster_than_noise_that_averages() -> None:
    short = _block_losses("h200-speed-sized", "twin")
    long = _block_losses("h200-long-cases", "twin")
    assert len(short) == 15 and len(long) == 5
    short_s = statistics.fmean(e for e in _case_seconds("h200-speed-sized"))
    long_s = statistics.fmean(e for e in _case_seconds("h200-long-cases"))
    ratio = statistics.stdev(short) / statistics.stdev(long)
    exponent = 2 * math.log(ratio) / math.log(long_s / short_s)
    assert exponent >= NOISE_EXPONENT  # the model's exponent is no bolder than what the H200 showed
    assert _endpoint("h200-long-cases", "twin")["outcome"] == "pass"


def _case_seconds(run: str) -> list[float]:
    with gzip.open(RUNS / run / "events.jsonl.gz", "rt") as fh:
        return [json.loads(line)["summary"]["duration_s"] for line in fh if '"load_case"' in line]


def test_a_candidate_slowed_on_purpose_fails_even_in_a_budget_too_short_for_an_equal_one() -> None:
    terminal = (RUNS / "h200-slow-twin" / "terminal.txt").read_text()
    assert terminal.index("speed cannot settle for an equal candidate") < terminal.index("paired blocks")
    slow = _endpoint("h200-slow-twin", "slow")
    assert slow["outcome"] == "fail" and slow["ratio_interval"][1] < 0.95
    assert _endpoint("h200-slow-twin", "twin")["outcome"] == "inconclusive"
