"""What the report tables say, as plain strings: terminal, Markdown and HTML render the same rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.load import spec_decode
from kvprobe.report import cells
from kvprobe.report.platform_text import recorded_platform_text
from kvprobe.verdict.checks import natural_order, runs_by_case  # load cases grouped and ordered as the checks do


@dataclass
class TableData:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str | None = None
    # Per row, a CSS/rich style key for the decision or outcome column (adopt, reject, pass, ...).
    tags: list[str | None] = field(default_factory=list)
    # For a narrow terminal (kvprobe.report.text_table): how many leading columns name a row (repeated when
    # the table continues under itself), and the free-text columns that may go under the table.
    keys: int = 1
    prose: tuple[str, ...] = ()


def num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and fmt == ",":
        fmt = ",.4g"
    return format(value, fmt)


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
    t = TableData("Decisions", ["server", "role", knob_header(v), "KV tokens", "capacity", "decision", "why"],
                  prose=("why",))
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
                              "cache dtype", "KV tokens", "max concurrency", "smoke"], prose=("platform",))
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
        backends = pin.get("attention_backends") or {}  # absent in older verdicts
        if backends:
            t.note += ". Attention backend: " + ", ".join(f"{n} {backends.get(n, '-')}" for n in v["order"])
            if "not exposed" in backends.values():
                t.note += (" (vLLM logs the backend it resolves but does not serve it: declare attention_backend "
                           "per server in servers.toml)")
    return t


def _checks_of(v: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return ((v.get("decisions") or {}).get(name) or {}).get("checks") or []


_SEVERITY = ("fail", "inconclusive", "not_measured", "pass")


def _worst(*checks: dict[str, Any] | None) -> str | None:
    """The row's tag: its most serious outcome (the outcome cell that shows it is coloured)."""
    outcomes = [c["outcome"] for c in checks if c]
    return min(outcomes, key=lambda o: _SEVERITY.index(o) if o in _SEVERITY else len(_SEVERITY), default=None)


def _outcome(check: dict[str, Any] | None) -> str:
    return check["outcome"] if check else "-"


def perplexity_table(v: dict[str, Any]) -> TableData | None:
    """Per server its perplexities; per candidate the perplexity check's delta, interval, the
    reference noise it used and its outcome."""
    probe = (v.get("probes") or {}).get("perplexity")
    if not probe:
        return None
    bar = "perplexity_delta_max"
    t = TableData("Perplexity", ["server", "bits/byte", "word perplexity", "delta vs reference", "95% interval",
                                 "reference noise", "outcome"])
    servers = probe.get("servers") or {}
    checks = {name: cells.find(_checks_of(v, name), bar) for name in v["order"]}
    # rules/3: the noise the check used (the reference's); rules/2: the figure the probe recorded.
    ref_noise = next((c["noise"] for c in checks.values() if c and c.get("noise")), None)
    for name in v["order"]:
        row = servers.get(name)
        if row is None:
            continue
        own = [name, num(row.get("bits_per_byte"), ".4f"), num(row.get("word_perplexity"), ".3f")]
        if name == v["reference"]:
            noise = ref_noise if ref_noise is not None else row.get("noise")
            t.rows.append([*own, "-", "-", cells.noise_text(noise), "reference"])
            t.tags.append("reference")
            continue
        check = checks.get(name) or {}
        t.rows.append([*own, *cells.figure(check),
                       cells.noise_text(check.get("noise", row.get("noise"))), _outcome(check or None)])
        t.tags.append(check.get("outcome"))
    limit = (v.get("bars") or {}).get(bar)
    t.note = (f"Bar: relative perplexity rise at most {cells.value_text(bar, limit, False)}; pass only when the "
              "whole 95% interval is under it. Reference noise: the reference's own run-to-run delta as the check "
              "measured it (deterministic: its repeated runs were bit-identical).")
    return t


