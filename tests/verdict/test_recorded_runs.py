"""Real runs judged under the current rules (tests/recorded.py rebuilds each probe summary from the run's
own events): an Intel Xeon with AMX where int8_per_token_head writes garbage (all 20 needle answers and 34
of 40 QA answers ran to the 1024-token cap), an AMD EPYC with AVX2 only where bfloat16 KV on float32
weights misses most needles and runs 13 of 40 to the cap (a rules/3 run), and real vLLM on an NVIDIA H200
where int8_per_token_head holds quality; and the same Xeon under rules/6, where int8_per_token_head's engine died
mid-probe (HTTP 500) and fp8 was adopted. Each test asserts what the evidence must make the verdict say,
never a number one machine made."""

from __future__ import annotations

import gzip

import orjson
import pytest
from recorded import RUNS, rejudge

from kvprobe.errors import EXIT_BROKEN
from kvprobe.verdict.build import RULES, SCHEMA, rederive, verdict_bytes


def _checks(verdict: dict, cand: str) -> dict[str, dict]:
    return {c["id"]: c for c in verdict["decisions"][cand]["checks"]}


@pytest.fixture(scope="module")
def xeon(tmp_path_factory) -> dict:
    return rejudge("xeon-amx-demo", tmp_path_factory.mktemp("xeon"))[1]


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> dict:
    return rejudge("h200-gpu", tmp_path_factory.mktemp("h200"))[1]


def test_a_candidate_that_answers_nothing_within_the_cap_is_rejected_on_needles_and_tasks(xeon: dict) -> None:
    """rules/2 let this candidate escape both bars (needle: not_measured; tasks: 6 documents left)."""
    d = xeon["decisions"]["int8_per_token_head"]
    assert d["decision"] == "reject"
    checks = _checks(xeon, "int8_per_token_head")
    for check_id in ("needle.recall_drop", "needle.truncation_rise", "tasks.kvprobe_qa.drop",
                     "tasks.kvprobe_qa.truncation_rise", "perplexity.delta"):
        assert checks[check_id]["outcome"] == "fail", checks[check_id]["text"]
    # the reasons say it in words: the cap, and what the reference did within it
    reasons = " ".join(d["reasons"])
    assert "int8_per_token_head: 20 of 20 needle answers ran past the 1024-token cap; the reference answered 20 " \
           "of them within it" in reasons
    assert "34 of 40 kvprobe_qa answers ran past the 1024-token cap" in reasons
    # every planned needle is scored: none is dropped from the comparison for being cut
    assert checks["needle.recall_drop"]["scored"] == checks["needle.recall_drop"]["pairs"] == 20


def test_fp8s_binary_intervals_are_not_degenerate(xeon: dict) -> None:
    checks = _checks(xeon, "fp8")
    for check_id in ("needle.recall_drop", "tasks.kvprobe_qa.drop"):
        lo, hi = checks[check_id]["interval"]
        assert hi > 0.05 and lo < 0, checks[check_id]["text"]  # rules/2 printed an upper end of exactly 0.00
    # its recorded bars were 0.0 (needles) and 0.02 (tasks): 20 needles and 39 documents cannot show them
    assert checks["needle.recall_drop"]["outcome"] == "inconclusive"
    assert checks["tasks.kvprobe_qa.drop"]["outcome"] == "inconclusive"
    assert xeon["decisions"]["fp8"]["decision"] == "inconclusive"


def test_the_cpu_builds_reference_is_said_to_be_deterministic(xeon: dict) -> None:
    check = _checks(xeon, "fp8")["perplexity.delta"]
    assert check["noise"]["deterministic"] is True
    assert "reference deterministic: 16/16 passages bit-identical over 2 runs" in check["text"]
    assert "+0.00%" not in check["text"]


def test_the_gpus_run_to_run_noise_is_measured_and_in_the_interval(h200: dict) -> None:
    check = _checks(h200, "fp8")["perplexity.delta"]
    noise = check["noise"]
    assert noise["deterministic"] is False and 0 < noise["rms"] < 0.001 and noise["identical"] < 16
    assert "reference run-to-run" in check["text"] and check["outcome"] == "pass"  # far under a third of 1%


