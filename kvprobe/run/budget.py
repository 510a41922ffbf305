"""`kvprobe canary --budget 5m`: size the canary's subset to the time it has, and stop there.

Sizing uses the first-prefill smoke's measured speed: the slowest server's prompt tokens per second
(the smoke is each server's first long request, so the estimate errs long). Each probe's cost is
modelled in prefill tokens over the servers it runs on, plus a per-answer decode allowance; the
minimum subset goes first, what is left is spread over perplexity passages, needles and load requests.
A hard deadline backs the estimate: a probe still running at the budget is cancelled, recorded as cut
(its events stay on disk), later probes are not started, and the verdict says what was not measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvprobe.config import Config
from kvprobe.errors import ConfigError
from kvprobe.probes import PROBES, ordered
from kvprobe.server.inventory import Inventory

# Measured on the demo trio (needle-llama, 2 cores): a shipped perplexity passage is ~2,700 tokens,
# a needle answer ~60 decoded tokens, and decode runs ~30 ms a token while other servers share the CPU.
PASSAGE_TOKENS = 2_700
DECODE_S_PER_TOKEN = 0.03
NEEDLE_ANSWER_TOKENS = 64
# Verdict, signature, reports and their plots after the last probe: ~5-10 s on a busy 2-core box.
RESERVE_S = 12.0
RESERVE_SHARE = 0.05
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str, option: str) -> float:
    """'5m', '90s', '1h30m', '300' (seconds) -> seconds; `option` names the flag in the one-line error."""
    raw = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise ConfigError([f"{option} {text!r}: give a duration like 5m, 90s or 1h30m"])
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_budget(text: str) -> float:
    """'5m', '90s', '1h30m', '300' (seconds) -> seconds."""
    seconds = parse_duration(text, "--budget")
    if seconds < 30:
        raise ConfigError([f"--budget {text!r}: at least 30s (the inventory and the verdict alone take seconds)"])
    return seconds


@dataclass
class BudgetPlan:
    seconds: float
    rate: float | None  # prompt tokens per second, the slowest server's smoke
    probes: list[str]
    estimates: dict[str, float] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # probes the budget cannot hold
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""
    scale: float = 1.0  # measured time / modelled time, from the probes done so far

    def describe(self) -> str:
        parts = []
        for probe in self.probes:
            size = ", ".join(f"{k} {v}" for k, v in self.sizes.get(probe, {}).items())
            parts.append(f"{probe}" + (f" ({size})" if size else "") + f" ~{self.estimates.get(probe, 0):.0f}s")
        rate = f"{self.rate:,.0f} prompt tokens/s (the slowest first-prefill smoke)" if self.rate else "no smoke speed"
        scaled = f", model x{self.scale:.2f} {self.source}" if self.scale != 1.0 else ""
        text = f"budget {self.seconds:.0f}s from {rate}{scaled}: " + "; ".join(parts)
        if self.left_out:
            text += f"; left out (no time): {', '.join(self.left_out)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "rate": self.rate, "scale": self.scale, "probes": self.probes,
                "estimates": self.estimates, "left_out": self.left_out, "sizes": self.sizes}


def corrected_scale(plan: BudgetPlan, probe: str, seconds: float) -> float | None:
    """How far off the model was, from a finished probe's own time: the smoke runs every server at
    once and cold, so on a shared box it errs slow, and decode speed is only a guess."""
    estimate = plan.estimates.get(probe)
    if not estimate or estimate < 1 or seconds <= 0:  # too short to learn from
        return None
    return plan.scale * min(max(seconds / estimate, 0.2), 5.0)


def smoke_rate(inventories: list[Inventory]) -> float | None:
    rates = [inv.smoke.prompt_tokens / inv.smoke.seconds for inv in inventories
             if inv.serving and inv.smoke and inv.smoke.ok and inv.smoke.prompt_tokens and inv.smoke.seconds]
    return min(rates) if rates else None


def _first_look(config: Config) -> int:
    from kvprobe.stats.sequential import of_settings

    return of_settings(config.load).looks[0]


def _costs(config: Config, servers: int, rate: float, max_model_len: int) -> dict[str, Any]:
    """Seconds per unit of each probe, and its fixed part."""
    passes = servers + config.perplexity.reference_repeats - 1
    needle_len = (config.needle.min_length + max_model_len - config.needle.max_tokens) / 2
    load = config.load
    turn_tokens = load.system_tokens + load.tokens_per_turn * (load.turns + 1) / 2
    per_request = load.turns * (turn_tokens / rate + load.max_output_tokens * DECODE_S_PER_TOKEN)
    agents = min(load.agents)
    return {
        "perplexity": passes * min(PASSAGE_TOKENS, max_model_len) / rate,
        "agreement": passes * config.agreement.max_tokens_per_passage / rate,
        "needle": servers * (needle_len / rate + NEEDLE_ANSWER_TOKENS * DECODE_S_PER_TOKEN)
        / config.needle.concurrency,
        # Per request, over the blocks to the design's first look and the servers, plus each case's settle
        # pause and warm-up; the probe stops its blocks at the deadline by itself.
        "load": servers * _first_look(config) * per_request / agents,
        "load_fixed": servers * (_first_look(config) * load.settle_s + (per_request if load.warmup else 0)),
    }


def _kind(probe: str) -> str:
    return PROBES[probe].budget if probe in PROBES else "none"


def plan_budget(config: Config, probes: list[str], inventories: list[Inventory], seconds_left: float,
                max_model_len: int, scale: float = 1.0) -> tuple[Config, BudgetPlan]:
    """The config resized to what `seconds_left` holds, and the plan that says so. `config` holds the
    most each probe may grow to; `scale` corrects the model once a probe has shown how far off it is."""
    servers = sum(1 for inv in inventories if inv.serving)
    rate = smoke_rate(inventories)
    plan = BudgetPlan(seconds_left, rate, [p for p in probes if _kind(p) == "free"], scale=scale)
    if rate is None or servers == 0:
        plan.left_out = [p for p in probes if p not in plan.probes]
        return config, plan
    cost = {k: v * scale for k, v in _costs(config, servers, rate, max_model_len).items()}
    room = seconds_left * (1 - RESERVE_SHARE) - RESERVE_S
    units = {"perplexity": 1, "agreement": 1, "needle": 2, "load": 2}  # the smallest useful subset
    caps = {"perplexity": config.perplexity.limit or 16, "agreement": 1, "needle": config.needle.count,
            "load": (config.load.requests_per_case or 8)}

    def spent(p: str) -> float:
        return units[p] * cost[p] + (cost["load_fixed"] if p == "load" else 0.0)

    for p in [p for p in ordered(probes) if _kind(p) == "sized"]:
        if spent(p) <= room:
            plan.probes.append(p)
            room -= spent(p)
        else:
            plan.left_out.append(p)
    # Grow the probes that gain most from size in turn (grow_rank), one unit at a time, while time is left.
    growing = sorted((p for p in plan.probes if p in PROBES and PROBES[p].grow_rank is not None),
                     key=lambda p: PROBES[p].grow_rank or 0)
    while growing:
        for p in list(growing):
            if units[p] < caps[p] and cost[p] <= room:
                units[p] += 1
                room -= cost[p]
            else:
                growing.remove(p)
    update: dict[str, Any] = {}
    if "perplexity" in plan.probes:
        update["perplexity"] = config.perplexity.model_copy(update={"limit": units["perplexity"]})
        plan.sizes["perplexity"] = {"passages": units["perplexity"]}
    if "needle" in plan.probes:
        update["needle"] = config.needle.model_copy(update={"count": units["needle"]})
        plan.sizes["needle"] = {"needles": units["needle"]}
    if "load" in plan.probes:
        update["load"] = config.load.model_copy(update={"requests_per_case": units["load"]})
        plan.sizes["load"] = {"requests per case": units["load"], "blocks": f"up to {config.load.blocks}"}
    if "agreement" in plan.probes:
        plan.sizes["agreement"] = {"passages": 1}
    for p in plan.probes:
        plan.estimates[p] = spent(p) if p in units else 0.0
    return config.model_copy(update=update), plan
