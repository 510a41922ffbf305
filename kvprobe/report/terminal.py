"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvprobe.checks import case_key
from kvprobe.inventory import Inventory
from kvprobe.load import spec_decode
from kvprobe.report import cells
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


def print_wide(console: Console, table: Table) -> None:
    """Print a table on `console`; when that is not a terminal (a CI log, a pipe) use 160 columns, as
    `kvprobe eval` does for stdout, instead of rich's 80."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(file=console.file, width=160, color_system=None).print(table)


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


def _failed(case: dict[str, Any]) -> str:
    """Errors, and streams cut off before [DONE] beside them: both are failed requests."""
    errors, cut = case.get("errors") or 0, case.get("incomplete") or 0
    text = f"{errors}" + (f"+{cut} cut" if cut else "")
    return f"[red]{text}[/red]" if errors or cut else "0"


# -- live tables: printed as each probe ends, with the checks the verdict will carry -------------
#
# Each takes the probe's summary (its own numbers) and `checks`, {candidate: [check]} from
# kvprobe.checks.live_checks on that summary: every value, interval and outcome shown for a
# candidate is the check's, so the table printed mid-run says what the signed verdict will say.

Checks = dict[str, list[dict[str, Any]]]


def _judged(check: dict[str, Any] | None) -> str:
    """The check's outcome word, coloured."""
    word = cells.outcome_word(check)
    style = _STYLE.get(check["outcome"] if check else "")
    return f"[{style}]{escape(word)}[/{style}]" if style else escape(word)


def _estimate(check: dict[str, Any] | None) -> str:
    """Value [95% interval] outcome, as one cell."""
    if not check:
        return "-"
    shown = cells.estimate_text(check)
    return _judged(check) if shown == "-" else f"{escape(shown)} {_judged(check)}"


def _first(checks: Checks, bar: str) -> dict[str, Any] | None:
    """Any candidate's check of `bar`: what every candidate's shares (its limit, the reference's noise)."""
    return next((c for cs in checks.values() if (c := cells.find(cs, bar)) is not None), None)


def _limits(checks: Checks, bar: str) -> str:
    """The bar as the checks applied it."""
    check = _first(checks, bar)
    return "not set" if check is None else cells.limit_text(check)


def _error_cell(row: dict[str, Any]) -> str:
    return f"[red]{escape(row.get('error') or 'not measured')}[/red]"


def perplexity_table(summary: dict[str, Any], checks: Checks) -> Table:
    """Per server its own perplexities; per candidate the perplexity check's delta, interval, the
    reference noise it used and its outcome."""
    unit = summary.get("unit", "byte")
    ref = summary.get("reference")
    n = len(summary.get("passages") or [])
    bar = "perplexity_delta_max"
    first = _first(checks, bar)
    table = Table(title=f"Perplexity: {n} passages, {summary.get('crossed_chunk')} past one prefill chunk",
                  caption=f"delta: {unit} perplexity vs the reference, the check's 95% interval over passages; "
                          f"bar {_limits(checks, bar)}; noise: the reference's own run-to-run delta, as the check "
                          "measured it", header_style="bold")
    for col in ("server", "bits/byte", "word ppl", "delta", "95% interval", "noise", "outcome"):
        table.add_column(col, justify="left" if col in ("server", "outcome") else "right")
    for name, row in (summary.get("servers") or {}).items():
        label = f"{name} (ref)" if name == ref else name
        if row.get("bits_per_byte") is None:
            table.add_row(label, "-", "-", "-", "-", "-", _error_cell(row))
            continue
        own = (f"{row['bits_per_byte']:.4f}", _num(row.get("word_perplexity"), ".4g"))
        if name == ref:
            noise = cells.noise_text((first or {}).get("noise"))
            table.add_row(label, *own, "-", "-", noise, "[blue]reference[/blue]")
            continue
        check = cells.find(checks.get(name) or [], bar)
        shown = check or {}
        table.add_row(label, *own, cells.value_text(bar, shown.get("value")), cells.interval_text(shown),
                      cells.noise_text(shown.get("noise")), _judged(check))
    return table


_AGREEMENT_SHORT = {"kl_mean_max": "KL", "top1_agreement_min": "top-1"}