def test_on_the_gpu_int8_per_token_head_holds_quality(h200: dict) -> None:
    checks = _checks(h200, "int8_per_token_head")
    assert checks["perplexity.delta"]["outcome"] == "pass"
    assert checks["needle.truncation_rise"]["outcome"] != "fail"
    assert checks["needle.recall_drop"]["outcome"] != "fail" and checks["tasks.kvprobe_qa.drop"]["outcome"] != "fail"
    assert h200["decisions"]["int8_per_token_head"]["decision"] != "reject"


def test_the_h200s_undecided_speed_is_told_its_design_cannot_settle_it(h200: dict) -> None:
    """Judged with the estimate as the truth, fp8's 3 blocks at ratio 0.95 asked for some 24,000 more blocks; past
    ten times the design's blocks the words say what would help instead."""
    endpoint = _checks(h200, "fp8")["load.endpoint.throughput_drop"]
    assert endpoint["sequential"]["look"]["more_blocks"] > 10 * 3
    assert "this design cannot settle it: lengthen the budget or quiet the servers" in endpoint["text"]
    assert "more blocks would settle it" not in endpoint["text"]


def test_recorded_repeats_are_a_fixed_design_and_client_limited_blocks_are_dropped(xeon: dict) -> None:
    """Written before the sequential design: its 3 repeats ran every server back to back, which is a fixed
    design of 3 blocks; on this shared 2-core box the client sent some turns late by over a quarter of the
    bar of a request's span, so those blocks do not count, and the endpoint says so."""
    endpoint = _checks(xeon, "fp8")["load.endpoint.throughput_drop"]
    assert endpoint["sequential"]["design"]["looks"] == [3]
    dropped = endpoint["sequential"]["dropped_client_limited"]
    assert endpoint["outcome"] == "inconclusive" and dropped >= 1
    assert f"{dropped} client-limited block{'s' if dropped > 1 else ''} dropped" in endpoint["text"]
    guards = [c for c in xeon["decisions"]["fp8"]["checks"] if c["probe"] == "load" and not c.get("gating", True)]
    assert {c["metric"] for c in guards} == {"throughput drop", "TTFT p99 rise", "ITL p99 rise", "E2E p99 rise"}
    assert all(c["outcome"] != "fail" for c in guards)


def test_the_amd_avx2_demo_verdict_rederives_as_recorded_and_again_from_its_events(tmp_path) -> None:
    recorded = orjson.loads((RUNS / "amd-avx2-demo" / "verdict.json").read_bytes())
    assert recorded["rules"] == "kvprobe.rules/3" and rederive(recorded) == []
    _, again = rejudge("amd-avx2-demo", tmp_path)  # under the current rules: speed changed, quality did not
    assert again["decisions"]["bfloat16"]["decision"] == recorded["decisions"]["bfloat16"]["decision"] == "reject"
    assert again["exit_code"] == recorded["exit_code"] == 1
    quality = {c["id"]: c["outcome"] for c in recorded["decisions"]["bfloat16"]["checks"] if c["probe"] != "load"}
    assert {c["id"]: c["outcome"] for c in again["decisions"]["bfloat16"]["checks"] if c["probe"] != "load"} == quality


def test_on_amd_avx2_the_wrecking_2x_is_rejected_naming_misses_and_answers_cut(tmp_path) -> None:
    verdict = orjson.loads((RUNS / "amd-avx2-demo" / "verdict.json").read_bytes())
    d = verdict["decisions"]["bfloat16"]
    assert d["decision"] == "reject" and verdict["run"]["left_out"][0]["name"] == "fp8"
    checks = _checks(verdict, "bfloat16")
    for check_id in ("perplexity.delta", "needle.recall_drop", "needle.truncation_rise", "tasks.kvprobe_qa.drop"):
        assert checks[check_id]["outcome"] == "fail", checks[check_id]["text"]
    assert "bfloat16 ran past the 1024-token cap on" in " ".join(d["reasons"])
    # it answers the short QA documents within the cap, wrongly: only the needles' long prompts make it ramble
    assert checks["tasks.kvprobe_qa.truncation_rise"]["outcome"] == "pass"


@pytest.mark.parametrize("name", ["xeon-amx-demo", "h200-gpu", "h200-gpu-hybrid-kv", "h200-gpu-hybrid-ssm"])
def test_the_rejudged_verdict_rederives(name: str, tmp_path) -> None:
    _, verdict = rejudge(name, tmp_path)
    assert verdict["rules"] == RULES and verdict["schema"] == SCHEMA
    assert rederive(orjson.loads(verdict_bytes(verdict))) == []


