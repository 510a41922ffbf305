"""The terminal's reporter during a run (kvprobe.run.context.Reporter): one line per candidate as each
probe ends, with the checks the signed verdict will carry, and the charts a probe records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from kvprobe.config import Bars
from kvprobe.report.summary import print_probe
from kvprobe.run.context import Chart
from kvprobe.verdict.checks import live_checks


class TerminalReporter:
    def __init__(self, console: Console, reference: str, bars: Bars) -> None:
        self.console, self.reference, self.bars = console, reference, bars

    def probe_done(self, probe: str, summary: dict[str, Any], servers: list[str]) -> None:
        checks = live_checks(probe, summary, self.reference, servers, self.bars)
        print_probe(self.console, probe, checks, summary)

    def draw(self, chart: Chart, data: Any, path: Path) -> Path | None:
        # matplotlib is imported here, when a probe has something to draw, not with the run.
        if chart == "memmap":
            from kvprobe.report.bytes_chart import bytes_chart

            return bytes_chart(data, path)
        if chart == "lever":
            from kvprobe.report.lever_chart import lever_chart

            return lever_chart(data, path)
        from kvprobe.report.heatmap import paired_heatmap, status_heatmap

        if chart == "needle_status":
            cases, server = data
            return status_heatmap(cases, server, path)
        cases, reference, candidate = data
        return paired_heatmap(cases, reference, candidate, path)
