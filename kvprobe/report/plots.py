"""Report plots as PNG bytes: capacity per server, perplexity deltas with intervals against the bar,
load throughput per case, latency CDFs per server, needle heatmaps.

matplotlib's object API on an Agg canvas (no pyplot): no global backend or figure state, safe in a
long-running process. Each function returns None when its data is absent, and `absent` says why, from
the run itself: a probe that did not run, one that ran and left nothing to draw, a log that is not there.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from kvprobe.run.store import RunDir
from kvprobe.verdict.checks import natural_order, runs_by_case

COLORS = {"reference": "#1f77b4", "adopt": "#2ca02c", "reject": "#d62728", "inconclusive": "#ff9f1c",
          "no_gain": "#7f7f7f", "invalid": "#9467bd", "broken": "#252525",
          "pass": "#2ca02c", "fail": "#d62728", "not_measured": "#bdbdbd"}
# Server colours in the load plots: not the decision colours (a red server is not a rejected one).
SERIES = ["#1f77b4", "#8c564b", "#17becf", "#e377c2", "#bcbd22", "#7f7f7f", "#9467bd", "#ff7f0e"]
# Per-request latencies in seconds, as the load probe records them (events of kind load_request,
# fields ttft/e2e; the *_s spellings are accepted too).
LATENCY_FIELDS = {"ttft": "time to first token", "e2e": "end-to-end latency"}


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _color_of(v: dict[str, Any], name: str) -> str:
    if name == v["reference"]:
        return COLORS["reference"]
    return COLORS.get((v["decisions"].get(name) or {}).get("decision", ""), "#7f7f7f")


def capacity_chart(v: dict[str, Any]) -> bytes | None:
    probe = (v.get("probes") or {}).get("capacity") or {}
    rows = [(n, ((probe.get("servers") or {}).get(n) or {}).get("kv_cache_tokens")) for n in v["order"]]
    rows = [(n, t) for n, t in rows if isinstance(t, int | float)]
    if not rows:
        return None
    ref_tokens = dict(rows).get(v["reference"])
    fig = _figure(7.5, 0.7 + 0.55 * len(rows))
    ax = fig.add_subplot()
    names = [n for n, _ in rows][::-1]
    tokens = [t for _, t in rows][::-1]
    ax.barh(names, tokens, color=[_color_of(v, n) for n in names])
    for y, t in enumerate(tokens):
        label = f"{t:,.0f}" + (f"  ({t / ref_tokens:.2f}x)" if ref_tokens else "")
        ax.text(t, y, " " + label, va="center", fontsize=9)
    ax.set_xlim(0, max(tokens) * 1.35)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.set_xlabel("KV cache capacity (tokens, from /metrics)")
    ax.set_title("Capacity per server (colour = decision)", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return png(fig)


def _perplexity_checks(v: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each candidate's perplexity check that has a value: the chart draws what the check judged."""
    out = []
    for name in v["order"]:
        if name == v["reference"]:
            continue
        check = next((c for c in (v["decisions"].get(name) or {}).get("checks", [])
                      if c["bar"] == "perplexity_delta_max"), None)
        if check is not None and check.get("value") is not None:
            out.append((name, check))
    return out


def _noise_band(v: dict[str, Any], checks: list[tuple[str, dict[str, Any]]]) -> float | None:
    """The reference's run-to-run noise: the rms the checks used (rules/3; 0 when its runs were
    bit-identical), or the figure a rules/2 perplexity probe recorded."""
    for _, check in checks:
        noise = check.get("noise")
        if isinstance(noise, dict):
            return noise.get("rms")
    servers = ((v.get("probes") or {}).get("perplexity") or {}).get("servers") or {}
    recorded = (servers.get(v["reference"]) or {}).get("noise")
    return float(recorded) if isinstance(recorded, int | float) else None