def agreement_table(summary: dict[str, Any], checks: Checks) -> Table:
    """Per server the pooled agreement numbers; per candidate its agreement checks (the bars are
    optional: unset, there is no check and the column says so)."""
    table = Table(title="Agreement with the reference on the same token positions",
                  caption="KL: reference || candidate over the top-k tokens plus one leftover bucket (nats); "
                          "|dlp|: largest logprob difference at a position; checks: the 95% interval over passages "
                          "against the bar",
                  header_style="bold")
    for col in ("server", "positions", "top-1", "KL mean", "KL p50", "KL p99", "KL max", "|dlp| p50",
                "|dlp| p99", "|dlp| max", "checks"):
        table.add_column(col, justify="left" if col in ("server", "checks") else "right")
    for name, row in summary.items():
        label = f"{name} (self)" if row.get("self") else name
        if not row.get("positions"):
            table.add_row(label, "0", *["-"] * 8, _error_cell(row))
            continue
        mine = [c for c in checks.get(name) or [] if c.get("bar") in _AGREEMENT_SHORT]
        judged = "\n".join(f"{_AGREEMENT_SHORT[c['bar']]} {escape(cells.interval_text(c))} {_judged(c)}"
                           for c in mine)
        table.add_row(
            label, f"{row['positions']:,}", f"{row['top1_agreement']:.1%}", f"{row['kl_mean']:.3g}",
            f"{row['kl_median']:.3g}", f"{row['kl_p99']:.3g}", f"{row['kl_max']:.3g}",
            f"{row['logprob_diff_median']:.3g}", f"{row['logprob_diff_p99']:.3g}", f"{row['logprob_diff_max']:.3g}",
            "-" if row.get("self") or name not in checks else judged or "no bar set",
        )
    return table


def needle_table(summary: dict[str, Any], checks: Checks) -> Table:
    """Per server its counts and recall; per candidate both needle checks: the recall drop (every
    planned case, a cut or failed answer scored as a miss) and the rise in answers cut at the cap."""
    recall_bar, cut_bar = "needle_recall_drop_max", "truncation_rise_max"
    table = Table(title="needle retrieval (same cases on every server)", header_style="bold", box=box.SIMPLE_HEAD,
                  caption=f"bars: recall drop at most {_limits(checks, recall_bar)}, rise in answers cut at the "
                          f"cap at most {_limits(checks, cut_bar)}; paired case by case, a cut or failed answer "
                          "scores as a miss")
    ref = summary["reference"]
    table.add_column("server", min_width=min(20, max(map(len, summary["servers"]), default=6)), overflow="fold")
    for col in ("hit/miss/\ncut/err", "recall", "lost/\ngained", "recall drop [95% CI]", "cut at cap rise [95% CI]"):
        table.add_column(col, justify="right" if "/" in col or col == "recall" else "left")
    for name, row in summary["servers"].items():
        counts = f"{row['hit']}/{row['miss']}/{row['truncated']}/{row['error']}"
        if name == ref:
            table.add_row(name, counts, _num(row.get("recall"), ".0%"), "(ref)", "-", "-")
            continue
        mine = checks.get(name) or []
        recall = cells.find(mine, recall_bar)
        versus = "-" if not recall or recall.get("lost") is None else f"{recall['lost']}/{recall['gained']}"
        table.add_row(name, counts, _num(row.get("recall"), ".0%"), versus, _estimate(recall),
                      _estimate(cells.find(mine, cut_bar)))
    return table


def tasks_table(summary: dict[str, Any], checks: Checks) -> Table:
    """Per task and server its own score and cut answers; per candidate both task checks: the score
    drop (a cut answer scores as wrong) and the rise in answers cut at the cap."""
    table = Table(title="Task accuracy (lm-eval)", header_style="bold",
                  caption="score: each server's own, on the answers it finished within the cap; drop and cut "
                          "rise: the checks, paired document by document with the reference (a cut answer "
                          "scores as wrong), 95% interval")
    for col in ("task", "server", "score", "scored", "cut", "drop [95% CI]", "McNemar p", "cut rise [95% CI]"):
        table.add_column(col, justify="left" if col in ("task", "server") or "[" in col else "right")
    ref = summary.get("reference")
    for task, row in (summary.get("tasks") or {}).items():
        for name, own in (row.get("servers") or {}).items():
            if own.get("error"):
                table.add_row(task, name, *["-"] * 5, _error_cell(own))
                continue
            score = own.get("accuracy")
            numbers = ("-" if score is None else f"{score:.3f}", f"{own.get('scored')}/{own.get('documents')}",
                       str(own.get("truncated")))
            if name == ref:
                table.add_row(task, f"{name} (ref)", *numbers, "-", "-", "-")
                continue
            mine = checks.get(name) or []
            drop = cells.find(mine, "task_accuracy_drop_max", case=task)
            p = (drop or {}).get("mcnemar_p")
            table.add_row(task, name, *numbers, _estimate(drop), "-" if p is None else f"{p:.2g}",
                          _estimate(cells.find(mine, "truncation_rise_max", case=task)))
    return table


