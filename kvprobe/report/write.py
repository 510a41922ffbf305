"""Render a run's verdict to DIR/report.md, DIR/report.html and DIR/plots/*.png."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe.disk import mkdir
from kvprobe.report import html, markdown, plots
from kvprobe.report.standing import Standing
from kvprobe.run.store import RunDir


@dataclass
class Rendered:
    markdown: Path
    html: Path
    plots: list[Path] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # plots not drawn, and why


def render_reports(run: RunDir, verdict: dict[str, Any], standing: Standing) -> Rendered:
    """`standing`: whether the verdict can be trusted, said first in both reports (kvprobe.report.standing)."""
    out_dir = mkdir(run.path / "plots")
    drawn: list[dict[str, Any]] = []
    for key, title, make in (
        ("capacity", "KV cache capacity per server", lambda: plots.capacity_chart(verdict)),
        ("perplexity", "Perplexity delta vs the reference, with 95% intervals, against the bar",
         lambda: plots.perplexity_chart(verdict)),
        ("load", "Throughput per load case", lambda: plots.load_chart(verdict)),
        ("latency", "Latency CDFs per server", lambda: plots.latency_cdfs(verdict, run)),
    ):
        data = make()
        path = None
        if data is not None:
            path = run.write_bytes(f"plots/{key}.png", data)
        absent = None if data is not None else plots.absent(key, verdict, run)
        drawn.append({"key": key, "title": title, "png": data, "path": path, "absent": absent})
    heatmaps = plots.needle_heatmaps(verdict, run, out_dir)
    if isinstance(heatmaps, str):
        drawn.append({"key": "needle", "title": "Needle heatmaps", "png": None, "path": None, "absent": heatmaps})
    else:
        for title, path in heatmaps:
            drawn.append({"key": "needle", "title": title, "png": path.read_bytes(), "path": path, "absent": None})
    md_plots = [(d["title"], str(d["path"].relative_to(run.path)) if d["path"] else None, d["absent"]) for d in drawn]
    md_path = run.write_text("report.md", markdown.render(verdict, md_plots, standing))
    html_path = run.write_text("report.html", html.render(verdict, drawn, standing))
    return Rendered(md_path, html_path, [d["path"] for d in drawn if d["path"]],
                    [f"{d['title']}: {d['absent']}" for d in drawn if not d["path"]])
