"""The answer in a few lines: the summary `eval` prints by default fits the terminal at 80, 100 and 120
columns without cutting a number, says each axis per candidate, and --quiet / --verbose print less / more."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay import SERVERS_TOML, MultiReplay, Replay
from rich.console import Console
from rich.text import Text

from kvprobe.cli import main
from kvprobe.evaluate import orchestrate as evaluation
from kvprobe.report import cells, html, markdown
from kvprobe.report.standing import NOT_VERIFIED, Standing
from kvprobe.report.step_summary import step_summary
from kvprobe.report.summary import candidate_rows, kept_but_broke, print_summary

RUNS = sorted((Path(__file__).parents[1] / "fixtures" / "runs").glob("*/verdict.json"))
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?[%x]?")
INTERVAL = re.compile(r"\[[-+\d.,%x ]+\]")


def render(verdict: dict, width: int) -> list[str]:
    buf = io.StringIO()
    print_summary(Console(file=buf, width=width, color_system=None), verdict)
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("path", RUNS, ids=[p.parent.name for p in RUNS])
def test_the_summary_fits_and_never_cuts_a_number(path: Path, width: int) -> None:
    verdict = json.loads(path.read_text())
    lines = render(verdict, width)
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    words = {w for line in lines for w in line.split()}
    for name, d in verdict["decisions"].items():
        assert any(line.startswith(f"{name}: {d['decision']}") for line in lines)
        for check in d["checks"]:
            if check.get("probe") in ("perplexity", "needle", "tasks", "agreement"):
                # each figure of a quality check is whole on some line (wrapping happens between words)
                for number in NUMBER.findall(cells.estimate_text(check)):
                    assert any(number in w for w in words), (name, check.get("id"), number)
        if d.get("capacity_ratio") is not None:
            assert any(f"{d['capacity_ratio']:.2f}x" in line for line in lines)
        # an interval's two ends stay on one line, wherever the summary wraps (speed's ratio interval too)
        texts = " ".join(Text.from_markup(text).plain for _, text in candidate_rows(verdict, name))
        for interval in INTERVAL.findall(texts):
            assert any(interval in line for line in lines), (name, interval)
    # the recommendation ends the summary, followed only by what keeping a reference that broke leaves to do
    last = max(i for i, line in enumerate(lines) if line.startswith("recommendation: "))
    assert all(line.startswith("  ") for line in lines[last + 1:])
    assert (len(lines) > last + 1) == (kept_but_broke(verdict) is not None)
    assert all(line == line.rstrip() for line in lines)  # nothing pads a line out to the terminal's width


def test_at_100_columns_each_axis_is_a_line_of_its_own() -> None:
    verdict = json.loads((RUNS[0].parent.parent / "xeon-amx-demo" / "verdict.json").read_text())
    lines = render(verdict, 100)
    fp8 = lines[lines.index("fp8: inconclusive") + 1:]
    axes = [line[:11].strip() for line in fp8[:8] if line[:11].strip()]
    assert axes[:5] == ["capacity", "quality", "speed", "serving", "to settle"]
    assert "2.00x (1,048,576 vs 524,288 KV tokens)" in fp8[0]
    assert "perplexity delta -0.57% [-1.12%, -0.05%] (bar 1.00%) pass" in fp8[1]
    # the reject's failing bar is there with its number and interval
    assert any("perplexity delta +66.63% [+57.43%, +77.05%] (bar 1.00%) fail" in line for line in lines)


def test_keeping_a_reference_that_broke_says_it_broke_on_every_surface(tmp_path: Path) -> None:
    """The AVX2 demo's reference broke in the needle probe (its worker starved of CPU): the rules still keep it
    (its candidate is rejected), and every surface that says "keep auto" says in the same place that auto itself
    broke."""
    verdict = json.loads((RUNS[0].parents[1] / "amd-avx2-rules6" / "verdict.json").read_text())
    assert verdict["recommendation"]["server"] == "auto" and not verdict["recommendation"]["change"]
    said = "auto itself broke during this run: fix it, then rerun to finish the comparison"
    assert kept_but_broke(verdict) == said
    lines = render(verdict, 120)
    assert lines[-2:] == ["recommendation: keep auto", "  but " + said]
    standing = Standing(NOT_VERIFIED, "NOT verified: a test", "not verified")
    error = verdict["broken"]["auto"]
    assert f"**{said}** ({error})" in markdown.render(verdict, [], standing)
    assert f"**{said}** ({error})" in step_summary(verdict, tmp_path, None)
    page = html.render(verdict, [], standing)
    assert f"<strong>{said}</strong>" in page and "EngineCore encountered an issue" in page
    # a reference that did not break is kept without a word more
    for path in RUNS:
        other = json.loads(path.read_text())
        if other["recommendation"]["server"] not in (other.get("broken") or {}):
            assert kept_but_broke(other) is None, path.parent.name
            assert " itself broke during this run" not in markdown.render(other, [], standing)


def _fleet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_SIGNING_KEY", raising=False)
    transport = MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")}).transport()
    real = evaluation.make_clients
    monkeypatch.setattr(evaluation, "make_clients", lambda config, _=None: real(config, transport))
    servers = tmp_path / "servers.toml"
    servers.write_text(SERVERS_TOML)
    return servers


@pytest.mark.parametrize("view", ["--quiet", "", "--verbose"])
def test_quiet_summary_and_verbose(view: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    servers = _fleet(monkeypatch, tmp_path)
    args = ["eval", "--servers", str(servers), "--probes", "capacity", "--out", str(tmp_path / "run")]
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, [*args, *([view] if view else [])])
    assert result.exit_code == 0, result.output
    if view == "--quiet":
        assert result.stdout == "fp8: inconclusive\n"  # the decision lines, nothing else
        return
    assert "fp8: inconclusive" in result.stdout and "recommendation: keep auto" in result.stdout
    assert "capacity  2.00x (2,097,152 vs 1,048,576 KV tokens)" in result.stdout  # the tiny-llama captures
    assert all(len(line) <= 100 for line in result.stdout.splitlines()), max(result.stdout.splitlines(), key=len)
    # the full tables only with --verbose, each once
    assert result.stdout.count("Decisions") == (1 if view == "--verbose" else 0)


def test_verbose_and_quiet_together_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    servers = _fleet(monkeypatch, tmp_path)
    result = CliRunner().invoke(main, ["eval", "--servers", str(servers), "-q", "-v"])
    assert result.exit_code == 2 and result.stderr.strip() == "error: --verbose and --quiet: give one"


def test_a_probe_without_a_bar_ends_with_its_figures_not_judged() -> None:
    from kvprobe.report.summary import probe_lines

    summary = {"cand": {"top1_agreement": 0.1727, "kl_mean": 1.3823, "positions": 11_597}}
    assert probe_lines("agreement", {"cand": []}, summary) == [
        "agreement: [bold]cand[/bold] top-1 agreement 17.3%, mean KL 1.38 over 11,597 positions "
        "(no bar set: not judged)"]


def test_the_html_first_screen_points_to_its_own_power_table_not_to_itself() -> None:
    from kvprobe.report.html import glance

    verdict = json.loads((RUNS[0].parent.parent / "h200-gpu" / "verdict.json").read_text())
    rows = [text for card in glance(verdict) for _, text in card["rows"]]
    more = [text for text in rows if text.startswith("and ") and text.endswith(" more (the Power table below)")]
    assert len(more) == 2 and not any("report.html" in text for text in rows)  # 20 speed checks each, 4 shown
    terminal = render(verdict, 120)
    assert any(line.strip().endswith("more (--verbose, or report.html)") for line in terminal)