_AGREEMENT_BARS = ("kl_mean_max", "top1_agreement_min")


def agreement_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("agreement")
    if not probe:
        return None
    t = TableData("Agreement with the reference (top-k prompt logprobs)",
                  ["server", "KL mean", "KL p99", "top-1 agreement", "checks"], prose=("checks",))
    for name in v["order"]:
        row = probe["servers"].get(name)
        if row is None:
            continue
        mine = [c for c in _checks_of(v, name) if c.get("bar") in _AGREEMENT_BARS]
        judged = "; ".join(f"{cells.label(c)} {cells.estimate_text(c)} vs bar {cells.limit_text(c)}: {c['outcome']}"
                           for c in mine)
        t.rows.append([name, num(row.get("kl_mean"), ".5f"), num(row.get("kl_p99"), ".5f"),
                       "-" if row.get("top1_agreement") is None else f"{row['top1_agreement']:.2%}",
                       "reference" if name == v["reference"] else judged or "no bar set"])
        t.tags.append("reference" if name == v["reference"] else _worst(*mine))
    return t


def needle_table(v: dict[str, Any]) -> TableData | None:
    """Per server its counts and recall; per candidate the recall-drop check and the check on the
    rise in answers cut at the cap."""
    probe = (v.get("probes") or {}).get("needle")
    if not probe:
        return None
    t = TableData("Needle retrieval", ["server", "hit", "miss", "cut at the cap", "error", "recall",
                                       "recall drop [95% interval]", "outcome",
                                       "rise in answers cut [95% interval]", "outcome"])
    for name in v["order"]:
        row = (probe.get("servers") or {}).get(name)
        if row is None:
            continue
        own = [name, num(row.get("hit")), num(row.get("miss")), num(row.get("truncated")), num(row.get("error")),
               "-" if row.get("recall") is None else f"{row['recall']:.0%}"]
        if name == v["reference"]:
            t.rows.append([*own, "-", "reference", "-", "-"])
            t.tags.append("reference")
            continue
        mine = _checks_of(v, name)
        recall, cut = cells.find(mine, "needle_recall_drop_max"), cells.find(mine, "truncation_rise_max")
        t.rows.append([*own, cells.estimate_text(recall), _outcome(recall), cells.estimate_text(cut), _outcome(cut)])
        t.tags.append(_worst(recall, cut))
    t.note = ("Recall: each server's own, hit / (hit + miss). Recall drop: the check's, paired case by case with "
              "the reference over every planned needle (an answer cut at the cap or failed scores as a miss); "
              "rise in answers cut: the paired rise in needle answers the cap cut, its own bar. A rules/2 verdict "
              "has no check on the cut answers (-).")
    return t


def tasks_table(v: dict[str, Any]) -> TableData | None:
    """Per task and server its own score; per candidate the task's drop check and its check on the
    rise in answers cut at the cap."""
    probe = (v.get("probes") or {}).get("tasks")
    if not probe:
        return None
    t = TableData("Task accuracy (lm-eval)", ["task", "server", "metric", "score", "scored", "cut at the cap",
                                              "drop [95% interval]", "McNemar p", "outcome",
                                              "rise in answers cut [95% interval]", "outcome"], keys=2)
    for task, row in sorted((probe.get("tasks") or {}).items()):
        for name in v["order"]:
            own = (row.get("servers") or {}).get(name)
            if own is None:
                continue
            score = own.get("accuracy")
            numbers = [task, name, str(row.get("metric") or "-"), "-" if score is None else f"{score:.3f}",
                       f"{num(own.get('scored'))}/{num(own.get('documents'))}", num(own.get("truncated"))]
            if name == v["reference"]:
                t.rows.append([*numbers, "-", "-", "reference", "-", "-"])
                t.tags.append("reference")
                continue
            mine = _checks_of(v, name)
            drop = cells.find(mine, "task_accuracy_drop_max", case=task)
            cut = cells.find(mine, "truncation_rise_max", case=task)
            p = (drop or {}).get("mcnemar_p")
            t.rows.append([*numbers, cells.estimate_text(drop), "-" if p is None else f"{p:.2g}", _outcome(drop),
                           cells.estimate_text(cut), _outcome(cut)])
            t.tags.append(_worst(drop, cut))
    t.note = ("Score: each server's own, on the answers it finished within the cap. Drop: the check's, the "
              "reference's score minus the candidate's paired document by document (rules/3: an answer cut at the "
              "cap scores as wrong; rules/2 verdicts left those documents out). Rise in answers cut: the paired "
              "rise in answers the cap cut, its own bar.")
    return t


