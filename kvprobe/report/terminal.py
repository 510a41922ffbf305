"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from kvprobe.server.inventory import Inventory


def _num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def audit_table(inventories: list[Inventory], width: int = 160) -> RenderableType:
    """`kvprobe audit`'s fleet view (kvprobe.report.fleet): one row per server, grouped by model, fitted to
    `width` columns."""
    from kvprobe.report.fleet import fleet_table

    return fleet_table(inventories, width)


def capacity_table(summary: dict[str, Any]) -> Table:
    table = Table(title="KV capacity (from /metrics)", header_style="bold")
    for col in ("server", "role", "cache dtype", "KV tokens", "max concurrency", "ratio"):
        table.add_column(col, justify="left" if col in ("server", "role", "cache dtype") else "right", overflow="fold")
    for name, row in summary["servers"].items():
        ratio = row.get("ratio")
        tokens = _num(row.get("kv_cache_tokens")) + (" (est.)" if row.get("estimate") else "")
        table.add_row(name, "reference" if name == summary["reference"] else "candidate",
                      row.get("cache_dtype") or "-", tokens, _num(row.get("max_concurrency"), ".2f"),
                      "-" if ratio is None else f"{ratio:.2f}x")
    return table


OUTCOME_STYLE = {"adopt": "green", "pass": "green", "reject": "red", "fail": "red", "inconclusive": "yellow",
          "no_gain": "dim", "not_measured": "dim", "invalid": "magenta", "broken": "bold red", "reference": "blue",
          "not judged": "yellow", "not measured": "dim"}


def rich_table(data: Any) -> Table:
    """A kvprobe.report.tables.TableData as a rich table; the decision/outcome cell is coloured."""
    table = Table(title=data.title, header_style="bold", caption=data.note, caption_justify="left")
    for header in data.headers:
        table.add_column(header, overflow="fold")
    for row, tag in zip(data.rows, data.tags or [None] * len(data.rows), strict=False):
        style = OUTCOME_STYLE.get(tag or "")
        # escaped: cells quote servers (errors, versions), and "[/x]" in one would be a markup error
        table.add_row(*[f"[{style}]{escape(c)}[/{style}]" if style and c == tag else escape(c) for c in row])
    return table


def verdict_tables(verdict: dict[str, Any]) -> list[Table]:
    """Decisions first, then the evidence: servers, quality, needle, load (every check is in the files)."""
    from kvprobe.report.tables import all_tables

    return [rich_table(t) for t in all_tables(verdict) if t.title not in ("Every check", "Bars (fixed before the run)")]
