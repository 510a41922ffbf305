"""A probe file written under rules/2 (tests/fixtures/runs/h200-gpu: totals per server, none of the per-passage or
per-document figures rules/3 and later judge) judged under today's rules: each check says the probe ran under
rules/2 and which figures it lacks, never that it did not run or has no result."""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded import RUNS

from kvprobe.config import Bars
from kvprobe.verdict.checks import judge_probe
from kvprobe.verdict.evidence import READERS

RUN = RUNS / "h200-gpu"


def _inputs(probe: str) -> dict[str, Any]:
    data = json.loads((RUN / f"{probe}.json").read_text())
    return {"reference": "auto", "probes": {probe: READERS[probe](data)}, "probes_status": {probe: "ran"}}


@pytest.mark.parametrize("cand", ["fp8", "int8_per_token_head"])
def test_perplexity_under_rules2_names_the_missing_per_passage_figures(cand: str) -> None:
    (check,) = judge_probe("perplexity", _inputs("perplexity"), cand, Bars())
    assert check["outcome"] == "not_measured"
    assert check["text"] == ("perplexity delta: not measured (perplexity ran under rules/2, whose perplexity.json kept "
                             f"totals: its per-passage figures for {cand} are not recorded)")


def test_tasks_under_rules2_names_the_missing_per_document_scores() -> None:
    (check,) = judge_probe("tasks", _inputs("tasks"), "fp8", Bars())
    # the reference's row is looked at first: it lacks them too
    assert check["text"] == ("kvprobe_qa exact_match drop: not measured (tasks ran under rules/2, whose tasks.json "
                             "kept totals: its per-document kvprobe_qa scores for auto are not recorded)")


def test_agreement_under_rules2_names_the_missing_per_passage_figures() -> None:
    checks = judge_probe("agreement", _inputs("agreement"), "fp8", Bars(kl_mean_max=0.01, top1_agreement_min=0.9))
    assert [c["outcome"] for c in checks] == ["not_measured", "not_measured"]
    assert all("agreement ran under rules/2, whose agreement.json kept totals: its per-passage figures for fp8 "
               "are not recorded" in c["text"] for c in checks)


def test_a_row_with_no_result_still_says_so() -> None:
    inputs = _inputs("perplexity")
    inputs["probes"]["perplexity"]["servers"]["fp8"] = {"role": "candidate"}
    (check,) = judge_probe("perplexity", inputs, "fp8", Bars())
    assert check["text"] == "perplexity delta: not measured (no perplexity result for fp8)"
