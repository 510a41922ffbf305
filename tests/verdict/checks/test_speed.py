"""Speed checks (kvprobe.verdict.checks.speed): one declared endpoint decided by the group-sequential paired test
over blocks, and per-case guardrails that fail only past twice the bar and never gate adopt."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from kvprobe.config import Bars
from kvprobe.verdict.build import decide
from kvprobe.verdict.checks import judge, judge_probe
from kvprobe.verdict.checks.speed import Blocks, case_key, runs_by_case
from kvprobe.verdict.sealed.checks import RULES4_PROBES

BARS = Bars(throughput_drop_max=0.05, p99_latency_rise_max=0.10)
DESIGN = {"endpoint": "sweep", "latency_endpoint": None, "max_blocks": 20, "look_every": 4, "repeats": None}


def _case(tps: list[float], p99: list[float], agents: int = 4, **extra: float) -> dict:
    return {"agents": agents, "shape": "default",
            "repeats": [{"repeat": i, "output_tokens_per_s": t, "ttft_p99_s": p, "itl_p99_s": p, "e2e_p99_s": p,
                         **extra} for i, (t, p) in enumerate(zip(tps, p99, strict=True))]}


def _inputs(ref: list[dict], cand: list[dict], design: dict | None = None, stops: dict | None = None) -> dict:
    load = {"servers": {"ref": {"cases": ref}, "cand": {"cases": cand}}, "design": design or DESIGN}
    if stops:
        load["stops"] = stops
    return {"reference": "ref", "probes": {"load": load}, "probes_status": {"load": "ran"}}


def _checks(ref: list[dict], cand: list[dict], **kw) -> dict[str, dict]:
    return {c["id"]: c for c in judge_probe("load", _inputs(ref, cand, **kw), "cand", BARS)}


def _noise(n: int, sd: float, seed: int = 0) -> list[float]:
    """Deterministic +-sd wiggles (no RNG: the same numbers on every CPU)."""
    return [sd * math.sin(1.7 * i + seed) * math.sqrt(2) for i in range(n)]


REF8 = [_case([100 * math.exp(x) for x in _noise(8, 0.01)], [1.0] * 8)]
ENDPOINT = "load.endpoint.throughput_drop"


def test_an_equal_candidate_passes_at_the_first_look_and_a_slow_one_fails() -> None:
    same = _checks(REF8, [_case([100 * math.exp(x) for x in _noise(8, 0.01, 1)], [1.0] * 8)])
    ep = same[ENDPOINT]
    assert ep["outcome"] == "pass" and ep["state"] == "decided" and ep["gating"] is True
    assert ep["sequential"]["look"]["n"] == 4  # decided at the first planned look, not at 8
    assert "pass boundary t > 5.43" in ep["text"]
    slow = _checks(REF8, [_case([60 * math.exp(x) for x in _noise(8, 0.01, 2)], [2.0] * 8)])
    assert slow[ENDPOINT]["outcome"] == "fail" and slow[ENDPOINT]["value"] == pytest.approx(0.4, abs=0.01)
    ttft = slow["load.shape=default.agents=4.ttft_p99_rise"]
    assert ttft["outcome"] == "fail" and ttft["gating"] is False and ttft["limit"] == pytest.approx(0.2)
    assert "guardrail" in ttft["text"]


def test_an_undecided_endpoint_says_where_it_stands_and_what_would_settle_it() -> None:
    noisy = [_case([100 * math.exp(x) for x in _noise(4, 0.08, 3)], [1.0] * 4)]
    ep = _checks([_case([100] * 4, [1.0] * 4)], noisy)[ENDPOINT]
    assert ep["outcome"] == "inconclusive" and ep["state"] == "open" and ep["text"].endswith(": not yet")
    spent = _checks([_case([100] * 4, [1.0] * 4)], noisy, stops={"cand": "the load budget was spent after 4 blocks"})
    assert spent[ENDPOINT]["state"] == "spent"
    assert "budget was spent after 4 blocks" in spent[ENDPOINT]["text"] and "more blocks would settle it" in \
        spent[ENDPOINT]["text"]
    one = _checks([_case([100], [1.0])], [_case([50], [2.0])])[ENDPOINT]
    assert one["outcome"] == "inconclusive" and one["interval"] is None


def test_advice_past_ten_times_the_designs_blocks_says_the_design_cannot_settle_it() -> None:
    """At the bar with a wide spread, the estimate-as-truth count runs to hundreds of blocks for a design of
    3: that is said in words (rules/4 gave the count)."""
    design = DESIGN | {"repeats": 3}
    ref = [_case([100, 100, 100], [1.0] * 3)]
    cand = [_case([95 * math.exp(x) for x in _noise(3, 0.08, 4)], [1.0] * 3)]
    inputs = _inputs(ref, cand, design=design)
    ep = next(c for c in judge_probe("load", inputs, "cand", BARS) if c["id"] == ENDPOINT)
    more = ep["sequential"]["look"]["more_blocks"]
    assert ep["state"] == "spent" and more + 3 > 10 * 3
    assert ep["text"].endswith("(all 3 blocks used; this design cannot settle it: lengthen the budget or quiet the "
                               "servers)")
    rules4 = next(c for c in RULES4_PROBES["load"](inputs, "cand", BARS) if c["id"] == ENDPOINT)
    even_odds = rules4["sequential"]["look"]["more_blocks"]
    assert rules4["text"].endswith(f"(all 3 blocks used; about {even_odds} more blocks would settle it)")
    assert even_odds < more  # rules/4 quoted the estimate as the truth; rules/5 the blocks for power 0.8


def test_the_advice_on_more_blocks_is_at_power_0_8() -> None:
    """Inconclusive at the budget but within reach: the count is the blocks at which a candidate at the
    estimate settles 4 times in 5, said as such; rules/4 counted the blocks that give it even odds."""
    design = DESIGN | {"repeats": 3}
    ref = [_case([100, 100, 100], [1.0] * 3)]
    cand = [_case([97 * math.exp(x) for x in _noise(3, 0.01, 4)], [1.0] * 3)]
    inputs = _inputs(ref, cand, design=design)
    ep = next(c for c in judge_probe("load", inputs, "cand", BARS) if c["id"] == ENDPOINT)
    look = ep["sequential"]["look"]
    more = look["more_blocks"]
    assert ep["outcome"] == "inconclusive" and more and 3 + more <= 10 * 3
    assert ep["text"].endswith(f"(all 3 blocks used; about {more} more blocks would settle it 80% of the time if "
                               "the estimate holds)")
    gap = -math.log(0.95) - look["mean"]
    z = NormalDist().inv_cdf(0.8)
    assert gap / (look["sd"] / math.sqrt(3 + more)) >= look["boundary"] + z  # its t then clears c by z_0.8
    rules4 = next(c for c in RULES4_PROBES["load"](inputs, "cand", BARS) if c["id"] == ENDPOINT)
    assert 0 < rules4["sequential"]["look"]["more_blocks"] < more


def test_a_fixed_design_looks_once_with_the_t_quantile() -> None:
    design = DESIGN | {"repeats": 3}
    ref = [_case([100, 101, 99], [1.0] * 3)]
    ep = _checks(ref, [_case([100, 100.5, 99.5], [1.0] * 3)], design=design)[ENDPOINT]
    assert ep["sequential"]["design"]["looks"] == [3] and ep["sequential"]["design"]["c"] == pytest.approx(4.303)
    assert ep["outcome"] == "pass"


def test_the_sweep_is_the_mean_of_the_per_case_log_ratios_and_an_operating_point_is_one_case() -> None:
    ref = [_case([100] * 4, [1.0] * 4, agents=1), _case([400] * 4, [1.0] * 4, agents=8)]
    cand = [_case([100 * math.exp(x) for x in _noise(4, 0.005)], [1.0] * 4, agents=1),
            _case([400 * 0.8 * math.exp(x) for x in _noise(4, 0.005, 5)], [1.0] * 4, agents=8)]
    sweep = _checks(ref, cand)[ENDPOINT]
    # mean of log(1/1) and log(1/0.8): a drop of 1 - sqrt(0.8)
    assert sweep["value"] == pytest.approx(1 - math.sqrt(0.8), abs=0.005) and sweep["outcome"] == "fail"
    one = _checks(ref, cand, design=DESIGN | {"endpoint": 1})[ENDPOINT]
    assert one["outcome"] == "pass" and one["metric"] == "throughput drop, agents=1"


def test_a_latency_endpoint_is_a_second_primary_with_the_fail_side_split() -> None:
    design = DESIGN | {"latency_endpoint": "itl_p99"}
    checks = _checks(REF8, [_case([100 * math.exp(x) for x in _noise(8, 0.01, 1)],
                                  [1.0 * math.exp(x) for x in _noise(8, 0.01, 4)])], design=design)
    itl = checks["load.endpoint.itl_p99_rise"]
    assert itl["outcome"] == "pass" and itl["gating"] and itl["metric"] == "ITL p99 rise, sweep mean of 1 case"
    assert itl["sequential"]["design"]["c_fail"] > itl["sequential"]["design"]["c"]


def test_client_limited_blocks_are_dropped_and_counted() -> None:
    quiet = {"client_stamps": "kernel", "client_cpu_share": 0.2, "client_loop_lag_mean_s": 0.001, "e2e_p50_s": 1.0}
    ref = _case([100 * math.exp(x) for x in _noise(8, 0.01)], [1.0] * 8, **quiet)
    cand = _case([100 * math.exp(x) for x in _noise(8, 0.01, 1)], [1.0] * 8, **quiet)
    cand["repeats"][1] |= {"client_cpu_share": 0.99}  # the client used a whole core
    ref["repeats"][2] |= {"client_loop_lag_mean_s": 0.02}  # the reference's turns 1.9% later: over a quarter of 5%
    cand["repeats"][3] |= {"client_loop_lag_mean_s": 0.008}  # 0.7% later: noise the paired t carries
    for side in (ref, cand):  # both sides 2.4% late: the box was busy for both, the ratio is not moved
        side["repeats"][4] |= {"client_loop_lag_mean_s": 0.024}
    ep = _checks([ref], [cand])[ENDPOINT]
    assert ep["sequential"]["dropped_client_limited"] == 2 and ep["sequential"]["blocks"] == 6
    assert "2 client-limited blocks dropped" in ep["text"]
    assert ep["client_limited_reason"] == "cand block 2 at shape=default agents=4: the client used a whole core"
    ref["repeats"][1]["client_cpu_share"] = cand["repeats"][1]["client_cpu_share"] = 0.2
    ep = _checks([ref], [cand])[ENDPOINT]
    assert ep["client_limited_reason"] == (
        "ref block 3 at shape=default agents=4: the client sent its turns 1.9% of a request's median span later than "
        "the other's (ref 20.00 ms, cand 1.00 ms late on average, over the span both share), over a quarter of the 5% "
        "throughput bar")


def test_the_same_lateness_on_a_faster_server_drops_nothing() -> None:
    """rules/6 reads both sides' loop lag over the span they share: a client 30 ms late on both sides, with the
    candidate's requests half as long, moves nothing. rules/5 read each lag over its own server's span (3% and
    6%), dropped the block, and so chose blocks by their own ratio (benchmarks/client_limited_selection.py)."""
    from kvprobe.verdict.sealed.rules5 import speed as rules5

    busy = {"client_stamps": "kernel", "client_cpu_share": 0.5, "client_loop_lag_mean_s": 0.03}
    ref = _case([100 * math.exp(x) for x in _noise(8, 0.01)], [1.0] * 8, **busy, e2e_p50_s=1.0)
    cand = _case([200 * math.exp(x) for x in _noise(8, 0.01, 1)], [1.0] * 8, **busy, e2e_p50_s=0.5)
    ep = _checks([ref], [cand])[ENDPOINT]
    assert ep["sequential"]["dropped_client_limited"] == 0 and ep["sequential"]["blocks"] == 8
    old = rules5.Blocks(rules5.runs_by_case([ref]), rules5.runs_by_case([cand]), BARS, ("ref", "cand"))
    assert len(old.limited_throughput) == 8  # every block, under rules/5


def test_guardrails_never_hold_adopt_back_but_a_failed_one_rejects() -> None:
    noisy_case = _case([100 * math.exp(x) for x in _noise(8, 0.01, 1)], [1.0 * math.exp(x) for x in _noise(8, 0.3)])
    inputs = _inputs(REF8, [noisy_case])
    inputs |= {"bars": BARS.model_dump(), "servers": {"ref": {"role": "reference"}, "cand": {}},
               "probes": inputs["probes"] | {"capacity": {"servers": {"ref": {"kv_cache_tokens": 100},
                                                                        "cand": {"kv_cache_tokens": 200}}}},
               "probes_status": {"load": "ran", "capacity": "ran"}}
    checks = {c["id"]: c for c in judge(inputs, "cand", BARS) if c["probe"] == "load"}
    assert checks[ENDPOINT]["outcome"] == "pass"
    assert checks["load.shape=default.agents=4.ttft_p99_rise"]["outcome"] == "inconclusive"
    only_load = {k: v for k, v in inputs["probes"].items() if k in ("load", "capacity")}
    got = decide(inputs | {"probes": only_load})["decisions"]["cand"]
    assert not [c for c in got["checks"] if c["outcome"] == "inconclusive" and c.get("gating", True)
                and c["probe"] == "load"]


def test_advisory_speed_is_reported_but_never_decides() -> None:
    slow_case = _case([60 * math.exp(x) for x in _noise(8, 0.01, 2)], [2.0] * 8)
    inputs = _inputs(REF8, [slow_case], design=DESIGN | {"advisory": True})
    inputs |= {"bars": BARS.model_dump(), "servers": {"ref": {"role": "reference"}, "cand": {}},
               "probes": inputs["probes"] | {"capacity": {"servers": {"ref": {"kv_cache_tokens": 100},
                                                                        "cand": {"kv_cache_tokens": 200}}}},
               "probes_status": {"load": "ran", "capacity": "ran"}}
    got = decide(inputs)["decisions"]["cand"]
    load = [c for c in got["checks"] if c["probe"] == "load"]
    assert load[0]["outcome"] == "fail" and load[0]["advisory"] and "advisory" in load[0]["text"]
    assert got["decision"] != "reject"  # the other probes were not run: inconclusive, never rejected on speed
    assert not any("throughput" in r for r in got["reasons"] if r.startswith("fails"))


def test_the_lateness_left_in_a_block_is_taken_out_of_its_throughput_ratio() -> None:
    """One loop lag on both sides (20 ms) reads as 2.0% of the reference's 1 s requests and 1.8% of the slower
    candidate's 1.105 s: that lightened the reference more, so the observed ratio understates how much slower
    the candidate is by log(1.0200 / 1.0181). rules/6 takes that out of each block (and says so when it is a
    tenth of a percent or more); a side without the figures, or a whole core, moves nothing."""
    from kvprobe.stats.client_limit import lateness_move

    busy = {"client_stamps": "kernel", "client_cpu_share": 0.5, "client_loop_lag_mean_s": 0.02}
    ref = _case([100.0] * 8, [1.0] * 8, **busy, e2e_p50_s=1.0)
    observed = [0.10 + x for x in _noise(8, 0.01)]
    cand = _case([100 / math.exp(x) for x in observed], [1.0] * 8, **busy, e2e_p50_s=math.exp(0.10))
    move = math.log1p(0.02 / math.exp(0.10)) - math.log1p(0.02)
    assert lateness_move(ref["repeats"][0], cand["repeats"][0]) == pytest.approx(move) and move < 0
    blocks = Blocks(runs_by_case([ref]), runs_by_case([cand]), BARS, ("ref", "cand"))
    losses, used, dropped = blocks.losses([case_key(ref)], "output_tokens_per_s", drop=True)
    assert dropped == 0 and used == list(range(8))
    assert losses == pytest.approx([x - move for x in observed])
    ep = _checks([ref], [cand])[ENDPOINT]
    assert ep["sequential"]["lateness_correction"] == pytest.approx(move, abs=1e-6)
    assert "the client's lateness could have made the candidate look 0.19% faster on average" in ep["text"]
    assert lateness_move(ref["repeats"][0], {"client_loop_lag_mean_s": 0.02}) == 0.0
    assert lateness_move(ref["repeats"][0], cand["repeats"][0] | {"client_cpu_share": 0.95}) == 0.0


def test_an_open_loop_case_and_unreadable_lags_are_not_corrected() -> None:
    """Open loop the arrivals keep their schedule whatever the client's lag, so nothing is taken out; a lag that
    is no finite number, or negative, moves nothing and drops nothing."""
    from kvprobe.stats.client_limit import lateness_move, paired_lateness

    busy = {"client_stamps": "kernel", "client_cpu_share": 0.5, "client_loop_lag_mean_s": 0.02}
    ref = _case([100.0] * 8, [1.0] * 8, **busy, e2e_p50_s=1.0) | {"mode": "open", "rate": 2.0}
    observed = [0.10 + x for x in _noise(8, 0.01)]
    cand = _case([100 / math.exp(x) for x in observed], [1.0] * 8, **busy, e2e_p50_s=math.exp(0.10)) \
        | {"mode": "open", "rate": 2.0}
    ep = _checks([ref], [cand])[ENDPOINT]
    assert ep["sequential"]["lateness_correction"] == 0.0 and "lateness could have" not in ep["text"]
    blocks = Blocks(runs_by_case([ref]), runs_by_case([cand]), BARS, ("ref", "cand"), {case_key(ref)})
    assert blocks.losses([case_key(ref)], "output_tokens_per_s", drop=True)[0] == pytest.approx(observed)
    run = ref["repeats"][0]
    for bad in (math.nan, math.inf, -0.01):
        assert lateness_move(run, run | {"client_loop_lag_mean_s": bad}) == 0.0
        assert paired_lateness(run, run | {"client_loop_lag_mean_s": bad}) is None
