"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
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


def rich_table(data: Any) -> RenderableType:
    """A kvprobe.report.tables.TableData for the terminal, laid out in the width it is printed at without
    cutting a number (kvprobe.report.text_table); the decision/outcome cell is coloured."""
    from kvprobe.report.text_table import FittedTable

    return FittedTable(data, OUTCOME_STYLE)


def verdict_tables(verdict: dict[str, Any]) -> list[RenderableType]:
    """Decisions first, then the evidence: servers, quality, needle, load (every check is in the files)."""
    from kvprobe.report.tables import all_tables

    return [rich_table(t) for t in all_tables(verdict) if t.title not in ("Every check", "Bars (fixed before the run)")]