# The model 167 demo under rules/6 (tests/fixtures/runs/xeon-amx-rules6): int8_per_token_head's engine died in the
# needle probe (a real HTTP 500 from vLLM's EngineCore, after perplexity and agreement had measured it), and fp8
# was adopted at a look with client-limited blocks dropped on the shared 2-core box.
XEON6 = "xeon-amx-rules6"


@pytest.fixture(scope="module")
def xeon6() -> dict:
    return orjson.loads((RUNS / XEON6 / "verdict.json").read_bytes())


def test_an_engine_that_dies_mid_probe_is_broken_and_its_failed_quality_is_named(xeon6: dict) -> None:
    with gzip.open(RUNS / XEON6 / "events.jsonl.gz") as f:
        events = [orjson.loads(line) for line in f]
    died = [e for e in events if e["kind"] == "needle_case" and e["status"] == "error"]
    assert died and died[0]["http_status"] == 500 and "EngineCore" in died[0]["error"]  # the real capture
    assert "EngineCore" in xeon6["broken"]["int8_per_token_head"]
    d = xeon6["decisions"]["int8_per_token_head"]
    assert d["decision"] == "broken" and xeon6["exit_code"] == EXIT_BROKEN
    assert d["reasons"][0].startswith("int8_per_token_head failed during a probe: ")
    checks = _checks(xeon6, "int8_per_token_head")
    failed = [c for c in checks.values() if c["outcome"] == "fail"]
    assert {c["id"] for c in failed} >= {"perplexity.delta", "needle.recall_drop"}
    for c in failed:  # what it had measured before it died is not lost: each failed bar is in the reasons
        assert f"also fails {c['bar']}: {c['text']}" in d["reasons"]
    # nothing was measured after the death, and nothing is called measured
    assert checks["tasks.kvprobe_qa.drop"]["outcome"] == checks["load.endpoint.throughput_drop"]["outcome"] \
        == "not_measured"
    assert xeon6["recommendation"]["server"] == "fp8"  # the other candidate is judged on its own evidence


def test_rules6_drops_the_client_limited_blocks_and_still_decides(xeon6: dict) -> None:
    endpoint = _checks(xeon6, "fp8")["load.endpoint.throughput_drop"]
    seq = endpoint["sequential"]
    assert xeon6["rules"] == "kvprobe.rules/6" and endpoint["outcome"] == "pass"
    assert seq["dropped_client_limited"] >= 1 and seq["look"]["at_look"] and seq["look"]["n"] in seq["design"]["looks"]
    # the drop read both sides' client lag over the span both share (rules/6), and says so
    assert "the client sent its turns" in endpoint["client_limited_reason"]
    assert "over the span both share" in endpoint["client_limited_reason"]
    assert "lateness_correction" in seq
    lo, hi = endpoint["ratio_interval"]
    assert lo > 1 - endpoint["limit"] and lo < 1 < hi  # a pass is an interval inside the bar


def test_the_rules6_run_rebuilt_from_its_events_reaches_the_recorded_decisions(xeon6: dict, tmp_path) -> None:
    """Each quality summary is rebuilt from the events log (the load summary is the recorded one): every
    decision and every check's outcome, value and interval come out as recorded."""
    _, again = rejudge(XEON6, tmp_path)
    assert again["rules"] == xeon6["rules"]

    def judged(v: dict) -> dict:
        return {(name, c["id"]): (c["outcome"], c.get("value"), c.get("interval"))
                for name, d in v["decisions"].items() for c in d.get("checks", [])}

    assert {n: d["decision"] for n, d in again["decisions"].items()} == \
        {n: d["decision"] for n, d in xeon6["decisions"].items()}
    assert judged(again) == judged(xeon6)
    assert again["exit_code"] == xeon6["exit_code"] and again["broken"] == xeon6["broken"]


# The shipped bars and design on an H100 under rules/6 (tests/fixtures/runs/h100-rules6): the reference, its A/A
# twin and fp8, in a 900 s budget (31 blocks planned by the pilot).
H100_6 = "h100-rules6"


