"""Every table shows the checks' own outcomes: the line per candidate printed as a probe ends and the
final tables of the report say what the signed verdict says, for the same run; the Power table names each
check by its metric and case; a rules/2 verdict still renders."""

from __future__ import annotations

import gzip
import io
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table
from verdict_inputs import Measurements, needle_cases, perplexity_rows, tasks_summary

from kvprobe.cli import main
from kvprobe.config import Bars
from kvprobe.report import cells, tables
from kvprobe.report.summary import print_probe
from kvprobe.report.tables import TableData
from kvprobe.verdict.build import build_verdict
from kvprobe.verdict.checks import live_checks

RUNS = Path(__file__).parent.parent / "fixtures" / "runs"


def wrecked_run() -> Measurements:
    """ref, a good candidate (cand) and a wrecked one (int8) that the cap cuts on some needles; cand
    cut on two task documents the reference answered."""
    m = Measurements()
    m.servers.append(("int8", "candidate", 200_000, "int8_per_token_head"))
    m.perplexity["servers"]["int8"] = perplexity_rows(0.174, 0.02)
    m.needle["cases"] += needle_cases("int8", 2, truncated=3)
    m.needle["servers"]["int8"] = {"hit": 2, "miss": 35, "truncated": 3, "error": 0, "recall": 2 / 37}
    m.load["servers"]["int8"] = {"cases": m.load["servers"]["cand"]["cases"]}
    m.probes_requested.append("tasks")
    m.tasks = tasks_summary([1.0] * 30, [1.0] * 25 + [0.0] * 5, truncated=(27, 28))
    return m


def text_of(table: Table) -> str:
    buf = io.StringIO()
    Console(file=buf, width=220, color_system=None).print(table)
    return buf.getvalue()


def row_of(table: TableData, *first: str) -> list[str]:
    return next(r for r in table.rows if r[:len(first)] == list(first))


def line_of(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.strip(" │┃").startswith(name + " "))


def verdict_checks(v: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in v["decisions"][name]["checks"]}


@pytest.fixture
def wrecked(tmp_path: Path) -> tuple[Measurements, dict[str, Any]]:
    m = wrecked_run()
    return m, build_verdict(m.write(tmp_path / "run"))


def live(m: Measurements, probe: str) -> dict[str, list[dict[str, Any]]]:
    summary = getattr(m, probe)
    servers = [name for name, *_ in m.servers]
    return live_checks(probe, summary, "ref", servers, Bars.model_validate(m.bars))


def test_the_live_checks_are_the_verdicts(wrecked) -> None:
    m, v = wrecked
    for probe in ("perplexity", "needle", "tasks", "load"):
        for name, checks in live(m, probe).items():
            signed = verdict_checks(v, name)
            for check in checks:
                assert check["outcome"] == signed[check["id"]]["outcome"], check["id"]
                assert check["value"] == signed[check["id"]]["value"], check["id"]


def live_lines(m: Measurements, probe: str) -> str:
    """What a probe prints as it ends: a line per candidate, markup stripped as a log shows it."""
    buf = io.StringIO()
    print_probe(Console(file=buf, width=220, color_system=None), probe, live(m, probe))
    return buf.getvalue()


