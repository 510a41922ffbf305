"""Probes: each answers one question about every active server, and the registry is the one list of them.

A probe is a module `kvprobe.probes.<name>` with `async def run(ctx: EvalContext) -> dict`: it measures
the servers in ctx.active(), appends every measurement to the events log as it happens (skipping what a
resumed run already has), writes DIR/<name>.json (what it records) and returns that summary, and hands
it to ctx.reporter as it ends. Optionally `preflight(config)`, checked before any server is asked
anything, and `cannot_run(view) -> str | None`, asked after the inventory and before any probe runs
(kvprobe.evaluate.orchestrate's fit phase): why the probe cannot run on these servers at kvprobe's
default settings, or None when it fits; it raises ConfigError when a setting the operator wrote does
not fit. A probe the canary's --budget sizes has `budget_cost(config, servers, speed, max_model_len)`:
its own cost model (kvprobe.run.budget.BudgetCost), which kvprobe.evaluate.budget spends the time by
and `kvprobe check` estimates with.

PROBES below is the only place the probes are named: their run order, which run by default, which
verdict axis they feed, and how the canary's --budget sizes them. Adding a probe is one module and one
line here (and its reader in kvprobe.verdict.evidence, which a test holds to this list). The modules
are imported on first use, so `kvprobe audit` never loads lm-eval or matplotlib.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

if TYPE_CHECKING:
    from kvprobe.config import Config
    from kvprobe.run.budget import BudgetCost, Speed
    from kvprobe.run.context import EvalContext

Axis = Literal["capacity", "quality", "speed", "serving"]


class ProbeModule(Protocol):
    """The seam a probe module fills. `preflight(config)`, `cannot_run(view)` and `budget_cost(config,
    servers, speed, max_model_len)` are optional hooks, so a Protocol cannot name them;
    tests/test_structure.py holds every module to their shape, and a sized probe to having budget_cost."""

    async def run(self, ctx: EvalContext) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Probe:
    name: str
    question: str  # what it answers, as `--probes` help and docs say it
    axis: Axis  # the verdict axis its checks feed
    default: bool | Literal["when_configured"]  # tasks: on when servers.toml has a [tasks] table
    needs: tuple[str, ...] = ()  # what it asks of a server beyond the inventory
    # The canary's --budget: no cost / sized to fit, by its module's budget_cost / not planned.
    budget: Literal["free", "sized", "none"] = "sized"
    grow_rank: int | None = None  # --budget grows sized probes in this order while time is left
    replans: bool = False  # --budget re-plans what is left from the time this probe took

    @property
    def records(self) -> str:
        return f"{self.name}.json"

    def module(self) -> ModuleType:
        return importlib.import_module(f"kvprobe.probes.{self.name}")

    @property
    def run(self) -> Callable[[EvalContext], Awaitable[dict[str, Any]]]:
        return cast(ProbeModule, self.module()).run

    @property
    def preflight(self) -> Callable[[Config], Any] | None:
        return getattr(self.module(), "preflight", None)

    @property
    def cannot_run(self) -> Callable[[Any], str | None] | None:
        return getattr(self.module(), "cannot_run", None)

    @property
    def budget_cost(self) -> Callable[[Config, int, Speed, int], BudgetCost] | None:
        return getattr(self.module(), "budget_cost", None)

    def on_by_default(self, config: Config | None) -> bool:
        if self.default == "when_configured":
            return config is not None and self.name in config.model_fields_set
        return self.default


PROBES: dict[str, Probe] = {p.name: p for p in (  # run order
    Probe("capacity", "KV tokens per server from /metrics, and the memory map's prediction", "capacity", True,
          budget="free"),
    Probe("perplexity", "perplexity delta against the reference, through lm-eval", "quality", True,
          needs=("echo logprobs", "/tokenize"), grow_rank=1, replans=True),
    Probe("agreement", "top-1 agreement and KL of next-token distributions", "quality", True,
          needs=("prompt_logprobs", "/tokenize")),
    Probe("needle", "reasoning-aware needle retrieval", "quality", True, needs=("chat", "/tokenize"),
          grow_rank=0, replans=True),
    Probe("tasks", "lm-eval task accuracy", "quality", "when_configured", needs=("chat",), budget="none"),
    Probe("load", "throughput and latency of concurrent agents", "speed", True, needs=("chat", "/metrics"),
          grow_rank=2),
    # Opt-in and last: it serves the whole claimed pool, and may kill a server.
    Probe("fill", "serves each server's whole claimed KV pool", "serving", False, needs=("completions",),
          budget="free"),
)}

ORDER = tuple(PROBES)


def ordered(names: Any) -> list[str]:
    """`names` in run order (unknown names dropped)."""
    wanted = set(names)
    return [p for p in ORDER if p in wanted]


def default_probes(config: Config | None = None) -> list[str]:
    """The probes a run measures unless --probes says otherwise."""
    return [name for name, probe in PROBES.items() if probe.on_by_default(config)]


def on_axis(axis: Axis) -> tuple[str, ...]:
    return tuple(name for name, probe in PROBES.items() if probe.axis == axis)


def help_text() -> str:
    """`--probes` help, from the registry."""
    on = ",".join(n for n, p in PROBES.items() if p.default is True)
    configured = [n for n, p in PROBES.items() if p.default == "when_configured"]
    opt_in = [n for n, p in PROBES.items() if p.default is False]
    return (f"comma-separated probes: {on} (the default), "
            + "".join(f"{n} ({PROBES[n].question}; on by default when servers.toml has [{n}]) " for n in configured)
            + "and the opt-in " + ", ".join(f"{n} ({PROBES[n].question})" for n in opt_in))
