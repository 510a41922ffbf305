"""Probes: each answers one question about every active server.

A probe module exposes `async def run(ctx: EvalContext) -> dict`: it measures the servers in
ctx.active(), appends every measurement to the events log as it happens (skipping what a resumed
run already has), writes DIR/<probe>.json and returns that summary.

Optionally `preflight(config)`, checked before any server is asked anything, and `cannot_run(ctx) ->
str | None`, asked after the inventory and before any probe runs (kvprobe.evaluate.orchestrate's fit phase):
why the probe cannot run on these servers at kvprobe's default settings, or None when it fits; it
raises ConfigError when a setting the operator wrote does not fit.
"""

from __future__ import annotations

import importlib
from typing import Any

OPTIONAL_PROBES = ("perplexity", "agreement", "needle", "load", "fill", "tasks")


def _modules() -> dict[str, Any]:
    modules: dict[str, Any] = {}
    for name in OPTIONAL_PROBES:
        try:
            modules[name] = importlib.import_module(f"kvprobe.probes.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvprobe.probes.{name}":
                raise
    return modules


def registry() -> dict[str, Any]:
    return {name: module.run for name, module in _modules().items()}


def preflights() -> dict[str, Any]:
    return {name: module.preflight for name, module in _modules().items() if hasattr(module, "preflight")}


def fit_checks() -> dict[str, Any]:
    return {name: module.cannot_run for name, module in _modules().items() if hasattr(module, "cannot_run")}
