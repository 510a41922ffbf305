"""A short Markdown summary of a verdict for $GITHUB_STEP_SUMMARY or a merge-request comment: the
decision and capacity per candidate, each check (by metric and case) with its value, interval, limit
and outcome, and where the run and its signature are. The full report stays in report.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprobe.report import cells
from kvprobe.report.markdown import cell
from kvprobe.report.summary import kept_but_broke


def step_summary(v: dict[str, Any], run_dir: Path, signature: dict[str, Any] | None,
                 exit_code: int | None = None, notes: list[str] | None = None) -> str:
    """`exit_code` and `notes`: what the command added after the verdict (a canary's drift)."""
    rec = v["recommendation"]
    out = [f"## kvprobe: {'adopt ' + rec['server'] if rec.get('change') else 'keep ' + rec['server']}", "",
           cell(rec["reason"]), "",
           *([f"**{cell(caveat)}** ({cell(v['broken'][rec['server']])})", ""] if (caveat := kept_but_broke(v)) else []),
           "| candidate | decision | capacity | first reason |", "|---|---|---|---|"]
    for name, d in v["decisions"].items():
        ratio = d.get("capacity_ratio")
        out.append(f"| {name} | **{d['decision']}** | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                   f"{cell((d.get('reasons') or ['-'])[0])} |")
    for name, d in v["decisions"].items():
        if not d.get("checks"):
            continue
        out += ["", f"<details><summary>{name}: {len(d['checks'])} checks</summary>", "",
                "| check | value | 95% interval | limit | outcome |", "|---|---|---|---|---|"]
        for c in d["checks"]:
            # in the unit every surface uses (kvprobe.report.cells.figure): speed as a ratio, perplexity in
            # percent, answers and the answers cut at the cap as fractions
            value, interval = cells.figure(c)
            out.append(f"| {cell(cells.label(c))} | {value} | {interval} | {cells.limit_text(c)} | {c['outcome']} |")
        out += ["", "</details>"]
    out += [""] + [f"- {cell(n)}" for n in notes or []]
    signed = f"signed by `{signature['fingerprint']}` (`verdict.json.sig`)" if signature else "not signed"
    code = v["exit_code"] if exit_code is None else exit_code
    out += ["", f"Run directory: `{run_dir}` · `verdict.json` {signed} · exit code {code}", ""]
    return "\n".join(out)
