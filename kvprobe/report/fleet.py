"""`kvprobe audit` as a fleet view: one row per server, grouped by model, each row saying what sets it
apart from the rest of its group, in a table that fits the terminal without cutting a host:port or a
number (columns that do not fit are left out and named; --json has everything)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvprobe.knob import FOLLOWING
from kvprobe.report.platform_text import platform_short
from kvprobe.server.inventory import Inventory
from kvprobe.server.pressure import Diagnosis

# The facts compared within a model group, by their --json names.
FACTS = ("cache_dtype", "max_model_len", "version", "platform", "kv_cache_tokens")
DIFFERS = "differs from the others in"


def host_port(url: str) -> str:
    """`127.0.0.1:8101`, `[::1]:8000`, `gw.example.com:443/vllm/a`: what tells servers apart, whole; the
    scheme only takes width. A path stays: servers behind one gateway differ only by it."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return url
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    port = parsed.port or {"https": 443, "http": 80}.get(parsed.scheme)
    path = parsed.path.rstrip("/")
    return f"{host}{f':{port}' if port else ''}{path}"


def facts(inv: Inventory) -> dict[str, Any]:
    """The values compared; None is unknown (not exposed, unreadable), and is never a difference.

    Beside FACTS, every other cache_config_info label a server sets (mamba_ssm_cache_dtype,
    enable_prefix_caching, kv_cache_memory_bytes, ...): the allocator's outcomes (knob.FOLLOWING) are
    left out, since they follow from the rest and kv_cache_tokens already says so."""
    labels = {k: v for k, v in (inv.cache_config or {}).items()
              if k not in FOLLOWING and k != "cache_dtype" and v not in ("None", "")}
    return {**labels, **{
        "cache_dtype": inv.cache_dtype,
        "max_model_len": inv.max_model_len,
        "version": inv.version,
        # The short form: the fields a fleet operator tells platforms apart by (CPU line, family/model,
        # kernel ISA; GPU model and CUDA). A driver patch level alone is not flagged.
        "platform": platform_short(inv.platform) if inv.platform else None,
        "kv_cache_tokens": inv.capacity.kv_cache_tokens if inv.capacity else None,
    }}


def group_by_model(inventories: list[Inventory]) -> list[tuple[str | None, list[Inventory]]]:
    """Servers by served model name, in the order first listed; None gathers those not audited."""
    groups: dict[str | None, list[Inventory]] = {}
    for inv in inventories:
        groups.setdefault(inv.model, []).append(inv)
    return list(groups.items())


def differences(group: list[Inventory]) -> list[list[str]]:
    """Per server, the facts in which it differs from the rest of its group.

    A server differs in a fact when its value is not the group's one most common value: of auto, auto
    and fp8 only the fp8 server differs in cache_dtype; of two servers with two values both do (there is
    no majority to differ from)."""
    table = [facts(inv) for inv in group]
    labels = sorted({k for row in table for k in row} - set(FACTS))
    out: list[list[str]] = [[] for _ in group]
    for name in (*FACTS, *labels):
        counts = Counter(row.get(name) for row in table if row.get(name) is not None)
        if len(counts) < 2:
            continue
        ranked = counts.most_common()
        mode = ranked[0][0] if ranked[0][1] > ranked[1][1] else None
        for i, row in enumerate(table):
            if row.get(name) is not None and row[name] != mode:
                out[i].append(name)
    return out


def _num(value: float | None, fmt: str = ",") -> str:
    return "-" if value is None else format(value, fmt)


