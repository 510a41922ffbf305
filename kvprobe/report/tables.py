"""What the report tables say, as plain strings: terminal, Markdown and HTML render the same rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvprobe.checks import natural_order, pct, runs_by_case  # the grouping and wording the decisions use
from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.report.platform_text import recorded_platform_text


@dataclass
class TableData:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str | None = None
    # Per row, a CSS/rich style key for the decision or outcome column (adopt, reject, pass, ...).
    tags: list[str | None] = field(default_factory=list)


def num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and fmt == ",":
        fmt = ",.4g"
    return format(value, fmt)


def interval(iv: list[float] | None, fmt: Any = pct) -> str:
    if not iv or None in iv:
        return "-"
    return f"[{fmt(iv[0])}, {fmt(iv[1])}]"


def knob_of(v: dict[str, Any]) -> str:
    return (v.get("pin") or {}).get("knob") or DEFAULT_KNOB


def knob_header(v: dict[str, Any]) -> str:
    """The column that shows what differs: the KV dtype by default, else the declared knob by name."""
    knob = knob_of(v)
    return "cache dtype" if knob == DEFAULT_KNOB else knob


def knob_value(v: dict[str, Any], name: str) -> str:
    """A server's value of the knob as the server reported it (older verdicts: its cache dtype)."""
    values = (v.get("pin") or {}).get("knob_values") or {}
    value = values.get(name) if name in values else (v["servers"].get(name) or {}).get("cache_dtype")
    return "-" if value is None else str(value)


def decisions_table(v: dict[str, Any]) -> TableData:
    t = TableData("Decisions", ["server", "role", knob_header(v), "KV tokens", "capacity", "decision", "why"])
    ref = v["reference"]
    for name in v["order"]:
        server = v["servers"].get(name) or {}
        if name == ref:
            t.rows.append([name, "reference", knob_value(v, name), num(server.get("kv_cache_tokens")),
                           "1.00x", "reference", "the gold standard every candidate is measured against"])
            t.tags.append("reference")
            continue
        d = v["decisions"].get(name) or {}
        ratio = d.get("capacity_ratio")
        t.rows.append([name, "candidate", knob_value(v, name), num(d.get("kv_cache_tokens")),
                       "-" if ratio is None else f"{ratio:.2f}x", d.get("decision", "-"),
                       (d.get("reasons") or ["-"])[0]])
        t.tags.append(d.get("decision"))
    return t


def bars_table(v: dict[str, Any]) -> TableData:
    t = TableData("Bars (fixed before the run)", ["bar", "value"])
    for key, value in sorted((v.get("bars") or {}).items()):
        t.rows.append([key, "not set" if value is None else str(value)])
        t.tags.append(None)
    return t


def servers_table(v: dict[str, Any]) -> TableData:
    t = TableData("Servers", ["server", "role", "status", "version", "platform", "model", "max_model_len",
                              "cache dtype", "KV tokens", "max concurrency", "smoke"])
    pin = v.get("pin") or {}
    platforms = pin.get("platforms") or {}  # what the one-knob check compared; absent in older verdicts
    for name in v["order"]:
        s = v["servers"].get(name) or {}
        tokens = num(s.get("kv_cache_tokens")) + (" (est.)" if s.get("kv_cache_tokens_estimate") else "")
        smoke = "-" if s.get("smoke_ok") is None else (
            f"ok ({num(s.get('smoke_prompt_tokens'))} tokens)" if s.get("smoke_ok") else "failed")
        t.rows.append([name, s.get("role") or "-", s.get("status") or "-", s.get("version") or "-",
                       recorded_platform_text(platforms, name), s.get("model") or "-", num(s.get("max_model_len")),
                       s.get("cache_dtype") or "-", tokens, num(s.get("max_concurrency"), ".1f"), smoke])
        t.tags.append("broken" if s.get("status") not in (None, "ok") else None)
    if pin:
        diffs = [d["text"] for d in pin.get("differences") or []]
        values = ", ".join(f"{n}={knob_value(v, n)}" for n in v["order"])
        t.note = ("One-knob check: " + (f"valid: the servers differ only in {knob_of(v)} ({values})"
                                         if pin.get("valid") else "INVALID: " + "; ".join(diffs)))
    return t


def perplexity_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("perplexity")
    if not probe:
        return None
    bar = (v.get("bars") or {}).get("perplexity_delta_max")
    t = TableData("Perplexity", ["server", "bits/byte", "word perplexity", "delta vs reference", "95% interval",
                                 "reference noise", "outcome"])
    checks = _checks_by(v, "perplexity_delta_max")
    for name in v["order"]:
        row = probe["servers"].get(name)
        if row is None:
            continue
        outcome = "reference" if name == v["reference"] else (checks.get(name) or [{}])[0].get("outcome", "-")
        t.rows.append([name, num(row.get("bits_per_byte"), ".4f"), num(row.get("word_perplexity"), ".3f"),
                       pct(row.get("delta")), interval(row.get("ci95")), pct(row.get("noise")), outcome])
        t.tags.append(outcome)
    t.note = f"Bar: relative perplexity rise at most {pct(bar, False)}; pass only when the whole interval is under it."
    return t


