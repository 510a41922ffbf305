"""Canary: the fast subset of settings, and drift against a baseline verdict."""

from __future__ import annotations

import copy
import math

from verdict_inputs import Measurements, perplexity_rows

from kvprobe.config import parse_config
from kvprobe.evaluate.canary import canary_config, canary_probes, compare_with_baseline
from kvprobe.verdict.build import build_verdict

SERVERS = {"server": [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"},
                      {"name": "b", "url": "http://127.0.0.1:2"}]}


def test_canary_settings_are_small_and_keep_smaller_user_settings():
    config = canary_config(parse_config({**SERVERS, "needle": {"count": 2}, "load": {"agents": [8, 16],
                                                                                     "duration_s": 600}}))
    assert config.perplexity.limit == 4
    assert config.agreement.passages == 1
    assert config.needle.count == 2  # the user's 2 is already fewer than the canary's 4
    assert config.load.agents == [8] and config.load.requests_per_case == 4
    # the full eval's sequential design, on fewer blocks
    assert config.load.repeats is None and config.load.max_blocks == 8 and config.load.look_every == 4
    assert config.load.duration_s is None
    assert config.bars == parse_config(SERVERS).bars  # same bars as a full run
    full = parse_config(SERVERS)
    assert canary_config(full).needle.count == 8 and full.needle.count == 180


def test_canary_probes_are_capacity_and_whatever_is_installed():
    probes = canary_probes()
    assert probes[0] == "capacity"
    assert set(probes) <= {"capacity", "perplexity", "agreement", "needle", "load"}


def _verdicts(tmp_path, change):
    base_m = Measurements()
    cur_m = copy.deepcopy(base_m)
    change(cur_m)
    return build_verdict(base_m.write(tmp_path / "base")), build_verdict(cur_m.write(tmp_path / "cur"))


def test_no_drift_between_equal_runs(tmp_path):
    base, cur = _verdicts(tmp_path, lambda m: None)
    drift = compare_with_baseline(base, cur, "base/verdict.json")
    assert drift["items"] == [] and drift["fails"] == []


def test_quality_moved_beyond_the_bar_fails(tmp_path):
    def worse(m):
        m.perplexity["servers"]["cand"] = perplexity_rows(math.log1p(0.02))  # the check's delta: +2.00%

    drift = compare_with_baseline(*_verdicts(tmp_path, worse), "base")
    assert len(drift["fails"]) == 1 and "perplexity delta moved +0.10% -> +2.00%" in drift["fails"][0]
    assert any(i["what"] == "decision" and i["now"] == "reject" for i in drift["items"])


def test_capacity_drop_fails_a_rise_is_a_note(tmp_path):
    def smaller(m):
        m.servers[1] = ("cand", "candidate", 150_000, "fp8")

    drift = compare_with_baseline(*_verdicts(tmp_path, smaller), "base")
    assert drift["fails"] == ["cand: capacity changed 200,000 -> 150,000 tokens (-25.0%)"]

    def bigger(m):
        m.servers[1] = ("cand", "candidate", 300_000, "fp8")

    drift = compare_with_baseline(*_verdicts(tmp_path / "b", bigger), "base")
    assert drift["fails"] == [] and drift["items"][0]["severity"] == "note"


def test_needle_recall_fall_fails(tmp_path):
    def fewer(m):
        m.needle["servers"]["cand"].update(hit=15, miss=5, recall=0.75)

    drift = compare_with_baseline(*_verdicts(tmp_path, fewer), "base")
    assert drift["fails"] == ["cand: needle recall fell 1.00 -> 0.75 (bar 0.10)"]