def _conc(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _state(inv: Inventory) -> str:
    if inv.status != "ok":
        return "[red]smoke FAIL[/red]" if inv.smoke is not None and not inv.smoke.ok else f"[red]{inv.status}[/red]"
    return "[green]ok[/green]" if inv.healthy else "[yellow]unhealthy[/yellow]"


@dataclass(frozen=True)
class Column:
    header: str
    keep: int  # lower is dropped first when the terminal is too narrow
    cell: Callable[[Inventory, list[str]], str]  # markup
    numeric: bool = False
    wraps: bool = False  # prose that may fold at its commas; every other cell is shown whole or not at all


def _tokens(inv: Inventory, _: list[str]) -> str:
    cap = inv.capacity
    # "~": num_gpu_blocks x block_size, the estimate older servers allow (wrong for hybrids)
    return "-" if cap is None else ("~" if cap.estimate else "") + _num(cap.kv_cache_tokens)


COLUMNS = (
    Column("server", 100, lambda inv, _: escape(host_port(inv.url))),
    Column("dtype", 90, lambda inv, _: escape(inv.cache_dtype or "-")),
    Column("KV tokens", 85, _tokens, numeric=True),
    Column(DIFFERS, 80, lambda inv, d: escape(", ".join(d)) if d else "-", wraps=True),
    Column("state", 70, lambda inv, _: _state(inv)),
    Column("max len", 60, lambda inv, _: _num(inv.max_model_len), numeric=True),
    Column("version", 50, lambda inv, _: escape(inv.version or "-")),
    Column("platform", 40, lambda inv, _: escape(platform_short(inv.platform))),
    Column("conc.", 30, lambda inv, _: _conc(inv.capacity.max_concurrency if inv.capacity else None),
           numeric=True),
    Column("KV use", 20, lambda inv, _: "-" if inv.kv_usage is None else f"{inv.kv_usage:.1%}", numeric=True),
)

_KV_TOKENS = COLUMNS[2]
Rows = list[tuple[Inventory, list[str]]]


def _plain(markup: str) -> str:
    return Text.from_markup(markup).plain


def _widths(rows: Rows, columns: list[Column]) -> tuple[dict[str, int], int]:
    """Each column's natural width (its widest cell or header), and the least the wrapping one can take:
    its longest word, so that a fact name is never split."""
    natural, least = {}, 0
    for col in columns:
        cells = [_plain(col.cell(inv, d)) for inv, d in rows]
        if col.wraps:
            natural[col.header] = max(len(c) for c in cells) if cells else 1
            words = [w for c in cells for w in c.split()] + col.header.split()
            least = max(len(w) for w in words)
            natural[col.header] = max(natural[col.header], least)
        else:
            natural[col.header] = max([len(col.header), *(len(c) for c in cells)])
    return natural, least


def _table(title: str, rows: Rows, columns: list[Column], widths: dict[str, int]) -> Table:
    # Two spaces between columns and none at the edges: the width goes to the cells.
    table = Table(title=escape(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, collapse_padding=True)
    for col in columns:
        # Fixed widths: rich would otherwise even out an overflow over every column, cutting numbers.
        table.add_column(col.header, justify="right" if col.numeric else "left", width=widths[col.header],
                         no_wrap=not col.wraps, overflow="fold")
    for inv, d in rows:
        table.add_row(*(col.cell(inv, d) for col in columns))
    return table


def _fit(title: str, rows: Rows, columns: list[Column], width: int, console: Console) -> Table | None:
    """The group's table in `width` columns, the wrapping column narrowed as far as its longest word;
    None when even that does not fit."""
    widths, least = _widths(rows, columns)
    table = _table(title, rows, columns, widths)
    # measured unbounded: a measurement within the console's width is clamped to it
    over = Measurement.get(console, console.options.update_width(10**5), table).maximum - width
    if over <= 0:
        return table
    wrapping = next((c for c in columns if c.wraps), None)
    if wrapping is None or widths[wrapping.header] - over < least:
        return None
    return _table(title, rows, columns, {**widths, wrapping.header: widths[wrapping.header] - over})


def _title(model: str | None, group: list[Inventory]) -> str:
    n = f"{len(group)} server{'s' if len(group) != 1 else ''}"
    return f"{model}: {n}" if model is not None else f"not audited: {n}"


def fleet_table(inventories: list[Inventory], width: int) -> RenderableType:
    """One table per model group, all with the same columns: those that fit `width` without cutting a
    server, a dtype or a number, the rest named in a note under them."""
    groups = [(_title(model, group), list(zip(group, differences(group), strict=True)))
              for model, group in group_by_model(inventories)]
    console = Console(width=max(width, 20))
    # A column of "ok" in every row says nothing the note under the table cannot say in a line.
    all_ok = all(inv.status == "ok" and inv.healthy for inv in inventories)
    shown = [c for c in COLUMNS if not (all_ok and c.header == "state")]
    kept = sorted(shown, key=lambda c: -c.keep)
    dropped: list[Column] = []
    while True:
        columns = [c for c in shown if c in kept]
        fitted = [_fit(title, rows, columns, width, console) for title, rows in groups]
        tables = [t for t in fitted if t is not None]
        if len(tables) == len(fitted) or len(kept) == 1:
            break
        dropped.append(kept.pop())
    parts: list[RenderableType] = []
    for i, table in enumerate(tables):
        parts += [Text(""), table] if i else [table]
    if all_ok:
        parts.append(Text(f"state: all {len(inventories)} healthy" + (", first-prefill smoke passed" if all(
            inv.smoke is not None for inv in inventories) else ""), style="dim"))
    if dropped:
        parts.append(Text(f"not shown at {width} columns: {', '.join(c.header for c in dropped)} "
                          "(--json has every field; a wider terminal or COLUMNS shows them)", style="dim"))
    if any(inv.capacity and inv.capacity.estimate for inv in inventories) and _KV_TOKENS in kept:
        parts.append(Text("~: no kv_cache_size_tokens label, num_gpu_blocks x block_size (wrong for hybrids)",
                          style="dim"))
    return Group(*parts)


def pressure_table(inventories: list[Inventory], diagnoses: dict[str, Diagnosis], window_s: float) -> Table:
    """The window's figures per server; the sentences are printed under it."""
    table = Table(title=f"KV pressure over {window_s:.0f} s, from each server's /metrics", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True,
                  caption="peaks over the window; for cap.: waiting for capacity (vllm:num_requests_waiting_by_reason)",
                  caption_justify="left")
    # short headers: the seven columns fit 80 with every number whole
    for header in ("server", "peak KV", "preempt/min", "waiting", "for cap.", "running", "prefix hits"):
        table.add_column(header, justify="left" if header == "server" else "right", no_wrap=True)
    for inv in inventories:
        diag = diagnoses.get(inv.url)
        if diag is None:
            continue
        w = diag.window
        table.add_row(
            escape(host_port(inv.url)), _num(w.peak_kv_usage, ".0%"),
            "-" if w.preemptions_per_min is None else f"{w.preemptions_per_min:.1f}",
            _num(w.peak_waiting), _num(w.peak_waiting_capacity), _num(w.peak_running),
            _num(w.prefix_cache_hit_rate, ".0%"))
    return table
