"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
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


def needle_table(summary: dict[str, Any]) -> Table:
    """needle.json as a table: per server counts and recall; per candidate the paired comparison
    (cases the reference hit and it missed / the reverse, recall drop with its interval, the bar)."""
    bar_max = next((p["bar"] for p in summary.get("paired", {}).values()), None)
    table = Table(title="needle retrieval (same cases on every server)", header_style="bold", box=box.SIMPLE_HEAD,
                  caption=None if bar_max is None else f"bar: recall drop at most {bar_max:g}")
    ref = summary["reference"]
    table.add_column("server", min_width=min(20, max(map(len, summary["servers"]), default=6)), overflow="fold")
    for col in ("hit/miss/\ntrunc/err", "recall", "lost/\ngained", "recall drop\n[95% CI]", "bar"):
        table.add_column(col, justify="left" if col == "bar" else "right", no_wrap=True)
    for name, row in summary["servers"].items():
        pair = summary.get("paired", {}).get(name)
        versus, drop, bar = ("(ref)", "-", "-") if name == ref else ("-", "-", "-")
        if pair is not None:
            versus = f"{len(pair['reference_hit_candidate_miss'])}/{len(pair['reference_miss_candidate_hit'])}"
            interval = pair.get("recall_drop")
            if interval is not None:
                drop = f"{interval['estimate']:+.2f} [{interval['lo']:.2f}, {interval['hi']:.2f}]"
            colour = {"pass": "green", "fail": "red"}.get(pair["outcome"], "yellow")
            bar = f"[{colour}]{pair['outcome']}[/{colour}]"
        counts = f"{row['hit']}/{row['miss']}/{row['truncated']}/{row['error']}"
        table.add_row(name, counts, _num(row.get("recall"), ".0%"), versus, drop, bar)
    return table


_STYLE = {"adopt": "green", "pass": "green", "reject": "red", "fail": "red", "inconclusive": "yellow",
          "no_gain": "dim", "not_measured": "dim", "invalid": "magenta", "broken": "bold red", "reference": "blue"}


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


_OUTCOME_STYLE = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]",
                  "inconclusive": "[yellow]inconclusive[/yellow]"}


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}%}"


def perplexity_table(summary: dict[str, Any]) -> Table:
    unit = summary.get("unit", "byte")
    n = len(summary.get("passages") or [])
    table = Table(title=f"Perplexity: {n} passages, {summary.get('crossed_chunk')} past one prefill chunk",
                  caption=f"delta: {unit} perplexity vs the reference, paired 95% CI over passages; "
                          f"bar {_pct(summary.get('bar'))}; noise: the reference's own run-to-run delta",
                  header_style="bold")
    for col in ("server", "bits/byte", "word ppl", "delta", "95% CI", "noise", "outcome"):
        table.add_column(col, justify="left" if col in ("server", "outcome") else "right")
    for name, row in summary.get("servers", {}).items():
        label = f"{name} (ref)" if name == summary.get("reference") else name
        if row.get("bits_per_byte") is None:
            table.add_row(label, "-", "-", "-", "-", "-", f"[red]{escape(row.get('error') or 'not measured')}[/red]")
            continue
        ci = row.get("ci95")
        noise = row.get("noise")
        table.add_row(
            label, f"{row['bits_per_byte']:.4f}", f"{row['word_perplexity']:.4g}", _pct(row.get("delta")),
            "-" if not ci else f"{ci[0]:+.2%}..{ci[1]:+.2%}", "-" if noise is None else f"{noise:.2%}",
            _OUTCOME_STYLE.get(row.get("outcome") or "", "-"),
        )
    return table


def agreement_table(summary: dict[str, Any]) -> Table:
    table = Table(title="Agreement with the reference on the same token positions",
                  caption="KL: reference || candidate over the top-k tokens plus one leftover bucket (nats); "
                          "|dlp|: largest logprob difference at a position",
                  header_style="bold")
    for col in ("server", "positions", "top-1", "KL mean", "KL p50", "KL p99", "KL max", "|dlp| p50",
                "|dlp| p99", "|dlp| max", "outcome"):
        table.add_column(col, justify="left" if col in ("server", "outcome") else "right")
    for name, row in summary.items():
        label = f"{name} (self)" if row.get("self") else name
        if not row.get("positions"):
            table.add_row(label, "0", *["-"] * 8, f"[red]{escape(row.get('error') or 'not measured')}[/red]")
            continue
        outs = row.get("outcome") or {}
        verdicts = " ".join(f"{k}:{_OUTCOME_STYLE.get(v, v)}" for k, v in outs.items()) or "-"
        table.add_row(
            label, f"{row['positions']:,}", f"{row['top1_agreement']:.1%}", f"{row['kl_mean']:.3g}",
            f"{row['kl_median']:.3g}", f"{row['kl_p99']:.3g}", f"{row['kl_max']:.3g}",
            f"{row['logprob_diff_median']:.3g}", f"{row['logprob_diff_p99']:.3g}", f"{row['logprob_diff_max']:.3g}",
            verdicts,
        )
    return table


