"""Sizing advice before a run (kvprobe.verdict.design): a bar the planned sizes cannot pass is said up front."""

from __future__ import annotations

from kvprobe.config import parse_config
from kvprobe.verdict.design import sizing_notes

SERVERS = [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"}, {"name": "b", "url": "http://127.0.0.1:2"}]
ALL = ["perplexity", "agreement", "needle", "tasks"]


def test_the_defaults_can_pass_every_bar() -> None:
    assert sizing_notes(parse_config({"server": SERVERS}), ALL, {"kvprobe_qa": 40}) == []


def test_each_shortfall_is_one_line_naming_the_setting_and_the_size() -> None:
    config = parse_config({"server": SERVERS, "bars": {"needle_recall_drop_max": 0.0, "task_accuracy_drop_max": 0.02,
                                                       "kl_mean_max": 0.01},
                           "needle": {"count": 20}, "perplexity": {"limit": 4}})
    notes = sizing_notes(config, ALL, {"kvprobe_qa": 40})
    assert any(n.startswith("needle_recall_drop_max = 0 can only fail or be inconclusive") for n in notes)
    assert any(n.startswith("needle.count = 20 cannot pass truncation_rise_max = 0.1") and "36 needles" in n
               for n in notes)
    assert any("kvprobe_qa's documents = 40 cannot pass task_accuracy_drop_max = 0.02" in n and "191" in n
               for n in notes)
    assert any(n.startswith("perplexity.limit = 4") for n in notes)
    assert any(n.startswith("agreement.passages = 4 cannot pass kl_mean_max") for n in notes)
    assert sizing_notes(config, ["load"], {}) == []  # only for the probes that run
