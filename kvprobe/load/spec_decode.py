"""Speculative-decoding acceptance over a load case, from vLLM's spec_decode counters (their names and
labels: kvprobe.server.metrics, after vllm/v1/spec_decode/metrics.py).

A KV dtype can cost draft acceptance while it buys capacity: fp8 KV took acceptance from 0.725 to 0.630
and tokens per step from 4.63 to 4.15 for 1.70x the KV (vllm#55557). On a spec-decode deployment that
is part of why a candidate is slower, so the load probe records it per case and the reports show it
beside tok/s. Descriptive only: no check reads it.

The figures are the ones vLLM's own SpecDecodingLogging prints: acceptance rate = accepted / drafted
tokens, mean acceptance length ("tokens per step") = 1 + accepted / drafts (the bonus token counted).
A server that exports no such counters records nothing, never a zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvprobe.server.metrics import SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS, SPEC_DRAFT_TOKENS, SPEC_DRAFTS, MetricsSnapshot

# The window's counts, by the key they are recorded under.
COUNTS = {"drafts": SPEC_DRAFTS, "draft_tokens": SPEC_DRAFT_TOKENS, "accepted_tokens": SPEC_ACCEPTED}
RATES = ("acceptance_rate", "accepted_per_draft", "tokens_per_step")
# load.json's runs and cases and the verdict's evidence keep flat scalars only, so the figures travel
# under this prefix.
PREFIX = "spec_decode_"

Series = dict[frozenset[tuple[str, str]], float]


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def _series(snap: MetricsSnapshot, name: str) -> Series:
    return {frozenset(labels.items()): value for labels, value in snap.samples.get(name, [])}


def _increase(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> Series | None:
    """Each series' increase over the window. None when the counter is absent, or a series went back,
    appeared or vanished: the server restarted (or an engine's sample was unreadable), so the window is
    not this case's and a difference would be a wrong count."""
    old, new = _series(before, name), _series(after, name)
    if not new or old.keys() != new.keys() or any(new[k] < old[k] for k in new):
        return None
    return {k: new[k] - old[k] for k in new}


def rates(counts: Mapping[str, float]) -> dict[str, float | None]:
    """The ratios of a window's counts; None where nothing was drafted (a rate of 0 would say every
    draft was rejected)."""
    drafts, drafted, accepted = counts["drafts"], counts["draft_tokens"], counts["accepted_tokens"]
    per_draft = accepted / drafts if drafts else None
    return {"acceptance_rate": _r(accepted / drafted) if drafted else None,
            "accepted_per_draft": _r(per_draft),
            "tokens_per_step": None if per_draft is None else _r(1 + per_draft)}


def _per_position(before: MetricsSnapshot, after: MetricsSnapshot, drafts: float) -> list[float | None] | None:
    """Per draft position, the share of drafts that had it accepted (summed over engines): where along
    the draft acceptance falls off. None when the counter is absent or its window unusable."""
    grown = _increase(before, after, SPEC_ACCEPTED_PER_POS)
    if grown is None or not drafts:
        return None
    by_pos: dict[int, float] = {}
    for labels, value in grown.items():
        pos = dict(labels).get("position", "")
        if not pos.isdigit():
            return None
        by_pos[int(pos)] = by_pos.get(int(pos), 0.0) + value
    return [_r(by_pos.get(i, 0.0) / drafts) for i in range(max(by_pos) + 1)]


def window(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, Any] | None:
    """The case's counts and rates from its first and last scrape; None when the server exports no
    spec_decode counters or any of them cannot be read over the window."""
    grown = {key: _increase(before, after, name) for key, name in COUNTS.items()}
    if any(series is None for series in grown.values()):
        return None
    counts = {key: round(sum(series.values())) for key, series in grown.items() if series is not None}
    out: dict[str, Any] = {**counts, **rates(counts)}
    positions = _per_position(before, after, counts["drafts"])
    if positions is not None:
        out["accepted_per_position"] = positions
    return out


def flat(recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """A window's counts and rates as prefixed scalar keys; empty when nothing was recorded."""
    if not recorded:
        return {}
    return {PREFIX + key: recorded.get(key) for key in (*COUNTS, *RATES)}


def _counts_of(row: Mapping[str, Any]) -> dict[str, float] | None:
    got = {key: row.get(PREFIX + key) for key in COUNTS}
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in got.values())
    return {k: float(v) for k, v in got.items() if v is not None} if ok else None


def pooled(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A case over its runs (rows with flat keys): counts summed over the runs that recorded them and
    rates from the sums, so a run with more drafts weighs more (a mean of per-run rates would not);
    empty when no run recorded them."""
    recorded = [c for row in rows if (c := _counts_of(row)) is not None]
    if not recorded:
        return {}
    counts = {key: int(sum(c[key] for c in recorded)) for key in COUNTS}
    return {**flat({**counts, **rates(counts)}), PREFIX + "runs": len(recorded)}


def shown(row: Mapping[str, Any]) -> str:
    """The acceptance rate with tokens per step, for a table cell; "-" when not recorded."""
    rate, per_step = row.get(PREFIX + "acceptance_rate"), row.get(PREFIX + "tokens_per_step")
    if not isinstance(rate, int | float):
        return "-"
    return f"{rate:.3f}" + (f" ({per_step:.2f} tok/step)" if isinstance(per_step, int | float) else "")


def any_recorded(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Some row has an acceptance rate: only then do the tables give it a column."""
    return any(isinstance(row.get(PREFIX + "acceptance_rate"), int | float) for row in rows)
