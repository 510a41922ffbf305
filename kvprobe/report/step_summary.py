"""A short Markdown summary of a verdict for $GITHUB_STEP_SUMMARY or a merge-request comment: the
decision and capacity per candidate, each bar with its value, interval and limit, and where the run
and its signature are. The full report stays in report.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprobe.checks import pct
from kvprobe.report.markdown import cell

_RATIO_BARS = ("throughput_drop_max", "p99_latency_rise_max", "perplexity_delta_max")


def _value(check: dict[str, Any], value: Any) -> str:
    if value is None:
        return "-"
    if check["bar"] in _RATIO_BARS:
        return pct(value)
    return f"{value:+.2f}" if check["bar"] == "needle_recall_drop_max" else f"{value:.4g}"


def _limit(check: dict[str, Any]) -> str:
    limit = check.get("limit")
    if limit is None:
        return "-"
    return pct(limit, False) if check["bar"] in _RATIO_BARS else f"{limit:g}"


def step_summary(v: dict[str, Any], run_dir: Path, signature: dict[str, Any] | None,
                 exit_code: int | None = None, notes: list[str] | None = None) -> str:
    """`exit_code` and `notes`: what the command added after the verdict (a canary's drift)."""
    rec = v["recommendation"]
    out = [f"## kvprobe: {'adopt ' + rec['server'] if rec.get('change') else 'keep ' + rec['server']}", "",
           cell(rec["reason"]), "",
           "| candidate | decision | capacity | first reason |", "|---|---|---|---|"]
    for name, d in v["decisions"].items():
        ratio = d.get("capacity_ratio")
        out.append(f"| {name} | **{d['decision']}** | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                   f"{cell((d.get('reasons') or ['-'])[0])} |")
    for name, d in v["decisions"].items():
        if not d.get("checks"):
            continue
        out += ["", f"<details><summary>{name}: {len(d['checks'])} checks</summary>", "",
                "| bar | case | value | 95% interval | limit | outcome |", "|---|---|---|---|---|---|"]
        for c in d["checks"]:
            iv = c.get("interval")
            shown = f"[{_value(c, iv[0])}, {_value(c, iv[1])}]" if iv and None not in iv else "-"
            out.append(f"| {c['bar']} | {c.get('case') or '-'} | {_value(c, c.get('value'))} | {shown} | "
                       f"{_limit(c)} | {c['outcome']} |")
        out += ["", "</details>"]
    out += [""] + [f"- {cell(n)}" for n in notes or []]
    signed = f"signed by `{signature['fingerprint']}` (`verdict.json.sig`)" if signature else "not signed"
    code = v["exit_code"] if exit_code is None else exit_code
    out += ["", f"Run directory: `{run_dir}` · `verdict.json` {signed} · exit code {code}", ""]
    return "\n".join(out)