def line_for(text: str, probe: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{probe}: {name} "))


def test_perplexity_live_line_and_final_table_show_the_verdicts_outcome(wrecked) -> None:
    m, v = wrecked
    live_text = live_lines(m, "perplexity")
    final = tables.perplexity_table(v)
    assert final is not None
    for name, outcome in (("cand", "pass"), ("int8", "fail")):
        check = verdict_checks(v, name)["perplexity.delta"]
        assert check["outcome"] == outcome
        shown = [cells.value_text(check["bar"], check["value"]), cells.interval_text(check), "deterministic"]
        row = row_of(final, name)
        assert row[3:] == [*shown, outcome]
        line = line_for(live_text, "perplexity", name)
        assert f"{cells.estimate_text(check)} (bar {cells.limit_text(check)}) {outcome}" in line
    assert "perplexity: ref " not in live_text  # the reference is not judged


def test_needle_live_line_and_final_table_show_both_checks_outcomes(wrecked) -> None:
    m, v = wrecked
    live_text = live_lines(m, "needle")
    final = tables.needle_table(v)
    assert final is not None
    recall, cut = verdict_checks(v, "int8")["needle.recall_drop"], verdict_checks(v, "int8")["needle.truncation_rise"]
    # two different outcomes on one row: the table shows each check's own, never one for both
    assert (recall["outcome"], cut["outcome"]) == ("fail", "inconclusive")
    row = row_of(final, "int8")
    assert row[1:6] == ["2", "35", "3", "0", "5%"]
    assert row[6:] == [cells.estimate_text(recall), "fail", cells.estimate_text(cut), "inconclusive"]
    assert final.tags[final.rows.index(row)] == "fail"
    line = line_for(live_text, "needle", "int8")
    assert f"{cells.estimate_text(recall)} (bar {cells.limit_text(recall)}) fail" in line
    assert f"{cells.estimate_text(cut)} (bar {cells.limit_text(cut)}) inconclusive" in line


def test_tasks_live_line_and_final_table_show_the_drop_and_the_cut_checks(wrecked) -> None:
    m, v = wrecked
    live_text = live_lines(m, "tasks")
    final = tables.tasks_table(v)
    assert final is not None
    drop, cut = verdict_checks(v, "cand")["tasks.qa.drop"], verdict_checks(v, "cand")["tasks.qa.truncation_rise"]
    row = row_of(final, "qa", "cand")
    assert row[5] == "2"  # cut at the cap
    assert row[6:] == [cells.estimate_text(drop), f"{drop['mcnemar_p']:.2g}", drop["outcome"],
                       cells.estimate_text(cut), cut["outcome"]]
    line = line_for(live_text, "tasks", "cand")
    assert f"{cells.estimate_text(drop)} (bar {cells.limit_text(drop)}) {drop['outcome']}" in line
    assert f"{cells.estimate_text(cut)} (bar {cells.limit_text(cut)}) {cut['outcome']}" in line


def test_the_load_line_and_tables_show_each_speed_check_by_metric(wrecked) -> None:
    m, v = wrecked
    live_text = live_lines(m, "load")
    speed = tables.speed_table(v)
    assert speed is not None and speed.headers[2:] == ["output tok/s", "TTFT p99", "ITL p99", "E2E p99"]
    checks = verdict_checks(v, "cand")
    row = row_of(speed, "cand", "agents=4")
    ids = ["load.agents=4.throughput_drop", "load.agents=4.ttft_p99_rise", "load.agents=4.itl_p99_rise",
           "load.agents=4.e2e_p99_rise"]
    assert row[2:] == [cells.ratio_text(checks[i]) for i in ids]
    # the line leads with the declared endpoint, each figure as the check has it
    line = line_for(live_text, "load", "cand")
    endpoint = checks["load.endpoint.throughput_drop"]
    assert line.startswith(f"load: cand {cells.label(endpoint)}") and f"(bar {cells.limit_text(endpoint)})" in line
    assert line.split(" · ")[0].endswith(cells.outcome_word(endpoint))


def test_a_client_limited_block_is_dropped_and_the_tables_say_so(tmp_path: Path) -> None:
    m = Measurements()
    m.load["servers"]["cand"]["cases"][0]["client_cpu_share"] = 0.99  # the client used a whole core
    v = build_verdict(m.write(tmp_path / "run"))
    endpoint = verdict_checks(v, "cand")["load.endpoint.throughput_drop"]
    assert endpoint["outcome"] == "inconclusive" and "1 client-limited block dropped" in endpoint["text"]
    # the guardrails are judged on the other three blocks, and never hold adopt back
    guards = [c for c in v["decisions"]["cand"]["checks"] if c["probe"] == "load" and not c.get("gating", True)]
    assert guards and all("over 3 paired blocks" in c["text"] for c in guards)
    assert all(cells.label(c).startswith("guardrail: ") for c in guards)
    power = tables.power_table(v)
    assert power is not None
    row = next(r for r in power.rows if r[1] == "throughput drop, sweep mean of 1 case")
    assert row[2] == "3 blocks" and row[7] == "inconclusive"


def test_the_power_table_names_ttft_itl_and_e2e_rows_apart(wrecked) -> None:
    _, v = wrecked
    power = tables.power_table(v)
    assert power is not None
    assert power.headers == ["candidate", "check", "n", "se", "passes at most", "fails at least", "limit", "outcome",
                             "to settle it"]
    # speed: the one primary endpoint, by metric and scope; the per-case guardrails carry no power figures
    load_rows = [r[1] for r in power.rows if r[0] == "cand" and ("throughput" in r[1] or "p99" in r[1])]
    assert load_rows == ["throughput drop, sweep mean of 1 case"]
    assert not any(r[1] in ("p99_latency_rise_max", "throughput_drop_max") for r in power.rows)
    labels = [(r[0], r[1]) for r in power.rows]
    assert len(labels) == len(set(labels))  # one row per measured check, each named apart
    # the figures are the check's own, in its bar's units
    check = verdict_checks(v, "cand")["tasks.qa.drop"]
    row = row_of(power, "cand", "qa exact_match drop")
    block = check["power"]
    def fig(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    # 30 documents: no loss at all passes the 0.10 bar (it needs 35), so "passes at most" is "-"
    assert block["passes_at_most"] is None
    assert row[2:7] == [f"{block['n']} documents", f"{block['se']:.3f}", fig(block["passes_at_most"]),
                        fig(block["fails_at_least"]), "0.100"]
    assert check["outcome"] == "inconclusive" and row[-1].startswith(f"about {block['needed']:,} documents")
    assert "one-sided test at 2.5% against the bar" in power.note and "power 0.8" in power.note
    assert "cannot rule out a loss as big as the bar" not in power.note  # the old, wrong reading is gone


def test_settle_text_for_each_kind_of_power_block() -> None:
    def check(**block: Any) -> dict[str, Any]:
        return {"bar": "needle_recall_drop_max", "outcome": "inconclusive",
                "power": {"n": 20, "unit": "needles", **block}}

    assert cells.settle_text(check(needed=151, range=[120, 190])) == "about 151 needles (120-190)"
    assert cells.settle_text(check(why="a bar of 0 can only fail or be inconclusive: no size passes it")) \
        .startswith("a bar of 0")
    assert cells.settle_text(check(client_limited=True, needed=9)) == cells.CLIENT_LIMITED_ADVICE
    assert cells.settle_text({**check(needed=9), "outcome": "pass"}) == "-"
    # 20 needles would already let an equal candidate pass: the estimate holds this one back
    assert cells.settle_text(check(needed=15)).startswith("the estimate, not the size (about 15 needles")
    old = {**check(detectable=0.19, needed=57, se=0.078, alpha=0.05)}
    assert cells.power_size(old, "passes_at_most") == "-" and cells.se_text(old) == "0.078"
    assert cells.settle_text(old) == "about 57 needles"


def recorded_copy(name: str, tmp_path: Path) -> Path:
    """A recorded run as `kvprobe report` finds one on disk: writable, its events log unpacked."""
    dst = tmp_path / name
    shutil.copytree(RUNS / name, dst)
    for path in dst.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    with gzip.open(dst / "events.jsonl.gz", "rb") as packed:
        (dst / "events.jsonl").write_bytes(packed.read())
    return dst


def test_report_renders_a_rules_2_verdict(tmp_path: Path) -> None:
    run = recorded_copy("xeon-amx-demo", tmp_path)
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 1, result.output  # a reject, and not signed (kvprobe.verdict.verify)
    assert result.stdout.startswith("NOT verified: ") and "int8_per_token_head: reject" in result.output
    md = (run / "report.md").read_text()
    assert "rules kvprobe.rules/2" in md and (run / "report.html").is_file()
    # The old checks' own outcomes: int8's needle bar was not_measured under rules/2, and it had no
    # check on the answers cut at the cap (-); its perplexity failed.
    assert "| int8_per_token_head | 0 | 0 | 20 | 0 | - | - | not_measured | - | - |" in md
    assert "| int8_per_token_head | 5.3240 | 55120781069.475 | +66.63% | [+57.43%, +77.05%] | 0.00% | fail |" in md
    # Power: rules/2 recorded `detectable`, not passes/fails at most: "-" in those columns, its n, se
    # and `needed` where they fit, and a client-limited case's advice.
    assert "| fp8 | perplexity delta | 16 passages | 0.27% | - | - | 1.00% | pass | - |" in md
    assert ("| fp8 | TTFT p99 rise at shape=default agents=1 | 3 runs | 88.40% | - | - | 10.00% | inconclusive | "
            "more runs do not help; a quieter client does |") in md
    assert "Written under kvprobe.rules/2" in md
    assert "| fp8 | shape=default agents=1 | 0.99x [0.78, 1.24] not judged |" in md
    for plot in ("capacity", "perplexity", "load", "latency"):
        assert (run / "plots" / f"{plot}.png").stat().st_size > 5000


@pytest.mark.parametrize("run", sorted(p.name for p in RUNS.iterdir() if (p / "verdict.json").is_file()))
def test_an_endpoint_its_design_cannot_settle_is_given_no_block_count_anywhere(run: str) -> None:
    """The endpoint's words (kvprobe.verdict.checks.speed) say when no run of its design can settle it; the Power
    table and the summary's 'to settle' say the same, never the thousands of blocks its look records."""
    import orjson

    from kvprobe.report.summary import candidate_rows

    verdict = orjson.loads((RUNS / run / "verdict.json").read_bytes())
    power = tables.power_table(verdict)
    for name, d in verdict["decisions"].items():
        for c in d.get("checks") or []:
            if cells.UNSETTLED_WORDS not in str(c.get("text", "")):
                continue
            rows = [r for r in power.rows if r[0] == name and r[1] == cells.label(c)]
            assert [r[-1] for r in rows] == [cells.UNSETTLED_WORDS]
            settle = [text for _, text in candidate_rows(verdict, name) if text.startswith(f"{cells.label(c)}: ")]
            assert settle or d["decision"] != "inconclusive"  # a no_gain twin's decision needs no settling
            assert all(cells.UNSETTLED_WORDS in text and "more blocks" not in text for text in settle)


def test_a_speed_endpoints_se_is_a_share_beside_its_percent_bar() -> None:
    """Its interval is built on the log ratio; the Power table shows that se as the share it moves the ratio by
    (h100-rules6's fp8: 0.0120 is 1.21%), comparable at a glance with the 5.00% bar beside it."""
    import orjson

    verdict = orjson.loads((RUNS / "h100-rules6" / "verdict.json").read_bytes())
    power = tables.power_table(verdict)
    se = power.headers.index("se")
    for name, d in verdict["decisions"].items():
        endpoint = next(c for c in d["checks"] if c["id"] == "load.endpoint.throughput_drop")
        log_se = endpoint["sequential"]["look"]["se"]
        row = next(r for r in power.rows if r[0] == name and r[1] == cells.label(endpoint))
        assert row[se] == f"{math.expm1(log_se):.2%}" and row[power.headers.index("limit")] == "5.00%"
    fp8 = next(r for r in power.rows if r[0] == "fp8")
    assert fp8[se] == "1.21%"
    assert "shown as the share it moves the ratio by" in power.note