def perplexity_chart(v: dict[str, Any]) -> bytes | None:
    if not (v.get("probes") or {}).get("perplexity"):
        return None
    bar = (v.get("bars") or {}).get("perplexity_delta_max")
    checks = _perplexity_checks(v)
    if not checks:
        return None
    noise = _noise_band(v, checks)
    fig = _figure(7.5, 1.2 + 0.6 * len(checks))
    ax = fig.add_subplot()
    deltas = []
    for y, (_, check) in enumerate(checks):
        delta = check["value"] * 100
        deltas.append(delta)
        iv = check.get("interval")
        err = [[delta - iv[0] * 100], [iv[1] * 100 - delta]] if iv and None not in iv else None
        ax.errorbar([delta], [y], xerr=err, fmt="o", color=COLORS.get(check["outcome"], "#7f7f7f"), capsize=5,
                    markersize=7)
        ax.text(delta, y + 0.22, f"{delta:+.2f}%  {check['outcome']}", ha="center", fontsize=8)
    if noise:
        ax.axvspan(-abs(noise) * 100, abs(noise) * 100, color="#1f77b4", alpha=0.12,
                   label=f"reference run-to-run noise ±{abs(noise) * 100:.2f}%")
    if bar is not None:
        ax.axvline(bar * 100, color="#d62728", linestyle="--", label=f"bar {bar * 100:.2f}%")
    ax.axvline(0, color="#555555", linewidth=0.8)
    span = max(abs(d) for d in deltas)
    if bar and span > 20 * bar * 100:
        # A wrecked candidate (+250%) next to a good one (+0.1%): linear near the bar, log beyond.
        ax.set_xscale("symlog", linthresh=max(bar * 100 * 2, 0.01))
    ax.set_yticks(range(len(checks)), [n for n, _ in checks])
    ax.set_ylim(-0.6, len(checks) - 0.3)
    ax.set_xlabel("perplexity rise vs the reference (%), the check's 95% interval")
    ax.set_title("Perplexity delta against the bar", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.spines[["top", "right"]].set_visible(False)
    return png(fig)


def load_chart(v: dict[str, Any]) -> bytes | None:
    probe = (v.get("probes") or {}).get("load")
    if not probe:
        return None
    series: dict[str, dict[tuple[str, ...], list[float]]] = {}
    for name in v["order"]:
        runs = runs_by_case(((probe.get("servers") or {}).get(name) or {}).get("cases") or [])
        groups = {key: tps for key, rs in runs.items()
                  if (tps := [float(r["output_tokens_per_s"]) for r in rs
                              if isinstance(r.get("output_tokens_per_s"), int | float)])}
        if groups:
            series[name] = groups
    if not series:
        return None
    keys = sorted({k for g in series.values() for k in g}, key=natural_order)
    fig = _figure(7.5, 3.6)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (name, groups) in enumerate(series.items()):
        xs, means, lo, hi = [], [], [], []
        for j, key in enumerate(keys):
            if key in groups:
                vals = groups[key]
                xs.append(j - 0.4 + width * (i + 0.5))
                means.append(float(np.mean(vals)))
                lo.append(float(np.mean(vals) - min(vals)))
                hi.append(float(max(vals) - np.mean(vals)))
        ax.bar(xs, means, width, yerr=[lo, hi], capsize=3, color=SERIES[i % len(SERIES)], label=name)
    ax.set_xticks(range(len(keys)), ["\n".join(k) for k in keys], fontsize=8)
    ax.set_ylabel("output tokens/s (mean, min-max over runs)")
    ax.set_title("Throughput per load case", fontsize=10)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return png(fig)


def _latency(record: dict[str, Any], field: str) -> float | None:
    value = record.get(field)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_latencies(run: RunDir | None) -> dict[str, dict[str, list[float]]]:
    """Per server, per latency field, every successful request's value, from the load probe's
    per-request events (load.json keeps percentiles only)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    if run is None:
        return {}
    for event in run.events("load_request"):
        server = event.get("server")
        if not server:
            continue
        if event.get("error") or event.get("status", "ok") != "ok":
            continue  # failed and cut-off requests are counted by the load table, not drawn as latencies
        for field in LATENCY_FIELDS:
            if (value := _latency(event, field)) is not None:
                out[server][field].append(value)
    return {s: {k: sorted(vals) for k, vals in d.items() if vals} for s, d in out.items() if any(d.values())}


def latency_cdfs(v: dict[str, Any], run: RunDir | None) -> bytes | None:
    data = request_latencies(run)
    if not data:
        return None
    fields = [f for f in LATENCY_FIELDS if any(f in d for d in data.values())]
    fig = _figure(4.2 * len(fields), 3.4)
    for i, field in enumerate(fields):
        ax = fig.add_subplot(1, len(fields), i + 1)
        for j, name in enumerate([n for n in v["order"] if n in data]):
            values = data[name].get(field)
            if not values:
                continue
            ys = np.arange(1, len(values) + 1) / len(values)
            ax.step(values, ys, where="post", color=SERIES[j % len(SERIES)], label=f"{name} (n={len(values)})")
        ax.axhline(0.99, color="#999999", linestyle=":", linewidth=0.8)
        ax.set_xlabel(f"{LATENCY_FIELDS[field]} (s)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{LATENCY_FIELDS[field]}: CDF per server", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        ax.spines[["top", "right"]].set_visible(False)
    return png(fig)


def needle_heatmaps(v: dict[str, Any], run: RunDir | None, out_dir: Path) -> list[tuple[str, Path]] | str:
    """The heatmaps the needle probe drew (needle.json "heatmaps": title -> file); else drawn here with
    its module (kvprobe.report.heatmap) from needle.json's cases. A string says why there is none."""
    if run is None or not run.has("needle.json"):
        return _not_run(v, "needle") or "no needle.json in the run directory"
    data = orjson.loads((run.path / "needle.json").read_bytes())
    listed = data.get("heatmaps") if isinstance(data.get("heatmaps"), dict) else {}
    found = [(f"needle: {title}", run.path / rel) for title, rel in listed.items()
             if isinstance(rel, str) and (run.path / rel).is_file()]
    if found:
        return found
    cases = [c for c in data.get("cases") or []
             if isinstance(c, dict) and {"server", "status", "target_length", "target_depth"} <= set(c)]
    if not cases:
        return "needle.json has no cases with target_length and target_depth"
    from kvprobe.report import heatmap

    out: list[tuple[str, Path]] = []
    servers = [n for n in v["order"] if any(c["server"] == n for c in cases)]
    for name in servers:
        out.append((f"needle: {name}", heatmap.status_heatmap(cases, name, out_dir / f"needle-{name}.png")))
    for name in servers:
        if name != v["reference"] and v["reference"] in servers:
            out.append((f"needle: {name} vs {v['reference']}",
                        heatmap.paired_heatmap(cases, v["reference"], name,
                                               out_dir / f"needle-{name}-vs-{v['reference']}.png")))
    return out


# -- why a plot is absent ------------------------------------------------------------------------

def _not_run(v: dict[str, Any], probe: str) -> str | None:
    """Why `probe` has no numbers, in the words of the verdict's own status for it; None when it ran."""
    status = (v.get("probes_status") or {}).get(probe)
    if status == "ran" or (status is None and (v.get("probes") or {}).get(probe)):
        return None
    return f"{probe} probe {status or 'not run'}"


def _perplexity_absent(v: dict[str, Any]) -> str:
    unjudged = [c["text"] for name in v["order"] if name != v["reference"]
                for c in (v["decisions"].get(name) or {}).get("checks", []) if c["bar"] == "perplexity_delta_max"]
    if not unjudged:
        return "no candidate has a perplexity check"
    return "no candidate's perplexity delta has a value: " + "; ".join(unjudged)


def _latency_absent(run: RunDir | None) -> str:
    log = None if run is None else run.events_file()
    if log is None:
        return "no events log (events.jsonl or events.jsonl.gz) in the run directory: the load probe's " \
               "per-request latencies are kept there"
    return f"{log.name} holds no latency of a request the load probe finished"


def absent(key: str, v: dict[str, Any], run: RunDir | None) -> str:
    """Why plot `key` (capacity, perplexity, load, latency) could not be drawn for this verdict and run."""
    probe = {"latency": "load"}.get(key, key)
    if (why := _not_run(v, probe)) is not None:
        return why
    if key == "perplexity":
        return _perplexity_absent(v)
    if key == "latency":
        return _latency_absent(run)
    return {"capacity": "no server has a KV capacity", "load": "load.json has no throughput per case"}[key]