def power_table(v: dict[str, Any]) -> TableData | None:
    """One row per measured check, named by its metric and case: how large a true loss this run
    passes and fails with power 0.8, and for an inconclusive check what would settle it
    (kvprobe.stats.power). A rules/2 check's figures go in the columns they fit, the rest is '-'."""
    t = TableData("Power: what this run can pass and fail", ["candidate", "check", "n", "se", "passes at most",
                                                             "fails at least", "limit", "outcome", "to settle it"],
                  keys=2, prose=("to settle it",))
    blocks = []
    for name, d in v["decisions"].items():
        for c in d.get("checks") or []:
            seq = c.get("sequential")
            if seq and seq.get("look"):  # a speed endpoint: the sequential design's own figures
                look = seq["look"]
                t.rows.append([name, cells.label(c), f"{seq['blocks']} blocks", cells.log_se_text(look["se"]), "-", "-",
                               cells.limit_text(c), c["outcome"], cells.sequential_settle(c)])
                t.tags.append(c["outcome"])
                continue
            block = c.get("power")
            if not block:
                continue
            blocks.append(block)
            t.rows.append([name, cells.label(c), f"{block['n']:,} {block['unit']}", cells.se_text(c),
                           cells.power_size(c, "passes_at_most"), cells.power_size(c, "fails_at_least"),
                           cells.limit_text(c), c["outcome"], cells.settle_text(c)])
            t.tags.append(c["outcome"])
    if not t.rows:
        return None
    t.note = _power_note(blocks)
    return t


def _power_note(blocks: list[dict[str, Any]]) -> str:
    """What the Power columns mean, with the test's own alpha and power as the checks recorded them."""
    new = next((b for b in blocks if "alpha_one_sided" in b), None)
    alpha, power = (new or {}).get("alpha_one_sided", 0.025), (new or {}).get("power", 0.8)
    note = (f"Each bar is a one-sided test at {alpha:.1%} against the bar (the 95% interval's end), each way. "
            f"Passes at most: the largest true loss this run passes with power {power:g}; fails at least: the "
            f"smallest it fails with power {power:g} (at this run's size and spread; negative: even a candidate "
            "equal to the reference would likely not pass). se: the standard error of the check's estimate (speed: "
            "of the log ratio, where its interval is built, shown as the share it moves the ratio by). To settle it "
            "(inconclusive checks): the size at which "
            "a candidate equal to the reference would pass every gating check of its family together with power "
            f"{power:g}, with its range over the spread's own uncertainty (a run already that large: the estimate, "
            "not the size, holds it back); a client-limited speed check is settled by a quieter client, not by more "
            "runs. A speed endpoint is decided by its group-sequential design instead: n is its paired blocks, "
            "and what would settle it is the blocks at which a candidate at its current estimate would settle with "
            "power 0.8 (kvprobe.rules/4 quoted even odds).")
    if any("detectable" in b for b in blocks):
        note += (" Written under kvprobe.rules/2: its power figures were a size detectable against 0, not against "
                 "the bar, so passes/fails at most are not recorded (-).")
    return note


