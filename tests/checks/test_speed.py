"""Speed checks (kvprobe.checks.speed): Welch on log values per case, named by metric and percentile."""

from __future__ import annotations

import pytest

from kvprobe.checks import judge, judge_probe
from kvprobe.config import Bars


def _case(tps: list[float], p99: list[float], agents: int = 4) -> dict:
    return {"agents": agents, "shape": "default",
            "repeats": [{"repeat": i, "output_tokens_per_s": t, "ttft_p99_s": p, "itl_p99_s": p, "e2e_p99_s": p}
                        for i, (t, p) in enumerate(zip(tps, p99, strict=True))]}


def _checks(ref: dict, cand: dict, judge_all: bool = False) -> dict[str, dict]:
    inputs = {"reference": "ref", "probes": {"load": {"servers": {"ref": {"cases": [ref]}, "cand": {"cases": [cand]}}}},
              "probes_status": {"load": "ran"}}
    bars = Bars(throughput_drop_max=0.05, p99_latency_rise_max=0.10)
    got = judge(inputs, "cand", bars) if judge_all else judge_probe("load", inputs, "cand", bars)
    return {c["metric"]: c for c in got if c["probe"] == "load"}


REF = _case([100, 102, 98, 101], [1.0, 1.02, 0.98, 1.0])


def test_speed_bars_fail_only_when_the_interval_clears_them() -> None:
    slow = _checks(REF, _case([60, 61, 59, 60], [2.0, 2.1, 1.9, 2.0]))
    tp = slow["throughput drop"]
    assert tp["outcome"] == "fail" and tp["value"] == pytest.approx(0.4, abs=0.01)
    ttft = slow["TTFT p99 rise"]
    assert ttft["outcome"] == "fail" and ttft["ratio"] == pytest.approx(2.0, abs=0.01)
    same = _checks(REF, _case([101, 99, 100, 100], [1.0, 1.01, 0.99, 1.0]))
    assert same["throughput drop"]["outcome"] == "pass" and same["E2E p99 rise"]["outcome"] == "pass"
    noisy = _checks(REF, _case([70, 130, 95, 75], [1.3, 0.7, 1.2, 0.9]))
    assert noisy["throughput drop"]["outcome"] == "inconclusive"
    lo, hi = noisy["throughput drop"]["interval"]
    assert lo < 0.05 < hi
    single = _checks(_case([100], [1.0]), _case([50], [2.0]))
    assert single["throughput drop"]["outcome"] == "inconclusive" and single["throughput drop"]["interval"] is None


def test_rows_are_named_by_metric_and_percentile_with_stable_ids() -> None:
    checks = _checks(REF, _case([101, 99, 100, 100], [1.0, 1.01, 0.99, 1.0]))
    assert set(checks) == {"throughput drop", "TTFT p99 rise", "ITL p99 rise", "E2E p99 rise"}
    assert checks["ITL p99 rise"]["id"] == "load.shape=default.agents=4.itl_p99_rise"


def test_power_is_on_the_log_scale_and_speaks_in_loss_units() -> None:
    noisy = _checks(REF, _case([70, 130, 95, 75], [1.3, 0.7, 1.2, 0.9]), judge_all=True)["throughput drop"]
    block = noisy["power"]
    assert block["scale"] == "log ratio" and block["unit"] == "runs" and block["n"] == 4
    assert block["passes_at_most"] < 0.05 < block["fails_at_least"]  # a drop, back in loss units
    assert block["needed"] > 4 and "to settle it: about" in noisy["text"]