@pytest.fixture(scope="module")
def h100_6() -> dict:
    return orjson.loads((RUNS / H100_6 / "verdict.json").read_bytes())


def test_on_the_gpu_the_twin_passes_speed_and_frees_nothing(h100_6: dict) -> None:
    """An A/A twin is equal by construction: its speed passes (at the design's final look here), its capacity is
    1.00x, so it is no_gain; on a 16-core host no block is the client's."""
    endpoint = _checks(h100_6, "twin")["load.endpoint.throughput_drop"]
    assert endpoint["outcome"] == "pass" and h100_6["decisions"]["twin"]["decision"] == "no_gain"
    lo, hi = endpoint["ratio_interval"]
    assert 1 - endpoint["limit"] < lo < 1 < hi
    seq = endpoint["sequential"]
    assert seq["look"]["at_look"] and seq["dropped_client_limited"] == 0
    assert abs(seq["lateness_correction"]) < 0.001 and "lateness" not in endpoint["text"]  # said from 0.1%


def test_a_candidate_on_the_bar_is_inconclusive_and_told_the_design_cannot_settle_it(h100_6: dict) -> None:
    """fp8's interval holds the bar (a 5% drop) after every planned block: no look can pass or fail it, and the
    words say what would help instead of a count of thousands of blocks."""
    endpoint = _checks(h100_6, "fp8")["load.endpoint.throughput_drop"]
    lo, hi = endpoint["ratio_interval"]
    assert lo < 1 - endpoint["limit"] < hi  # the bar inside the interval
    look = endpoint["sequential"]["look"]
    assert endpoint["outcome"] == "inconclusive" and look["n"] == endpoint["sequential"]["design"]["looks"][-1]
    assert look["more_blocks"] > 10 * look["n"]
    assert "this design cannot settle it: lengthen the budget or quiet the servers" in endpoint["text"]
    assert h100_6["decisions"]["fp8"]["decision"] == "inconclusive"
    assert h100_6["recommendation"]["server"] == "auto" and not h100_6["recommendation"]["change"]


# Every default probe and the QA task at the shipped sizes and bars, on an H100 under rules/6
# (tests/fixtures/runs/h100-full-rules6): the reference, its A/A twin and fp8, in a 720 s load budget.
H100_FULL = "h100-full-rules6"
QUALITY = ("perplexity.delta", "needle.recall_drop", "needle.truncation_rise", "tasks.kvprobe_qa.drop",
           "tasks.kvprobe_qa.truncation_rise")


@pytest.fixture(scope="module")
def h100_full() -> dict:
    return orjson.loads((RUNS / H100_FULL / "verdict.json").read_bytes())


def test_at_the_shipped_sizes_an_equal_twin_and_fp8_pass_every_quality_bar_on_the_gpu(h100_full: dict) -> None:
    """The sizes planned for power (17 passages, 180 needles, 180 QA documents) pass every quality bar of a
    candidate equal to the reference by construction, and of fp8, which holds quality on this card; so each
    one's decision is its capacity's and its speed's alone."""
    for cand in ("twin", "fp8"):
        checks = _checks(h100_full, cand)
        for check_id in QUALITY:
            assert checks[check_id]["outcome"] == "pass", checks[check_id]["text"]
        assert checks["needle.recall_drop"]["pairs"] == 180
        assert checks["perplexity.delta"]["power"]["n"] == 17
        reasons = h100_full["decisions"][cand]["reasons"]
        assert not any(r.startswith("not shown to pass: ") and "throughput" not in r for r in reasons), reasons
    # the twin: speed passes at a planned look before the last, capacity 1.00x: no_gain
    twin = _checks(h100_full, "twin")["load.endpoint.throughput_drop"]
    seq = twin["sequential"]
    assert twin["outcome"] == "pass" and seq["look"]["n"] in seq["design"]["looks"][:-1]
    assert h100_full["decisions"]["twin"]["decision"] == "no_gain"
    # fp8: 2.00x, every quality bar passed, speed the one thing not shown: inconclusive, with what would settle it
    fp8 = _checks(h100_full, "fp8")["load.endpoint.throughput_drop"]
    lo, hi = fp8["ratio_interval"]
    assert fp8["outcome"] == "inconclusive" and lo < 1 - fp8["limit"] < hi
    assert fp8["sequential"]["look"]["n"] == fp8["sequential"]["design"]["looks"][-1]
    d = h100_full["decisions"]["fp8"]
    assert d["decision"] == "inconclusive" and d["reasons"][0].startswith("not shown to pass: throughput drop")
    assert [r for r in d["reasons"] if r.startswith("not shown to pass: ")] == [d["reasons"][0]]
    assert not h100_full["recommendation"]["change"]


