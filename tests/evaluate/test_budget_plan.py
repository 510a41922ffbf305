"""--budget: sizing the canary from the first-prefill smoke's speed, each probe by its own cost model
(the real-server check that the budget is kept is in tests/integration/test_canary_ci.py)."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest

from kvprobe.config import parse_config
from kvprobe.evaluate.budget import plan_budget
from kvprobe.evaluate.canary import canary_config
from kvprobe.probes import Probe
from kvprobe.run.budget import RESERVE_S, corrected_scale
from kvprobe.server.fit import written
from kvprobe.server.inventory import Inventory, Smoke

PROBES = ["capacity", "perplexity", "agreement", "needle", "load"]
CONFIG = canary_config(parse_config({"server": [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"},
                                                {"name": "b", "url": "http://127.0.0.1:2"}]}), budgeted=True)


def inventories(*rates: float) -> list[Inventory]:
    # The smoke of the demo trio: 4,096 tokens; seconds set for the given prompt tokens per second.
    return [Inventory(name=f"s{i}", url="x", max_model_len=8192,
                      smoke=Smoke(ok=True, prompt_tokens=4096, seconds=4096 / r)) for i, r in enumerate(rates)]


def test_the_slowest_smoke_sizes_the_plan_and_more_time_buys_more_samples() -> None:
    # 600 s, not 300: the blocks to the speed design's first look (8 under rules/5) take most of 300 s
    _, fast = plan_budget(CONFIG, PROBES, inventories(3000, 3200), 600, 8192)
    _, slow = plan_budget(CONFIG, PROBES, inventories(1000, 3200), 600, 8192)
    assert slow.rate == pytest.approx(1000) and fast.rate == pytest.approx(3000)
    assert slow.sizes["needle"]["needles"] < fast.sizes["needle"]["needles"]
    _, longer = plan_budget(CONFIG, PROBES, inventories(1000, 3200), 900, 8192)
    assert longer.sizes["perplexity"]["passages"] > slow.sizes["perplexity"]["passages"]
    for plan in (fast, slow, longer):  # what it plans fits in the budget, less the verdict's reserve
        assert sum(plan.estimates.values()) <= plan.seconds - RESERVE_S
        assert plan.probes == PROBES and not plan.left_out


def test_a_budget_too_small_leaves_probes_out_and_says_so() -> None:
    _, plan = plan_budget(CONFIG, PROBES, inventories(300, 300), 60, 8192)
    assert plan.probes[0] == "capacity" and plan.left_out
    assert plan.describe().endswith("left out (no time): " + ", ".join(plan.left_out))
    assert "budget 60s from 300 prompt tokens/s" in plan.describe()


def test_the_resized_config_is_what_the_probes_get() -> None:
    config, plan = plan_budget(CONFIG, PROBES, inventories(3000, 3000), 300, 8192)
    assert config.perplexity.limit == plan.sizes["perplexity"]["passages"]
    assert config.needle.count == plan.sizes["needle"]["needles"]
    assert config.load.requests_per_case == plan.sizes["load"]["requests per case"]
    # kvprobe's size, not the operator's: the load probe's pilot may still size its cases by precision
    assert not written(config.load, "requests_per_case")


def test_a_finished_probe_corrects_the_model_within_bounds() -> None:
    _, plan = plan_budget(CONFIG, PROBES, inventories(1000, 1000), 300, 8192)
    est = plan.estimates["perplexity"]
    assert corrected_scale(plan, "perplexity", est / 2) == pytest.approx(0.5)
    assert corrected_scale(plan, "perplexity", est * 100) == 5.0  # one slow probe does not stop the rest
    assert corrected_scale(plan, "capacity", 3.0) is None  # nothing modelled, nothing learnt
    _, rescaled = plan_budget(CONFIG, PROBES, inventories(1000, 1000), 300, 8192, scale=0.5)
    assert rescaled.sizes["needle"]["needles"] > plan.sizes["needle"]["needles"]
    assert "model x0.50" in rescaled.describe()


def test_a_sized_probe_without_a_cost_model_is_left_out_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # A probe registered as sized whose module has no budget_cost: once a KeyError in the planner's own table.
    import kvprobe.probes as registry

    module = ModuleType("kvprobe.probes.fake")

    async def run(ctx: Any) -> dict[str, Any]:
        return {}

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.PROBES, "fake", Probe("fake", "a fake", "quality", False, grow_rank=9))
    monkeypatch.setattr(registry, "ORDER", (*registry.ORDER, "fake"))
    config, plan = plan_budget(CONFIG, [*PROBES, "fake"], inventories(3000, 3000), 300, 8192)
    assert plan.left_out == plan.unpriced == ["fake"] and "fake" not in plan.estimates
    assert plan.describe().endswith("; left out (no cost model, no budget_cost in its module): fake")
    # The probes that have one are planned as without it.
    alone_config, alone = plan_budget(CONFIG, PROBES, inventories(3000, 3000), 300, 8192)
    assert (plan.probes, plan.sizes, plan.estimates) == (alone.probes, alone.sizes, alone.estimates)
    assert config == alone_config