# The load checks of one case, by metric (kvprobe.checks.speed names them so), and their short names.
_LOAD_METRICS = (("throughput_drop_max", "throughput drop", "tok/s"), ("p99_latency_rise_max", "TTFT p99 rise", "TTFT"),
                 ("p99_latency_rise_max", "ITL p99 rise", "ITL"), ("p99_latency_rise_max", "E2E p99 rise", "E2E"))


def _ratio(check: dict[str, Any] | None) -> str:
    """A speed check's ratio to the reference with its interval, and its outcome coloured."""
    if not check:
        return "-"
    text = cells.ratio_text(check)
    word = cells.outcome_word(check)
    return escape(text.removesuffix(word)) + _judged(check)


def _versus(checks: list[dict[str, Any]], case: str) -> str:
    """One line per speed check of a case: p99 TTFT, ITL and E2E are one bar, named apart."""
    lines = [f"{short} {_ratio(cells.find(checks, bar, case, metric))}" for bar, metric, short in _LOAD_METRICS]
    return "\n".join(lines)


_SPEC_CAPTION = ("; spec accept: accepted / drafted tokens over the case (vLLM's spec_decode counters) and "
                 "tokens per step (1 + accepted per draft), shown, not judged")


def load_table(summary: dict[str, Any], checks: Checks) -> Table:
    """One row per server and case (throughput is the mean over runs, p99s over all requests); for
    candidates, each speed check's ratio to the reference with its 95% interval and its outcome. Beside
    tok/s, draft acceptance when a server decodes speculatively (no column when none does)."""
    spec = spec_decode.any_recorded(c for s in summary["servers"].values() for c in s["cases"])
    table = Table(title="load: concurrent agents (streamed chat)", header_style="bold", box=box.SIMPLE_HEAD,
                  caption=f"vs ref: candidate / reference, the check's 95% interval; bars: throughput drop at most "
                          f"{_limits(checks, 'throughput_drop_max')}, p99 rise at most "
                          f"{_limits(checks, 'p99_latency_rise_max')}; not judged: the client could have moved "
                          "the case's numbers (client-limited), so the check is inconclusive"
                          + (_SPEC_CAPTION if spec else ""))
    for col in ("server", "shape", "agents", "req", "err", "tok/s", *(["spec accept"] if spec else []),
                "TTFT p99\nms", "ITL p99\nms", "E2E p99\nms", "KV max", "preempt", "vs ref: ratio [95% CI]"):
        table.add_column(col, justify="left" if col in ("server", "shape") or "vs ref" in col else "right")
    ref = summary["reference"]
    for name, server in summary["servers"].items():
        mine = checks.get(name) or []
        label = f"{name} (ref)" if name == ref else name
        if server.get("broken"):
            label += " [red]broken[/red]"
        for case in server["cases"]:
            kv = case.get("kv_usage_max")
            table.add_row(
                label, str(case.get("shape")), str(case["agents"]), str(case["requests"]), _failed(case),
                _num(case.get("output_tokens_per_s"), ",.0f"), *([spec_decode.shown(case)] if spec else []),
                _ms(case.get("ttft_p99_s")), _ms(case.get("itl_p99_s")), _ms(case.get("e2e_p99_s")),
                "-" if kv is None else f"{kv:.1%}", _num(case.get("preemptions")),
                "-" if name == ref else _versus(mine, " ".join(case_key(case))),
            )
        if not server["cases"]:
            # a candidate with no case still has its checks: not measured, and why is in their text
            judged = "-" if name == ref or not mine else _judged(mine[0])
            table.add_row(label, "-", "-", "0", *["-"] * (8 if spec else 7), judged)
    return table
