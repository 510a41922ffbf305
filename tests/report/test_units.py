"""One check, one unit, on every surface: the summary, report.md and report.html word each check of every recorded
run (tests/fixtures/runs/*) the same way (kvprobe.report.cells.figure): speed as the candidate/reference ratio
with its interval, perplexity in percent, answers as fractions. Issue #32 saw the AVX2 demo's throughput check as
`1.07x [0.70, 1.65]` in the summary, `-7.27%` in the HTML and `-0.0727` in compare."""

from __future__ import annotations

import html as html_lib
import io
import json
import re
from pathlib import Path

import pytest
from recorded import RUNS
from rich.console import Console

from kvprobe.report import cells, html, markdown
from kvprobe.report.standing import NOT_VERIFIED, Standing
from kvprobe.report.summary import check_text, print_summary

VERDICTS = sorted(RUNS.glob("*/verdict.json"))
STANDING = Standing(NOT_VERIFIED, "NOT verified: a test", "NOT verified")


def plain(text: str) -> str:
    return re.sub(r"\[/?[a-z ]+\]", "", text)  # check_text's rich markup (the outcome's colour)


@pytest.mark.parametrize("path", VERDICTS, ids=[p.parent.name for p in VERDICTS])
def test_every_check_reads_the_same_in_the_summary_markdown_and_html(path: Path) -> None:
    verdict = json.loads(path.read_text())
    md = markdown.render(verdict, [], STANDING)
    page = html_lib.unescape(html.render(verdict, [], STANDING))
    buf = io.StringIO()
    print_summary(Console(file=buf, width=1000, color_system=None), verdict)
    summary = buf.getvalue()
    for name, decision in verdict["decisions"].items():
        for check in decision["checks"]:
            value, interval = cells.figure(check)
            row = f"| {name} | {check.get('id') or cells.label(check)} | {check['bar']} | {check.get('case') or '-'} " \
                  f"| {value} | {interval} | {cells.limit_text(check)} | {check['outcome']} |"
            assert row in md, row
            assert f"<td>{value}</td><td>{interval}</td>" in page.replace("\n", ""), (name, check.get("id"))
            said = plain(check_text(check))
            assert value == "-" or f"{value} {interval}".removesuffix(" -") in said
            if check in [c for c in decision["checks"] if c.get("gating", True)] and value != "-":
                # the summary names a gating check (all of them, or the worst speed check) as check_text does
                assert said in summary or check.get("probe") == "load", said


def test_the_issues_throughput_check_is_a_ratio_everywhere() -> None:
    verdict = json.loads((RUNS / "amd-avx2-demo" / "verdict.json").read_text())
    check = next(c for c in verdict["decisions"]["bfloat16"]["checks"]
                 if c["id"] == "load.shape=default.agents=1.throughput_drop")
    assert cells.figure(check) == ("1.07x", "[0.70, 1.65]")
    assert plain(check_text(check)) == "throughput drop at shape=default agents=1 1.07x [0.70, 1.65] (bar 5.00%) " \
                                       "inconclusive"
    md = markdown.render(verdict, [], STANDING)
    assert "| 1.07x | [0.70, 1.65] | 5.00% | inconclusive |" in md
    assert "| -7.27% |" not in md  # the verdict's own words (the detail column) still quote it, as signed
