"""`kvprobe canary --budget 5m`: the generic parts of sizing the canary's subset to the time it has.

Sizing uses the first-prefill smoke's measured speed: the slowest server's prompt tokens per second
(the smoke is each server's first long request, so the estimate errs long). Each probe models its own
cost in its module (`budget_cost`, a BudgetCost: prefill tokens over the servers it runs on, plus a
per-answer decode allowance, in the units it is sized by); kvprobe.evaluate.budget spends the time on
them: the minimum subset first, what is left over perplexity passages, needles and load requests.
A hard deadline backs the estimate: a probe still running at the budget is cancelled, recorded as cut
(its events stay on disk), later probes are not started, and the verdict says what was not measured.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from kvprobe.errors import ConfigError

if TYPE_CHECKING:  # a type only: `kvprobe check` costs probes with no server client loaded
    from kvprobe.server.inventory import Inventory

# Measured on the demo trio (needle-llama, 2 cores): decode runs ~30 ms a token while other servers
# share the CPU.
DECODE_S_PER_TOKEN = 0.03
# Load decodes in batches on servers taking turns: the AVX2-only EPYC's single-agent cases took ~9 ms a
# token (tests/fixtures/runs/amd-avx2-demo), not the 30 ms of answers decoded beside other servers' work.
LOAD_DECODE_S_PER_TOKEN = 0.01
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


class Speed(NamedTuple):
    """How fast the servers are taken to be: measured (the smoke's prompt rate) or assumed (kvprobe check)."""

    prompt_tokens_per_s: float
    s_per_decoded_token: float = DECODE_S_PER_TOKEN


class LoadPace(NamedTuple):
    """How fast the load probe's cases are taken to run. Its turns are short and its agents' prefills and
    decodes batch: a small model's long-prompt rate (Speed, the smoke's) prices them several times too slow."""

    prompt_tokens_per_s: float  # a turn's fresh tokens, every agent's together
    s_per_decoded_token: float  # one batched decode step
    pause_s: float | None = None  # around each case; None: [load] settle_s (servers on CPUs sleep it whole)


def load_pace(speed: Speed) -> LoadPace:
    """A Speed taken as the load's pace: its rates, decodes batched to at most LOAD_DECODE_S_PER_TOKEN."""
    return LoadPace(speed.prompt_tokens_per_s, min(speed.s_per_decoded_token, LOAD_DECODE_S_PER_TOKEN))


# A size applied: the config sections that run it (servers.toml's tables by name) and the size as the
# plan says it ({"passages": 4}).
Resized = tuple[dict[str, Any], dict[str, Any]]


@dataclass(frozen=True)
class BudgetCost:
    """One probe's cost at one speed, in the units --budget sizes it by (a passage, a needle, a request
    per case): what its module's `budget_cost(config, servers, speed, max_model_len)` hook returns."""

    unit_s: float  # seconds per unit
    least: int  # the smallest useful size
    most: int  # the most --budget grows it to
    resize: Callable[[int], Resized]  # a size -> the config that runs it
    fixed_s: float = 0.0  # seconds whatever the size: settle pauses, warm-up

    def seconds(self, units: int) -> float:
        return units * self.unit_s + self.fixed_s

    def scaled(self, scale: float) -> BudgetCost:
        return replace(self, unit_s=self.unit_s * scale, fixed_s=self.fixed_s * scale)


@dataclass
class BudgetPlan:
    seconds: float
    rate: float | None  # prompt tokens per second, the slowest server's smoke
    probes: list[str]
    estimates: dict[str, float] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # probes the budget cannot hold
    unpriced: list[str] = field(default_factory=list)  # of left_out: sized, but their module models no cost
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
        no_time = [p for p in self.left_out if p not in self.unpriced]
        if no_time:
            text += f"; left out (no time): {', '.join(no_time)}"
        if self.unpriced:
            text += f"; left out (no cost model, no budget_cost in its module): {', '.join(self.unpriced)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "rate": self.rate, "scale": self.scale, "probes": self.probes,
                "estimates": self.estimates, "left_out": self.left_out, "unpriced": self.unpriced,
                "sizes": self.sizes}


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
