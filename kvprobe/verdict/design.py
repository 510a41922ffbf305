"""Before any number comes in: can this run's sizes show its bars at all?

A bar on paired 0/1 outcomes (needles, task documents, answers cut at the cap) passes only when its
score interval clears the margin, which takes about ln(0.025) / ln(1 - bar) scored pairs even when
none is lost; a bar of 0 can never pass. A bar over passages needs checks.MIN_PASSAGES of them. Each
shortfall is one line said at the start of `kvprobe eval`, so an operator does not wait an hour for
an `inconclusive` the plan made certain. They are advice, not errors: the run still measures (a
failing candidate fails at any size).
"""

from __future__ import annotations

from typing import Any

from kvprobe.stats.power import zero_loss_size
from kvprobe.verdict.checks import MIN_PASSAGES


def _pairs_line(setting: str, have: int, bar_name: str, bar: float, unit: str) -> str | None:
    if bar <= 0:
        return (f"{bar_name} = 0 can only fail or be inconclusive (no run shows a loss of exactly nothing): "
                f"give a margin, e.g. 0.10 (about {zero_loss_size(0.10)} {unit})")
    need = zero_loss_size(bar)
    if need is not None and have < need:
        return (f"{setting} = {have} cannot pass {bar_name} = {bar:g} even with nothing lost: a pass needs at "
                f"least {need} {unit} (about ln(0.025) / ln(1 - bar)); raise {setting} or the bar")
    return None


def sizing_notes(config: Any, probes: list[str], task_documents: dict[str, int] | None = None) -> list[str]:
    """One line per bar the planned sizes cannot pass, for the probes this run will run."""
    bars, notes = config.bars, []
    if "needle" in probes:
        count = config.needle.count
        notes.append(_pairs_line("needle.count", count, "needle_recall_drop_max", bars.needle_recall_drop_max,
                                 "needles"))
        notes.append(_pairs_line("needle.count", count, "truncation_rise_max", bars.truncation_rise_max, "needles"))
    if "tasks" in probes:
        for task, documents in (task_documents or {}).items():
            bar = bars.task_bar(task)
            if bar is not None:
                notes.append(_pairs_line(f"{task}'s documents", documents, "task_accuracy_drop_max", bar,
                                         "documents"))
    if "perplexity" in probes and config.perplexity.limit is not None and config.perplexity.limit < MIN_PASSAGES:
        notes.append(f"perplexity.limit = {config.perplexity.limit} cannot pass perplexity_delta_max: a pass needs "
                     f"at least {MIN_PASSAGES} passages")
    agreement_bars = [b for b in ("kl_mean_max", "top1_agreement_min") if getattr(bars, b) is not None]
    if "agreement" in probes and agreement_bars and config.agreement.passages < MIN_PASSAGES:
        notes.append(f"agreement.passages = {config.agreement.passages} cannot pass {' or '.join(agreement_bars)}: "
                     f"a pass needs at least {MIN_PASSAGES} passages")
    return [n for n in notes if n]
