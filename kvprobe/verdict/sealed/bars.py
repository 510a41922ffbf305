"""The bars a sealed rule set reads, from a verdict's recorded `bars` (kvprobe.config.Bars, as it was when the
rules were sealed: its defaults fill a bar the verdict does not record)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Bars:
    perplexity_delta_max: float = 0.01
    needle_recall_drop_max: float = 0.10
    truncation_rise_max: float = 0.10
    capacity_gain_min: float = 0.05
    throughput_drop_max: float = 0.05
    p99_latency_rise_max: float = 0.10
    kl_mean_max: float | None = None
    task_accuracy_drop_max: float | dict[str, float] = 0.10
    top1_agreement_min: float | None = None

    @classmethod
    def of(cls, recorded: dict[str, Any]) -> Bars:
        """The recorded bars; a field this rule set does not know is an error (a verdict of other rules)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(recorded) - known)
        if unknown:
            raise ValueError(f"bars this rule set does not know: {', '.join(unknown)}")
        return cls(**recorded)

    def task_bar(self, task: str) -> float | None:
        """The bar on `task`; None when a table names neither it nor a default."""
        bar = self.task_accuracy_drop_max
        return bar if not isinstance(bar, dict) else bar.get(task, bar.get("default"))
