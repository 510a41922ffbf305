"""--junit and --summary: the verdict as a CI system reads it. JUnit files are read back with
junitparser (a well-kept parser), the summary with markdown-it (the CommonMark parser rich uses)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from junitparser import Failure, JUnitXml
from markdown_it import MarkdownIt
from rich.console import Console
from verdict_inputs import Measurements, perplexity_rows

from kvprobe.errors import CiOutputError
from kvprobe.report import cells
from kvprobe.report.ci import CiOutputs
from kvprobe.report.junit import junit_xml, no_verdict_xml
from kvprobe.report.step_summary import step_summary
from kvprobe.report.summary import print_summary
from kvprobe.verdict.build import build_verdict


def summary_text(v: dict[str, Any]) -> str:
    """The terminal summary as one line of words (wide enough that nothing wraps)."""
    buf = io.StringIO()
    print_summary(Console(file=buf, width=1000, color_system=None), v)
    return " ".join(buf.getvalue().split())


def parsed(data: bytes, tmp_path: Path) -> JUnitXml:
    path = tmp_path / "junit.xml"
    path.write_bytes(data)
    return JUnitXml.fromfile(str(path))


def cases(xml: JUnitXml) -> dict[str, dict[str, Failure | None]]:
    out: dict[str, dict[str, Failure | None]] = {}
    for suite in xml:
        out[suite.name] = {}
        for case in suite:
            failures = [r for r in case.result if isinstance(r, Failure)]
            out[suite.name][case.name] = failures[0] if failures else None
    return out


def test_a_passing_candidate_is_all_green_and_the_bytes_are_deterministic(tmp_path: Path) -> None:
    v = build_verdict(Measurements().write(tmp_path / "run"))
    assert v["decisions"]["cand"]["decision"] == "adopt"
    data = junit_xml(v)
    assert data == junit_xml(v)
    got = cases(parsed(data, tmp_path))["kvprobe.cand"]
    # each check named by what it measures (metric, percentile and case), never by its bar alone
    assert set(got) >= {"server health", "one-knob check", "capacity_gain_min", "perplexity delta",
                        "needle recall drop", "needle answers cut at the cap", "throughput drop, sweep mean of 1 case",
                        "guardrail: throughput drop at agents=4", "guardrail: TTFT p99 rise at agents=4",
                        "guardrail: ITL p99 rise at agents=4", "guardrail: E2E p99 rise at agents=4"}
    assert all(f is None for f in got.values())


def test_failing_and_inconclusive_bars_are_failures_with_the_verdicts_words(tmp_path: Path) -> None:
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.174, 0.02)
    m.load["servers"]["cand"]["cases"] = m.load["servers"]["cand"]["cases"][:1]  # one run: no interval
    v = build_verdict(m.write(tmp_path / "run"))
    xml = parsed(junit_xml(v), tmp_path)
    got = cases(xml)["kvprobe.cand"]
    ppl = got["perplexity delta"]
    check = next(c for c in v["decisions"]["cand"]["checks"] if c["id"] == "perplexity.delta")
    assert ppl is not None and ppl.type == "fail" and ppl.message == check["text"]  # the verdict's own words
    assert ppl.message.startswith("perplexity delta +19.01% [")
    # speed: the endpoint is a failure (no interval from one block); a guardrail that did not fail never is
    assert got["throughput drop, sweep mean of 1 case"].type == "inconclusive"
    guards = [f for name, f in got.items() if name.startswith("guardrail: ")]
    assert len(guards) == 4 and all(f is None for f in guards)
    failing = [c for c in v["decisions"]["cand"]["checks"] if c["outcome"] != "pass" and c.get("gating", True)]
    assert sum(1 for f in got.values() if f is not None) == len(failing)
    assert xml.failures == len(failing) and xml.skipped == 0  # never a skip


def test_broken_and_invalid_candidates_fail_naming_why(tmp_path: Path) -> None:
    m = Measurements()
    m.servers.append(("bad", "candidate", 200_000, "fp8"))
    m.status["cand"] = ("broken", "first-prefill smoke (272 tokens) failed: EngineCore died")
    m.pin_differences = {"bad": [{"field": "max_model_len", "values": {"ref": 8192, "bad": 4096},
                                  "text": "max_model_len: ref=8192 bad=4096"}]}
    got = cases(parsed(junit_xml(build_verdict(m.write(tmp_path / "run"))), tmp_path))
    assert "EngineCore died" in got["kvprobe.cand"]["server health"].message
    assert got["kvprobe.bad"]["one-knob check"].message.endswith("max_model_len: ref=8192 bad=4096")


def test_no_verdict_is_one_failure_and_notes_are_failures(tmp_path: Path) -> None:
    got = cases(parsed(no_verdict_xml("auto: cannot reach http://127.0.0.1:1"), tmp_path))
    assert got["kvprobe"]["run"].message == "auto: cannot reach http://127.0.0.1:1"
    v = build_verdict(Measurements().write(tmp_path / "run"))
    got = cases(parsed(junit_xml(v, ["drift from the baseline: cand capacity fell"]), tmp_path))
    assert got["kvprobe"]["run"].type == "run_note"


def test_the_summary_renders_as_markdown_with_every_bar(tmp_path: Path) -> None:
    m = Measurements()
    m.perplexity["servers"]["cand"] = perplexity_rows(0.174, 0.02)
    v = build_verdict(m.write(tmp_path / "run"))
    text = step_summary(v, tmp_path / "run", {"fingerprint": "SHA256:abc"})
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert [t.type for t in tokens].count("table_open") == 2
    assert "| cand | **reject** | 2.00x |" in text
    # each check by metric and case in the unit the terminal summary uses: percentages for perplexity,
    # fractions with 3 decimals for the answers and the answers cut at the cap, speed as the
    # candidate/reference ratio (its bar stays the bar as declared)
    assert "| perplexity delta | +19.01% | [+17.85%, +20.18%] | 1.00% | fail |" in text
    assert "| needle recall drop | +0.000 | [-0.088, +0.088] | 0.100 | pass |" in text
    assert "| needle answers cut at the cap | +0.000 | [-0.088, +0.088] | 0.100 | pass |" in text
    # paired block by block, the runs' shared ups and downs cancel: a narrow interval from 4 blocks
    assert "| throughput drop, sweep mean of 1 case | 1.04x | [1.04, 1.04] | 5.00% | pass |" in text
    assert "| guardrail: TTFT p99 rise at agents=4 | 0.97x | [0.97, 0.97] | 20.00% | pass |" in text
    said = summary_text(v)
    for check in v["decisions"]["cand"]["checks"]:  # every check the summary names reads the same there
        if check.get("gating", True):
            assert f"{cells.label(check)} {cells.estimate_text(check)} (bar {cells.limit_text(check)})" in said
    assert text.rstrip().endswith("signed by `SHA256:abc` (`verdict.json.sig`) · exit code 1")


def test_github_step_summary_is_the_default_and_is_appended_to(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "step.md"
    target.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    ci = CiOutputs.from_options(None, None)
    v = build_verdict(Measurements().write(tmp_path / "run"))
    assert ci.write(v, tmp_path / "run") == [target]
    assert target.read_text().startswith("earlier step\n## kvprobe: adopt cand")


def test_an_unwritable_file_is_one_line(tmp_path: Path) -> None:
    ci = CiOutputs(junit=tmp_path / "missing" / "junit.xml")
    try:
        ci.write(None, None, notes=["x"])
    except CiOutputError as exc:
        assert str(exc) == f"cannot write {tmp_path / 'missing' / 'junit.xml'}: No such file or directory"
    else:
        raise AssertionError("no error")
