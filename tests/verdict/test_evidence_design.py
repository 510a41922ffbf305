"""The speed design a load.json records reaches the checks whole: under rules/5 a declared design's statistic is the
robust one, and a verdict that dropped it judged the blocks with rules/4's t and its look at 4 blocks (found in
tests/integration/test_speed_decision.py: the probe stopped at 4 blocks while its own looks began at 8)."""

from __future__ import annotations

from kvprobe.stats import sequential
from kvprobe.verdict.evidence import read_load

DESIGN = {"advisory": False, "budget_s": None, "endpoint": "sweep", "latency_endpoint": None, "look_every": 4,
          "max_blocks": 20, "repeats": None}


def test_a_robust_plan_keeps_its_statistic_and_its_looks() -> None:
    plan = sequential.of_settings({**DESIGN, "plan": {"statistic": sequential.ROBUST}})
    recorded = {"servers": {}, "design": {**DESIGN, "plan": plan.as_dict()}}
    design = read_load(recorded)["design"]
    judged = sequential.of_settings(design)
    assert judged.statistic == sequential.ROBUST
    assert judged.looks == plan.looks and judged.looks[0] == sequential.ROBUST_MIN_LOOK
    assert judged.c == plan.c


def test_a_rules4_plan_reads_as_it_always_did() -> None:
    plan = sequential.of_settings(dict(DESIGN))  # a recorded dict without a statistic: rules/4's t
    assert plan.statistic == sequential.T and plan.looks[0] == 4
    design = read_load({"servers": {}, "design": {**DESIGN, "plan": plan.as_dict()}})["design"]
    assert "plan" not in design  # the evidence of a rules/4 run is byte for byte what it was
    assert sequential.of_settings(design) == plan