def load_table(v: dict[str, Any]) -> TableData | None:
    """Per server and case its own numbers (means over its runs); the speed checks are in speed_table.
    Beside output tok/s, draft acceptance where a server decodes speculatively (no column when none does)."""
    probe = (v.get("probes") or {}).get("load")
    if not probe:
        return None
    groups = {name: runs_by_case(((probe.get("servers") or {}).get(name) or {}).get("cases") or [])
              for name in v["order"]}
    spec = spec_decode.any_recorded(r for by_case in groups.values() for rows in by_case.values() for r in rows)
    t = TableData("Load (mean over repeated runs)", ["server", "case", "runs", "requests", "errors", "output tok/s",
                                                       *(["spec accept"] if spec else []), "TTFT p99", "ITL p99",
                                                       "E2E p99", "KV usage max", "preemptions"], keys=2)
    for name, by_case in groups.items():
        for key in sorted(by_case, key=natural_order):
            rows = by_case[key]
            t.rows.append([name, " ".join(key), *_load_numbers(rows, spec)])
            t.tags.append("broken" if any(r.get("errors") or r.get("incomplete") for r in rows) else None)
    notes = [_sizing_note(probe)]
    if spec:
        notes.append("spec accept: accepted / drafted tokens over the case's runs (vLLM's spec_decode counters, a "
                     "ratio of sums) and tokens per step (1 + accepted per draft); shown beside speed, not judged.")
    t.note = " ".join(n for n in notes if n) or None
    return t


def _sizing_note(probe: dict[str, Any]) -> str | None:
    """The case length the pilot chose and how much of the probe's time measured something."""
    parts = []
    sizing = probe.get("sizing") or {}
    if sizing:
        pilot = sizing.get("pilot") or {}
        length = ("the default size" if sizing.get("duration_s") is None
                  else f"{sizing['duration_s']:.1f} s ({sizing.get('multiplier', 0):g}x the pilot's)")
        power, likely = sizing.get("p_pass_equal"), sizing.get("p_pass_equal_at_pilot")
        said = ""
        if isinstance(likely, int | float) and isinstance(power, int | float):
            said = (f", P(an equal candidate passes) ~ {likely:.2f} at the pilot's noise ({power:.2f} at its upper "
                    "limit)")
        elif isinstance(power, int | float):
            said = f", P(an equal candidate passes) ~ {power:.2f}"
        parts.append(f"Cases of {length}, planned from a {pilot.get('blocks', '?')}-block pilot "
                     f"({pilot.get('case_s', 0):.1f} s a case); {sizing.get('max_blocks')} blocks planned{said}.")
    duty = probe.get("duty_cycle")
    if isinstance(duty, int | float):
        parts.append(f"Duty cycle {duty:.0%}: measured case time over the load probe's wall time.")
    return " ".join(parts) or None


# The speed checks of one load case, by bar and metric (both rules name them so).
_LOAD_CHECKS = (("throughput_drop_max", "throughput drop"), ("p99_latency_rise_max", "TTFT p99 rise"),
                ("p99_latency_rise_max", "ITL p99 rise"), ("p99_latency_rise_max", "E2E p99 rise"))


def speed_table(v: dict[str, Any]) -> TableData | None:
    """Per candidate and load case, each speed check: the candidate/reference ratio with its 95%
    interval and the check's outcome (client-limited: not judged)."""
    if not (v.get("probes") or {}).get("load"):
        return None
    t = TableData("Speed against the reference", ["candidate", "case", "output tok/s", "TTFT p99", "ITL p99",
                                                  "E2E p99"], keys=2)
    for name in v["decisions"]:
        mine = [c for c in _checks_of(v, name) if c.get("probe") == "load"]
        for case in dict.fromkeys(c.get("case") for c in mine):
            here = [c for c in mine if c.get("case") == case]
            # a case-less check stands for the whole probe (not measured): one per bar, no metric to match
            found = [cells.find(here, bar, case, metric if case is not None else None) for bar, metric in _LOAD_CHECKS]
            primary = case is None and any(str(c.get("id", "")).startswith("load.endpoint.") for c in here)
            label = case or ("primary endpoint" if primary else "-")
            t.rows.append([name, label, *(cells.ratio_text(c) for c in found)])
            t.tags.append(_worst(*found))
    if not t.rows:
        return None
    t.note = ("Candidate / reference: the check's ratio with its interval and outcome. Rules/4: the primary endpoint "
              "row is the one that gates adopt (paired blocks, group-sequential, its repeated confidence interval); "
              "the per-case rows are guardrails (paired t over the blocks, Holm-adjusted, failing only past twice "
              "the bar). Rules/3: per case, Welch t on log values over the repeated runs; not judged: the client "
              "could have moved the case's numbers (client-limited).")
    return t


