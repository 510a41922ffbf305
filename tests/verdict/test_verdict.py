"""Decision rules on hand-built measurement sets: one per decision, the boundaries, inconclusive."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from verdict_inputs import Measurements, agreement_rows, load_cases, needle_cases, perplexity_rows

from kvprobe.verdict.build import build_verdict, rederive, verdict_bytes


def verdict_of(m: Measurements, tmp_path: Path, name: str = "run") -> dict:
    return build_verdict(m.write(tmp_path / name))


def decision(v: dict, cand: str = "cand") -> str:
    return v["decisions"][cand]["decision"]


def outcomes(v: dict, bar: str, cand: str = "cand") -> list[str]:
    return [c["outcome"] for c in v["decisions"][cand]["checks"] if c["bar"] == bar]


def test_adopt_when_capacity_gains_and_every_bar_passes(tmp_path):
    v = verdict_of(Measurements(), tmp_path)
    d = v["decisions"]["cand"]
    assert d["decision"] == "adopt", d["reasons"]
    assert d["capacity_ratio"] == 2.0
    assert {c["outcome"] for c in d["checks"]} == {"pass"}
    assert v["recommendation"] == {"server": "cand", "change": True, "reason": v["recommendation"]["reason"]}
    assert "2.00x" in v["recommendation"]["reason"]
    assert v["exit_code"] == 0
    assert rederive(v) == []


def test_reject_on_perplexity_names_the_bar_and_by_how_much(tmp_path):
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.05, 0.005)
    v = verdict_of(m, tmp_path)
    assert decision(v) == "reject"
    reason = v["decisions"]["cand"]["reasons"][0]
    assert "perplexity_delta_max" in reason and "perplexity delta +5.13%" in reason and "by at least" in reason
    assert "over 16 passages" in reason and "reference deterministic: 16/16 passages bit-identical" in reason
    assert v["recommendation"]["server"] == "ref" and v["exit_code"] == 1


def test_reject_on_needle_collapse_with_paired_counts(tmp_path):
    m = Measurements()
    m.needle["cases"] = needle_cases("ref", 40) + needle_cases("cand", 2, truncated=5)
    m.needle["servers"]["cand"].update(hit=2, miss=33, truncated=5, recall=2 / 35)
    v = verdict_of(m, tmp_path)
    assert decision(v) == "reject"
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "needle_recall_drop_max")
    # the cap is a budget both sides get: the 5 answers cut where the reference answered are losses
    assert check["outcome"] == "fail" and check["value"] == pytest.approx(38 / 40)
    assert check["lost"] == 38 and check["gained"] == 0 and check["pairs"] == 40 and check["scored"] == 40
    assert "2/40 vs reference 40/40" in check["text"]
    assert "cand ran past the 1024-token cap on 5 needles the reference answered within it" in check["text"]
    cut = next(c for c in v["decisions"]["cand"]["checks"] if c["id"] == "needle.truncation_rise")
    assert cut["value"] == pytest.approx(5 / 40) and cut["candidate_cut"] == 5 and cut["reference_cut"] == 0


def endpoint(v: dict) -> dict:
    return next(c for c in v["decisions"]["cand"]["checks"] if c["id"] == "load.endpoint.throughput_drop")


def test_reject_on_throughput_only_when_the_interval_clears_the_bar(tmp_path):
    m = Measurements()
    m.load["servers"]["cand"]["cases"] = load_cases([60, 61, 59, 60], [1.0, 1.01, 0.99, 1.0])
    v = verdict_of(m, tmp_path)
    assert decision(v) == "reject"
    assert endpoint(v)["outcome"] == "fail"
    assert "fails throughput_drop_max: throughput drop, sweep mean of 1 case: ratio 0.600" in \
        v["decisions"]["cand"]["reasons"][0]


def test_speed_straddling_the_bar_is_inconclusive_not_a_pass(tmp_path):
    m = Measurements()
    # ±30% run-to-run noise: the mean is 5% slower but the interval spans both sides of the bar.
    m.load["servers"]["cand"]["cases"] = load_cases([70, 130, 80, 100], [1.0, 1.01, 0.99, 1.0])
    v = verdict_of(m, tmp_path)
    assert endpoint(v)["outcome"] == "inconclusive"
    assert decision(v) == "inconclusive" and v["exit_code"] == 1
    assert v["recommendation"]["server"] == "ref"


def test_one_run_per_load_case_gives_no_interval_and_no_pass(tmp_path):
    m = Measurements()
    m.load["servers"]["ref"]["cases"] = load_cases([100], [1.0])
    m.load["servers"]["cand"]["cases"] = load_cases([110], [0.9])
    v = verdict_of(m, tmp_path)
    assert set(outcomes(v, "throughput_drop_max")) == {"inconclusive", "not_measured"}  # endpoint, guardrail
    assert "1 paired block, no interval" in endpoint(v)["text"]


def test_a_p99_of_zero_leaves_its_block_out_of_that_figure(tmp_path):
    """A client that read whole responses at once records ITLs of 0: a ratio of 0 is not a rise of -100%."""
    m = Measurements()
    m.load["servers"]["cand"]["cases"] = load_cases([100, 101, 99, 100], [1.0, 1.01, 0.99, 1.0])
    m.load["servers"]["cand"]["cases"][1]["itl_p99_s"] = 0.0
    v = verdict_of(m, tmp_path)
    itl = next(c for c in v["decisions"]["cand"]["checks"] if c["metric"] == "ITL p99 rise")
    assert "over 3 paired blocks" in itl["text"] and itl["value"] > -0.5
    assert "over 4 paired blocks" in endpoint(v)["text"]  # throughput keeps all four


def test_no_gain_when_capacity_is_equal_says_the_ratio(tmp_path):
    m = Measurements()
    m.servers[1] = ("cand", "candidate", 100_000, "auto")
    v = verdict_of(m, tmp_path)
    assert decision(v) == "no_gain"
    assert "frees nothing" in v["decisions"]["cand"]["reasons"][0]
    assert "1.00x" in v["decisions"]["cand"]["reasons"][0]
    assert v["exit_code"] == 0 and v["recommendation"]["server"] == "ref"


def test_no_gain_carries_the_memory_maps_lever_beside_the_decision(tmp_path):
    m = Measurements()
    m.servers[1] = ("cand", "candidate", 100_000, "fp8")
    lever = "the Mamba SSM state dtype is the lever: float16 is predicted to give 1.86x"
    m.memmap = {"explain": {"cand": f"cand gives 1.00x the capacity of ref. {lever}"},
                "lever": {"sentence": lever}}
    v = verdict_of(m, tmp_path)
    assert decision(v) == "no_gain"
    first = v["decisions"]["cand"]["reasons"][0]
    assert first.startswith("frees nothing: capacity 1.00x") and first.endswith(f"Memory map: cand gives 1.00x "
                                                                                f"the capacity of ref. {lever}")
    assert v["probes"]["capacity"]["lever"] == lever  # in the signed inputs, so verify re-derives it


def test_invalid_names_the_declared_knob(tmp_path):
    m = Measurements()
    m.knob = "mamba_ssm_cache_dtype"
    m.pin_differences = {"cand": [{"field": "cache_config.cache_dtype", "values": {"ref": "auto", "cand": "fp8"},
                                   "text": "cache_config.cache_dtype: ref=auto cand=fp8"}]}
    v = verdict_of(m, tmp_path)
    assert v["decisions"]["cand"]["reasons"] == ["servers differ in more than the knob under test "
                                                 "(mamba_ssm_cache_dtype): cache_config.cache_dtype: ref=auto cand=fp8"]
    assert v["exit_code"] == 3


@pytest.mark.parametrize(("tokens", "expected"), [(105_000, "adopt"), (104_999, "no_gain")])
def test_capacity_gain_boundary_is_inclusive(tmp_path, tokens, expected):
    m = Measurements()
    m.servers[1] = ("cand", "candidate", tokens, "fp8")
    assert decision(verdict_of(m, tmp_path)) == expected


@pytest.mark.parametrize(("rise", "spread", "expected"), [
    (0.001, 0.0005, "pass"),
    (0.0095, 0.004, "inconclusive"),  # straddles the bar
    (0.03, 0.002, "fail"),
])
def test_perplexity_bar_outcomes(tmp_path, rise, spread, expected):
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(rise, spread)
    v = verdict_of(m, tmp_path)
    assert outcomes(v, "perplexity_delta_max") == [expected]
    assert decision(v) == {"pass": "adopt", "inconclusive": "inconclusive", "fail": "reject"}[expected]


def test_inconclusive_quality_blocks_adopt_and_says_why(tmp_path):
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.008, 0.01)
    v = verdict_of(m, tmp_path)
    d = v["decisions"]["cand"]
    assert d["decision"] == "inconclusive"
    assert any("perplexity delta" in r and "to settle it: " in r and "the estimate itself holds this one back" in r
               for r in d["reasons"])
    assert v["exit_code"] == 1


def test_a_zero_needle_bar_can_never_pass(tmp_path):
    m = Measurements()
    m.bars["needle_recall_drop_max"] = 0.0
    v = verdict_of(m, tmp_path, "none-lost")  # 40 of 40 on both: still not shown to lose nothing at all
    assert outcomes(v, "needle_recall_drop_max") == ["inconclusive"]
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "needle_recall_drop_max")
    assert "a bar of 0 can only fail or be inconclusive" in check["text"]
    m.needle["cases"] = needle_cases("ref", 40) + needle_cases("cand", 39)
    assert outcomes(verdict_of(m, tmp_path, "one-lost"), "needle_recall_drop_max") == ["inconclusive"]


def test_forty_matching_needles_pass_the_default_margin_but_not_twenty(tmp_path):
    m = Measurements()
    assert outcomes(verdict_of(m, tmp_path, "forty"), "needle_recall_drop_max") == ["pass"]
    m.needle["cases"] = needle_cases("ref", 20, n=20) + needle_cases("cand", 20, n=20)
    v = verdict_of(m, tmp_path, "twenty")
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "needle_recall_drop_max")
    # 20 of 20 on both sides: the score interval is [-0.16, +0.16], wider than the 0.10 margin
    assert check["outcome"] == "inconclusive" and check["interval"][1] == pytest.approx(0.161, abs=1e-3)


def test_invalid_names_every_differing_field(tmp_path):
    m = Measurements()
    m.pin_differences["cand"] = [
        {"field": "max_model_len", "values": {"ref": 8192, "cand": 4096}, "text": "max_model_len: ref=8192 cand=4096"},
        {"field": "version", "values": {"ref": "0.32.0", "cand": "0.31.0"}, "text": "version: ref=0.32.0 cand=0.31.0"}]
    v = verdict_of(m, tmp_path)
    assert decision(v) == "invalid"
    reasons = " ".join(v["decisions"]["cand"]["reasons"])
    assert "max_model_len: ref=8192 cand=4096" in reasons and "version: ref=0.32.0 cand=0.31.0" in reasons
    assert v["exit_code"] == 3


def test_broken_at_smoke_and_broken_during_a_probe(tmp_path):
    m = Measurements()
    m.servers.append(("dead", "candidate", 200_000, "int8"))
    m.status["dead"] = ("broken", "dead: first-prefill smoke (4096 tokens) failed: HTTP 500")
    m.broken_events.append(("cand", "cand: connection reset during load"))
    v = verdict_of(m, tmp_path)
    assert decision(v, "dead") == "broken" and "HTTP 500" in v["decisions"]["dead"]["reasons"][0]
    assert decision(v, "cand") == "broken" and "connection reset" in v["decisions"]["cand"]["reasons"][0]
    assert v["exit_code"] == 4


def test_a_candidate_that_fails_quality_then_crashes_is_broken_and_still_fails_the_bar(tmp_path):
    from kvprobe.report.tables import perplexity_table

    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.174, 0.02)
    m.load = None  # it died in the load probe, after perplexity
    m.broken_events.append(("cand", "cand: load: connection reset"))
    v = verdict_of(m, tmp_path)
    d = v["decisions"]["cand"]
    assert d["decision"] == "broken" and v["exit_code"] == 4
    assert d["reasons"][0] == "cand failed during a probe: cand: load: connection reset"
    assert outcomes(v, "perplexity_delta_max") == ["fail"]
    assert outcomes(v, "needle_recall_drop_max") == ["pass"]  # measured before the crash, and said
    assert any(r.startswith("also fails perplexity_delta_max: perplexity delta +19.01%") for r in d["reasons"])
    assert any(r.startswith("measured before it broke: needle recall 40/40") for r in d["reasons"])
    assert not any("not measured" in r for r in d["reasons"])  # the probe it never reached is in checks only
    assert {c["outcome"] for c in d["checks"] if c["probe"] == "load"} == {"not_measured"}
    row = next(r for r in perplexity_table(v).rows if r[0] == "cand")
    assert row[-1] == "fail"
    assert rederive(orjson.loads(verdict_bytes(v))) == []  # `kvprobe verify` agrees


def test_a_candidate_broken_at_the_smoke_has_only_its_failure_as_reason(tmp_path):
    m = Measurements()
    m.status["cand"] = ("broken", "cand: first-prefill smoke (4096 tokens) failed: HTTP 500")
    m.perplexity["servers"].pop("cand")
    m.needle["cases"] = needle_cases("ref", 40)
    m.needle["servers"].pop("cand")
    m.load["servers"].pop("cand")
    v = verdict_of(m, tmp_path)
    d = v["decisions"]["cand"]
    assert d["decision"] == "broken" and len(d["reasons"]) == 1 and "HTTP 500" in d["reasons"][0]
    assert {c["outcome"] for c in d["checks"]} == {"not_measured"}
    assert rederive(orjson.loads(verdict_bytes(v))) == []


def test_the_largest_adopted_capacity_wins_ties_go_to_config_order(tmp_path):
    m = Measurements()
    m.servers += [("big", "candidate", 400_000, "fp8"), ("big2", "candidate", 400_000, "fp8")]
    for name in ("big", "big2"):
        m.perplexity["servers"][name] = perplexity_rows(0.001)
        m.needle["cases"] += needle_cases(name, 40)
        m.load["servers"][name] = {"cases": load_cases([104, 105, 103, 104], [0.97, 0.98, 0.96, 0.97])}
    v = verdict_of(m, tmp_path)
    assert [decision(v, n) for n in ("cand", "big", "big2")] == ["adopt"] * 3
    assert v["recommendation"]["server"] == "big"


def test_probes_not_asked_for_hold_back_adopt_but_do_not_fail_the_run(tmp_path):
    m = Measurements()
    m.probes_requested = ["capacity"]
    v = verdict_of(m, tmp_path)
    assert v["probes_status"] == {"capacity": "ran", "perplexity": "not run", "agreement": "not run",
                                  "needle": "not run", "tasks": "not run", "load": "not run", "fill": "not run"}
    assert decision(v) == "inconclusive"
    assert set(outcomes(v, "perplexity_delta_max")) == {"not_measured"}
    assert v["exit_code"] == 0


def test_a_probe_asked_for_that_left_no_results_fails_the_run(tmp_path):
    m = Measurements()
    m.needle = None  # e.g. interrupted before it wrote needle.json
    v = verdict_of(m, tmp_path)
    assert v["probes_status"]["needle"] == "requested, no results"
    assert decision(v) == "inconclusive" and v["exit_code"] == 1


def test_optional_agreement_bars_apply_only_when_set(tmp_path):
    m = Measurements()
    m.agreement["cand"] = agreement_rows(0.98, 0.5)
    assert decision(verdict_of(m, tmp_path, "a")) == "adopt"
    m.bars["kl_mean_max"] = 0.1
    v = verdict_of(m, tmp_path, "b")
    assert decision(v) == "reject" and "mean KL divergence 0.4981" in v["decisions"]["cand"]["reasons"][0]
    assert "over 8 passages" in v["decisions"]["cand"]["reasons"][0]


def test_same_directory_same_bytes(tmp_path):
    run = Measurements().write(tmp_path / "run")
    assert verdict_bytes(build_verdict(run)) == verdict_bytes(build_verdict(run))


def test_rederive_catches_an_edited_number(tmp_path):
    v = verdict_of(Measurements(), tmp_path)
    edited = orjson.loads(verdict_bytes(v))
    edited["probes"]["perplexity"]["servers"]["cand"]["passage_ll"] = [
        x - 30.0 for x in edited["probes"]["perplexity"]["servers"]["cand"]["passage_ll"]]
    problems = rederive(edited)
    assert problems and "cand: recorded decision 'adopt', the numbers give 'reject'" in problems[0]


def test_rederive_catches_an_edited_decision(tmp_path):
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.05, 0.005)
    edited = orjson.loads(verdict_bytes(verdict_of(m, tmp_path)))
    edited["decisions"]["cand"]["decision"] = "adopt"
    assert any("recorded decision 'adopt', the numbers give 'reject'" in p for p in rederive(edited))


def test_load_cases_that_carry_their_repeats(tmp_path):
    """The load probe's shape: one entry per (shape, agents) with its runs under "repeats"."""
    def case(tps: list[float]) -> dict:
        runs = [{"repeat": i, "output_tokens_per_s": t, "ttft_p99_s": 0.5, "itl_p99_s": 0.05, "e2e_p99_s": 2.0,
                 "metrics": {"samples": 3}} for i, t in enumerate(tps)]
        return {"agents": 2, "shape": "short", "turns": 2, "mode": "closed", "rate": None, "requests": 8,
                "errors": 0, "output_tokens_per_s": sum(tps) / len(tps), "ttft_p99_s": 0.5, "repeats": runs}

    m = Measurements()
    m.load["servers"]["ref"]["cases"] = [case([100, 102, 98])]
    m.load["servers"]["cand"]["cases"] = [case([50, 51, 49])]
    m.load["design"] = {"repeats": 3}  # a fixed design: one look after 3 blocks
    v = verdict_of(m, tmp_path)
    check = endpoint(v)
    assert check["outcome"] == "fail" and check["ratio"] == pytest.approx(0.5, abs=0.001)
    assert "over 3 paired blocks" in check["text"]
    guard = next(c for c in v["decisions"]["cand"]["checks"] if c["id"] == "load.shape=short.agents=2.throughput_drop")
    assert guard["outcome"] == "fail" and guard["gating"] is False
    assert "metrics" not in v["probes"]["load"]["servers"]["ref"]["cases"][0]["repeats"][0]


def test_agreement_bars_use_a_t_interval_over_passages(tmp_path):
    m = Measurements()
    m.bars["top1_agreement_min"] = 0.95
    m.agreement["cand"] = agreement_rows(0.955, 0.002)
    v = verdict_of(m, tmp_path, "straddle")
    assert outcomes(v, "top1_agreement_min") == ["inconclusive"]
    m.agreement["cand"] = agreement_rows(0.5, 0.002)
    v = verdict_of(m, tmp_path, "low")
    assert outcomes(v, "top1_agreement_min") == ["fail"] and decision(v) == "reject"
    m.agreement["cand"] = agreement_rows(0.99, 0.002, n=4)  # 4 passages: a pass is not trusted
    v = verdict_of(m, tmp_path, "few")
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["bar"] == "top1_agreement_min")
    assert check["outcome"] == "inconclusive" and "4 passages: a pass needs at least 8" in check["text"]