def agreement_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("agreement")
    if not probe:
        return None
    t = TableData("Agreement with the reference (top-k prompt logprobs)",
                  ["server", "KL mean", "KL p99", "top-1 agreement"])
    for name in v["order"]:
        row = probe["servers"].get(name)
        if row is None:
            continue
        t.rows.append([name, num(row.get("kl_mean"), ".5f"), num(row.get("kl_p99"), ".5f"),
                       "-" if row.get("top1_agreement") is None else f"{row['top1_agreement']:.2%}"])
        t.tags.append(None)
    return t


def needle_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("needle")
    if not probe:
        return None
    t = TableData("Needle retrieval", ["server", "hit", "miss", "truncated", "error", "recall", "vs reference"])
    checks = _checks_by(v, "needle_recall_drop_max")
    for name in v["order"]:
        row = (probe.get("servers") or {}).get(name)
        if row is None:
            continue
        check = (checks.get(name) or [{}])[0]
        versus = "reference" if name == v["reference"] else (
            f"drop {check['value']:+.2f} {interval(check.get('interval'), lambda x: f'{x:+.2f}')}: {check['outcome']}"
            if check.get("value") is not None else check.get("outcome", "-"))
        t.rows.append([name, num(row.get("hit")), num(row.get("miss")), num(row.get("truncated")),
                       num(row.get("error")), "-" if row.get("recall") is None else f"{row['recall']:.0%}", versus])
        t.tags.append(None if name == v["reference"] else check.get("outcome"))
    return t


def tasks_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("tasks")
    if not probe:
        return None
    t = TableData("Task accuracy (lm-eval)", ["task", "server", "metric", "score", "scored", "truncated",
                                              "drop vs reference", "95% interval", "McNemar p", "outcome"])
    checks = {(name, c.get("case")): c for name, cs in _checks_by(v, "task_accuracy_drop_max").items() for c in cs}
    for task, row in sorted((probe.get("tasks") or {}).items()):
        for name in v["order"]:
            own = (row.get("servers") or {}).get(name)
            if own is None:
                continue
            pair = (row.get("candidates") or {}).get(name) or {}
            check = checks.get((name, task)) or {}
            outcome = "reference" if name == v["reference"] else check.get("outcome", "-")
            score = own.get("accuracy")
            t.rows.append([task, name, str(row.get("metric") or "-"), "-" if score is None else f"{score:.3f}",
                           f"{num(own.get('scored'))}/{num(own.get('documents'))}", num(own.get("truncated")),
                           "-" if pair.get("drop") is None else f"{pair['drop']:+.3f}",
                           interval(pair.get("ci95"), lambda x: f"{x:+.3f}"),
                           "-" if pair.get("mcnemar_p") is None else f"{pair['mcnemar_p']:.2g}", outcome])
            t.tags.append(None if name == v["reference"] else check.get("outcome"))
    t.note = ("Drop: the reference's score minus the candidate's on the documents both answered within the "
              "answer cap (paired bootstrap over documents); an answer the cap cut is counted apart, not as wrong.")
    return t


def power_table(v: dict[str, Any]) -> TableData | None:
    """Per measured check: how large an effect this run could see, and for an inconclusive one the
    size that would settle it (kvprobe.power)."""
    t = TableData("Power: what this run could detect", ["candidate", "bar", "case", "n", "smallest detectable",
                                                         "limit", "outcome", "to settle it"])
    for name, d in v["decisions"].items():
        for c in d.get("checks") or []:
            block = c.get("power")
            if not block:
                continue
            fmt = _effect_format(c["bar"])
            detectable = block.get("detectable")
            needed = block.get("needed")
            settle = ("-" if c["outcome"] != "inconclusive" else
                      f"about {needed:,} {block['unit']}" if needed is not None else "no size (on the bar)")
            t.rows.append([name, c["bar"], c.get("case") or "-", f"{block['n']:,} {block['unit']}",
                           "-" if detectable is None else fmt(detectable),
                           "-" if c.get("limit") is None else fmt(c["limit"]), c["outcome"], settle])
            t.tags.append("inconclusive" if detectable is not None and c.get("limit") is not None
                          and detectable > c["limit"] else None)
    if not t.rows:
        return None
    t.note = ("Smallest detectable: a true loss this large is caught 80% of the time (one-sided alpha 0.05) at "
              "this run's size and spread; larger than the limit (marked) means a pass here cannot rule out a "
              "loss as big as the bar. To settle it: the size at which the 95% interval clears the bar with that "
              "power, if the estimate holds.")
    return t