def _load_numbers(rows: list[dict[str, Any]], spec: bool = False) -> list[str]:
    """One case's own numbers: runs, requests, failed requests and the means over its runs; with `spec`,
    draft acceptance pooled over its runs after the throughput."""
    def m(field_name: str) -> float | None:
        return _mean([float(r[field_name]) for r in rows if isinstance(r.get(field_name), int | float)])

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}s"

    errors = sum(int(r.get("errors") or 0) for r in rows)
    cut = sum(int(r.get("incomplete") or 0) for r in rows)
    kv = m("kv_usage_max")
    accept = [spec_decode.shown(spec_decode.pooled(rows))] if spec else []
    return [str(len(rows)), num(sum(int(r.get("requests") or 0) for r in rows)),
            str(errors) + (f" (+{cut} cut off)" if cut else ""), num(m("output_tokens_per_s"), ".1f"), *accept,
            s(m("ttft_p99_s")), s(m("itl_p99_s")), s(m("e2e_p99_s")), "-" if kv is None else f"{kv:.1%}",
            num(m("preemptions"), ".0f")]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def fill_table(v: dict[str, Any]) -> TableData | None:
    probe = (v.get("probes") or {}).get("fill")
    if not probe:
        return None
    t = TableData("Fill: new tokens served against the claimed KV capacity",
                  ["server", "claimed tokens", "served tokens", "of claimed", "requests", "result"], prose=("result",))
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
    """Every check of every candidate, in the verdict's own words (rules/3 checks by their stable id)."""
    t = TableData("Every check", ["candidate", "check", "bar", "case", "value", "interval", "limit", "outcome",
                                  "detail"], keys=2, prose=("detail",))
    for name, d in v["decisions"].items():
        for c in d.get("checks") or []:
            t.rows.append([name, c.get("id") or cells.label(c), c["bar"], c.get("case") or "-", *cells.figure(c),
                           cells.limit_text(c), c["outcome"], c["text"]])
            t.tags.append(c["outcome"])
    return t


def probes_table(v: dict[str, Any]) -> TableData:
    t = TableData("Probes", ["probe", "status"])
    for probe, status in (v.get("probes_status") or {}).items():
        t.rows.append([probe, status])
        t.tags.append(None if status == "ran" else "inconclusive")
    return t


def left_out_table(v: dict[str, Any]) -> TableData | None:
    """Servers meant for the comparison that never started (the demo's fp8 on an AVX2-only CPU)."""
    rows = (v.get("run") or {}).get("left_out") or []
    if not rows:
        return None
    return TableData("Left out", ["server", "why"], [[str(r.get("name")), str(r.get("reason"))] for r in rows],
                     note="not started, so not measured: no decision is made for these servers", prose=("why",))


def all_tables(v: dict[str, Any]) -> list[TableData]:
    tables = [decisions_table(v), left_out_table(v), servers_table(v), perplexity_table(v), agreement_table(v),
              needle_table(v), tasks_table(v), load_table(v), speed_table(v), fill_table(v), power_table(v),
              checks_table(v), bars_table(v), probes_table(v)]
    return [t for t in tables if t is not None]