def tasks_table(summary: dict[str, Any], bars: Any) -> Table:
    """The tasks probe's own table, printed when it ends (the verdict's tables judge the bars)."""
    table = Table(title="Task accuracy (lm-eval)", header_style="bold",
                  caption="drop: the reference's score minus the candidate's on the documents both answered "
                          "within the cap, paired 95% CI over documents")
    for col in ("task", "server", "score", "scored", "truncated", "drop", "95% CI", "McNemar p", "bar"):
        table.add_column(col, justify="left" if col in ("task", "server") else "right")
    for task, row in (summary.get("tasks") or {}).items():
        bar = bars.task_bar(task)
        for name, own in (row.get("servers") or {}).items():
            pair = (row.get("candidates") or {}).get(name) or {}
            ci = pair.get("ci95")
            score = own.get("accuracy")
            if own.get("error"):
                table.add_row(task, name, *["-"] * 6, f"[red]{escape(own['error'])}[/red]")
                continue
            table.add_row(task, name, "-" if score is None else f"{score:.3f}",
                          f"{own.get('scored')}/{own.get('documents')}", str(own.get("truncated")),
                          "-" if pair.get("drop") is None else f"{pair['drop']:+.3f}",
                          "-" if not ci else f"{ci[0]:+.3f}..{ci[1]:+.3f}",
                          "-" if pair.get("mcnemar_p") is None else f"{pair['mcnemar_p']:.2g}",
                          "-" if bar is None or name == summary.get("reference") else f"{bar:.3f}")
    return table


def print_wide(console: Console, table: Table) -> None:
    """Print a table on `console`; when that is not a terminal (a CI log, a pipe) use 160 columns, as
    `kvprobe eval` does for stdout, instead of rich's 80."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(file=console.file, width=160, color_system=None).print(table)


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


_LOAD_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow"}


def _ratio_cell(check: dict[str, Any] | None) -> str:
    if not check or check.get("ratio") is None:
        return "-"
    iv = check.get("interval")
    span = f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else ""
    style = _LOAD_STYLE.get(check["outcome"], "")
    return f"{check['ratio']:.2f}x{span} [{style}]{check['outcome']}[/{style}]"


def _failed(case: dict[str, Any]) -> str:
    """Errors, and streams cut off before [DONE] beside them: both are failed requests."""
    errors, cut = case.get("errors") or 0, case.get("incomplete") or 0
    text = f"{errors}" + (f"+{cut} cut" if cut else "")
    return f"[red]{text}[/red]" if errors or cut else "0"


def load_table(summary: dict[str, Any]) -> Table:
    """One row per server and case (throughput is the mean over runs, p99s over all requests); for
    candidates, ratios to the reference with their 95% intervals and outcome against the bars."""
    table = Table(title="load: concurrent agents (streamed chat)", header_style="bold")
    for col in ("server", "shape", "agents", "req", "err", "tok/s", "TTFT p99 ms", "ITL p99 ms", "E2E p99 ms",
                "KV max", "preempt", "tok/s vs ref", "TTFT p99 vs ref", "E2E p99 vs ref"):
        table.add_column(col, justify="left" if col in ("server", "shape") else "right")
    ref = summary["reference"]
    for name, server in summary["servers"].items():
        comps = {(c["shape"], c["agents"]): c for c in summary.get("comparisons", {}).get(name, {}).get("cases", [])}
        label = f"{name} (ref)" if name == ref else name
        if server.get("broken"):
            label += " [red]broken[/red]"
        for case in server["cases"]:
            comp = comps.get((case["shape"], case["agents"]))
            kv = case.get("kv_usage_max")
            table.add_row(
                label, case["shape"], str(case["agents"]), str(case["requests"]),
                _failed(case),
                _num(case.get("output_tokens_per_s"), ",.0f"), _ms(case.get("ttft_p99_s")),
                _ms(case.get("itl_p99_s")), _ms(case.get("e2e_p99_s")),
                "-" if kv is None else f"{kv:.1%}", _num(case.get("preemptions")),
                _ratio_cell(comp and comp["throughput"]), _ratio_cell(comp and comp["ttft_p99_s"]),
                _ratio_cell(comp and comp["e2e_p99_s"]),
            )
        if not server["cases"]:
            table.add_row(label, "-", "-", "0", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-")
    return table