def _effect_format(bar: str) -> Any:
    """Drops of recall or accuracy are absolute; perplexity and speed bars are relative (%)."""
    if bar in ("needle_recall_drop_max", "task_accuracy_drop_max", "kl_mean_max", "top1_agreement_min"):
        return lambda x: f"{x:.3f}"
    return lambda x: pct(x, False)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def load_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("load")
    if not probe:
        return None
    t = TableData("Load (mean over repeated runs)", ["server", "case", "runs", "requests", "errors", "output tok/s",
                                                       "TTFT p99", "ITL p99", "E2E p99", "KV usage max",
                                                       "preemptions"])
    for name in v["order"]:
        groups = runs_by_case(((probe.get("servers") or {}).get(name) or {}).get("cases") or [])
        for key in sorted(groups, key=natural_order):
            rows = groups[key]

            def m(field_name: str, rows: list[dict[str, Any]] = rows) -> float | None:
                return _mean([float(r[field_name]) for r in rows if isinstance(r.get(field_name), int | float)])

            def s(x: float | None) -> str:
                return "-" if x is None else f"{x:.3f}s"

            errors = sum(int(r.get("errors") or 0) for r in rows)
            cut = sum(int(r.get("incomplete") or 0) for r in rows)
            failed = str(errors) + (f" (+{cut} cut off)" if cut else "")
            t.rows.append([name, " ".join(key), str(len(rows)), num(sum(int(r.get("requests") or 0) for r in rows)),
                           failed, num(m("output_tokens_per_s"), ".1f"), s(m("ttft_p99_s")), s(m("itl_p99_s")),
                           s(m("e2e_p99_s")), "-" if m("kv_usage_max") is None else f"{m('kv_usage_max'):.1%}",
                           num(m("preemptions"), ".0f")])
            t.tags.append("broken" if errors or cut else None)
    return t


def fill_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("fill")
    if not probe:
        return None
    t = TableData("Fill: new tokens served against the claimed KV capacity",
                  ["server", "claimed tokens", "served tokens", "of claimed", "requests", "result"])
    for name in v["order"]:
        row = (probe.get("servers") or {}).get(name)
        if not row:
            continue
        share = row.get("fraction_of_claimed")
        result = {True: "held", False: f"died: {row.get('error')}", None: row.get("rejected") or row.get("error")
                  or "not tested"}[row.get("survived")]
        t.rows.append([name, num(row.get("claimed_tokens")), num(row.get("served_tokens")),
                       "-" if share is None else f"{share:.0%}", num(row.get("requests")), str(result)])
        t.tags.append("broken" if row.get("survived") is False else None)
    return t


def checks_table(v: dict[str, Any]) -> TableData:
    t = TableData("Every check", ["candidate", "bar", "case", "value", "interval", "limit", "outcome", "detail"])
    for name, d in v["decisions"].items():
        for c in d.get("checks") or []:
            t.rows.append([name, c["bar"], c.get("case") or "-", pct(c.get("value")), interval(c.get("interval")),
                           "-" if c.get("limit") is None else str(c["limit"]), c["outcome"], c["text"]])
            t.tags.append(c["outcome"])
    return t


def probes_table(v: dict[str, Any]) -> TableData:
    t = TableData("Probes", ["probe", "status"])
    for probe, status in (v.get("probes_status") or {}).items():
        t.rows.append([probe, status])
        t.tags.append(None if status == "ran" else "inconclusive")
    return t


def _checks_by(v: dict[str, Any], bar: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, d in v["decisions"].items():
        out[name] = [c for c in d.get("checks") or [] if c["bar"] == bar]
    return out


def left_out_table(v: dict[str, Any]) -> TableData | None:
    """Servers meant for the comparison that never started (the demo's fp8 on an AVX2-only CPU)."""
    rows = (v.get("run") or {}).get("left_out") or []
    if not rows:
        return None
    return TableData("Left out", ["server", "why"], [[str(r.get("name")), str(r.get("reason"))] for r in rows],
                     note="not started, so not measured: no decision is made for these servers")


def all_tables(v: dict[str, Any]) -> list[TableData]:
    tables = [decisions_table(v), left_out_table(v), servers_table(v), perplexity_table(v), agreement_table(v),
              needle_table(v), tasks_table(v), load_table(v), fill_table(v), power_table(v), checks_table(v),
              bars_table(v), probes_table(v)]
    return [t for t in tables if t is not None]
