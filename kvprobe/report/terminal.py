"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from kvprobe.inventory import Inventory
from kvprobe.report.platform_text import platform_text


def _num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def audit_table(inventories: list[Inventory]) -> Table:
    table = Table(title="kvprobe audit", header_style="bold")
    for col in ("url", "version", "model", "max len", "cache dtype", "KV tokens", "est.", "max conc.",
                "KV usage", "health", "smoke", "platform"):
        table.add_column(col, justify="right" if col in ("max len", "KV tokens", "max conc.", "KV usage") else "left")
    for inv in inventories:
        cap = inv.capacity
        smoke = "-" if inv.smoke is None else (
            f"ok {inv.smoke.prompt_tokens} tok {inv.smoke.seconds:.1f}s" if inv.smoke.ok else "[red]FAIL[/red]")
        health = "[green]ok[/green]" if inv.healthy else f"[red]{inv.status}[/red]"
        table.add_row(
            escape(inv.url), escape(inv.version or "-"), escape(inv.model or "-"), _num(inv.max_model_len),
            escape(inv.cache_dtype or "-"),
            _num(cap.kv_cache_tokens if cap else None), ("yes" if cap.estimate else "no") if cap else "-",
            _num(cap.max_concurrency if cap else None, ".1f"),
            "-" if inv.kv_usage is None else f"{inv.kv_usage:.1%}", health, smoke, escape(platform_text(inv.platform)),
        )
    return table


def capacity_table(summary: dict[str, Any]) -> Table:
    table = Table(title="KV capacity (from /metrics)", header_style="bold")
    for col in ("server", "role", "cache dtype", "KV tokens", "max concurrency", "ratio"):
        table.add_column(col, justify="left" if col in ("server", "role", "cache dtype") else "right")
    for name, row in summary["servers"].items():
        ratio = row.get("ratio")
        tokens = _num(row.get("kv_cache_tokens")) + (" (est.)" if row.get("estimate") else "")
        table.add_row(name, "reference" if name == summary["reference"] else "candidate",
                      row.get("cache_dtype") or "-", tokens, _num(row.get("max_concurrency"), ".2f"),
                      "-" if ratio is None else f"{ratio:.2f}x")
    return table


_STYLE = {"adopt": "green", "pass": "green", "reject": "red", "fail": "red", "inconclusive": "yellow",
          "no_gain": "dim", "not_measured": "dim", "invalid": "magenta", "broken": "bold red", "reference": "blue",
          "not judged": "yellow", "not measured": "dim"}


def rich_table(data: Any) -> Table:
    """A kvprobe.report.tables.TableData as a rich table; the decision/outcome cell is coloured."""
    table = Table(title=data.title, header_style="bold", caption=data.note, caption_justify="left")
    for header in data.headers:
        table.add_column(header, overflow="fold")
    for row, tag in zip(data.rows, data.tags or [None] * len(data.rows), strict=False):
        style = _STYLE.get(tag or "")
        # escaped: cells quote servers (errors, versions), and "[/x]" in one would be a markup error
        table.add_row(*[f"[{style}]{escape(c)}[/{style}]" if style and c == tag else escape(c) for c in row])
    return table


def verdict_tables(verdict: dict[str, Any]) -> list[Table]:
    """Decisions first, then the evidence: servers, quality, needle, load (every check is in the files)."""
    from kvprobe.report.tables import all_tables

    return [rich_table(t) for t in all_tables(verdict) if t.title not in ("Every check", "Bars (fixed before the run)")]