def test_the_full_gpu_run_rebuilt_from_its_events_reaches_the_recorded_decisions(h100_full: dict, tmp_path) -> None:
    _, again = rejudge(H100_FULL, tmp_path)

    def judged(v: dict) -> dict:
        return {(name, c["id"]): (c["outcome"], c.get("value"), c.get("interval"))
                for name, d in v["decisions"].items() for c in d.get("checks", [])}

    assert {n: d["decision"] for n, d in again["decisions"].items()} == \
        {n: d["decision"] for n, d in h100_full["decisions"].items()}
    assert judged(again) == judged(h100_full) and again["exit_code"] == h100_full["exit_code"] == 1


# The AVX2 demo under rules/6 (tests/fixtures/runs/amd-avx2-rules6): the reference's engine stopped in the needle
# probe, its worker starved of CPU on core 0 (vLLM's executor gave up after 300 s, then a real HTTP 500 from
# EngineCore on every request), after bfloat16 KV on float32 weights had failed perplexity and was failing the
# needles.
AVX2_6 = "amd-avx2-rules6"


def test_a_reference_that_dies_mid_run_stops_the_run_and_the_failed_candidate_is_still_rejected(tmp_path) -> None:
    verdict = orjson.loads((RUNS / AVX2_6 / "verdict.json").read_bytes())
    with gzip.open(RUNS / AVX2_6 / "events.jsonl.gz") as f:
        events = [orjson.loads(line) for line in f]
    died = [e for e in events if e["kind"] == "needle_case" and e["server"] == "auto" and e["status"] == "error"]
    assert died and died[0]["http_status"] == 500 and "EngineCore" in died[0]["error"]  # the real capture
    (broke,) = [e for e in events if e["kind"] == "broken"]
    assert broke["server"] == "auto" and verdict["broken"] == {"auto": broke["error"]}
    # only the candidate's requests already in flight (the needle probe's concurrency, 2) finished after it
    after = [e for e in events if e["kind"] == "needle_case" and e["server"] == "bfloat16" and e["t"] > broke["t"]]
    assert len(after) <= 2
    (stopped,) = [e for e in events if e["kind"] == "probes_not_run"]
    assert stopped["probes"] == ["tasks", "load"] and stopped["why"] == "the reference auto broke"
    assert not [e for e in events if e["kind"] in ("tasks_sample", "load_case", "load_request")]

    d = verdict["decisions"]["bfloat16"]
    assert d["decision"] == "reject" and verdict["exit_code"] == EXIT_BROKEN
    checks = _checks(verdict, "bfloat16")
    # what was measured before the reference broke still decides, each failure named
    assert checks["perplexity.delta"]["outcome"] == checks["needle.recall_drop"]["outcome"] == "fail"
    for bar in ("perplexity_delta_max", "needle_recall_drop_max"):
        assert any(r.startswith(f"fails {bar}: ") for r in d["reasons"])
    assert checks["needle.recall_drop"]["pairs"] < 180  # the pairs both answered before the death, no more
    assert checks["tasks.accuracy_drop"]["outcome"] == checks["load.endpoint.throughput_drop"]["outcome"] \
        == "not_measured"
    assert any(r.startswith("the reference auto is broken") for r in d["reasons"])
    assert verdict["probes_status"]["tasks"] == verdict["probes_status"]["load"] == "requested, no results"

    _, again = rejudge(AVX2_6, tmp_path)  # each quality summary rebuilt from the events reaches the same verdict
    assert {n: x["decision"] for n, x in again["decisions"].items()} == {"bfloat16": "reject"}
    assert {c["id"]: c["outcome"] for c in again["decisions"]["bfloat16"]["checks"]} == \
        {i: c["outcome"] for i, c in checks.items()}
    assert again["exit_code"] == verdict["exit_code"] and again["broken"] == verdict["broken"]
