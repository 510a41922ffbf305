"""`kvprobe canary --budget`: the subset sized to the time left, from each probe's own cost model.

The registry says how --budget treats a probe (free, sized or not planned) and in which order sized
probes grow; a sized probe's module says what it costs (`budget_cost`, kvprobe.run.budget.BudgetCost).
Every sized probe gets its smallest useful size first, in run order, while the time holds it; then the
probes that gain most from size grow in turn, one unit at a time, while time is left.
"""

from __future__ import annotations

from typing import Any

from kvprobe.config import Config
from kvprobe.probes import PROBES, ordered
from kvprobe.run.budget import RESERVE_S, RESERVE_SHARE, BudgetCost, BudgetPlan, Speed, smoke_rate
from kvprobe.server.inventory import Inventory


def _kind(probe: str) -> str:
    return PROBES[probe].budget if probe in PROBES else "none"


def plan_budget(config: Config, probes: list[str], inventories: list[Inventory], seconds_left: float,
                max_model_len: int, scale: float = 1.0) -> tuple[Config, BudgetPlan]:
    """The config resized to what `seconds_left` holds, and the plan that says so. `config` holds the
    most each probe may grow to; `scale` corrects the model once a probe has shown how far off it is.
    A sized probe whose module models no cost is left out, and the plan says why."""
    servers = sum(1 for inv in inventories if inv.serving)
    rate = smoke_rate(inventories)
    plan = BudgetPlan(seconds_left, rate, [p for p in probes if _kind(p) == "free"], scale=scale)
    if rate is None or servers == 0:
        plan.left_out = [p for p in probes if p not in plan.probes]
        return config, plan
    room = seconds_left * (1 - RESERVE_SHARE) - RESERVE_S
    costs: dict[str, BudgetCost] = {}
    for p in [p for p in ordered(probes) if _kind(p) == "sized"]:
        hook = PROBES[p].budget_cost
        if hook is None:
            plan.left_out.append(p)
            plan.unpriced.append(p)
            continue
        cost = hook(config, servers, Speed(rate), max_model_len).scaled(scale)
        if cost.seconds(cost.least) <= room:
            plan.probes.append(p)
            costs[p] = cost
            room -= cost.seconds(cost.least)
        else:
            plan.left_out.append(p)
    units = {p: cost.least for p, cost in costs.items()}
    growing = sorted((p for p in costs if PROBES[p].grow_rank is not None), key=lambda p: PROBES[p].grow_rank or 0)
    while growing:
        for p in list(growing):
            if units[p] < costs[p].most and costs[p].unit_s <= room:
                units[p] += 1
                room -= costs[p].unit_s
            else:
                growing.remove(p)
    update: dict[str, Any] = {}
    for p, cost in costs.items():
        sections, plan.sizes[p] = cost.resize(units[p])
        update |= sections
    for p in plan.probes:
        plan.estimates[p] = costs[p].seconds(units[p]) if p in costs else 0.0
    return config.model_copy(update=update), plan
