"""The recorded runs (tests/fixtures/runs) re-rendered with `kvprobe report` and `kvprobe show`: what the reports
say of them is true. Their events are packed (events.jsonl.gz), and the latencies drawn are the load probe's;
no report names a verdict.json or a signature that is not there; a probe that ran under rules/2 is never "not
run"."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from recorded import RUNS

from kvprobe.cli import main
from kvprobe.report.plots import request_latencies
from kvprobe.run.store import RunDir

ALL = sorted(p.name for p in RUNS.iterdir() if (p / "verdict.json").is_file())


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own allowed_signers file never decides a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_ALLOWED_SIGNERS", raising=False)


def copy(name: str, tmp_path: Path, finished: bool = True) -> Path:
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    for path in run.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    if not finished:  # as a run still measuring is: no verdict, no signature
        for name in ("verdict.json", "verdict.json.sig"):
            (run / name).unlink(missing_ok=True)
    return run


def kvprobe(*args: object) -> Result:
    return CliRunner(env={"COLUMNS": "120"}).invoke(main, [str(a) for a in args], catch_exceptions=False)


def finished_requests(name: str) -> Counter[str]:
    """Per server, the load requests the recorded log has with a time to first token, read here without kvprobe."""
    counts: Counter[str] = Counter()
    with gzip.open(RUNS / name / "events.jsonl.gz", "rt") as fh:
        for line in fh:
            if '"load_request"' in line:
                e = json.loads(line)
                if e.get("status") == "ok" and not e.get("error") and isinstance(e.get("ttft"), float | int):
                    counts[e["server"]] += 1
    return counts


@pytest.mark.parametrize("name", ALL)
def test_every_recorded_runs_latencies_are_read_from_its_packed_log(name: str) -> None:
    drawn = {server: len(fields["ttft"]) for server, fields in request_latencies(RunDir.open(RUNS / name)).items()}
    assert drawn == dict(finished_requests(name))
    ran = json.loads((RUNS / name / "verdict.json").read_text())["probes_status"]["load"] == "ran"
    assert bool(drawn) == ran


@pytest.mark.parametrize("name", ["h200-gpu", "h200-slow-twin", "h200-gpu-hybrid-kv"])
def test_report_draws_a_recorded_runs_latencies(name: str, tmp_path: Path) -> None:
    run = copy(name, tmp_path)
    result = kvprobe("report", run)
    assert result.exit_code in (1, 2), result.output  # unsigned or untrusted here: never 0
    md = (run / "report.md").read_text()
    if name == "h200-gpu-hybrid-kv":  # its load probe did not run
        assert "*Latency CDFs per server: load probe not run*" in md
        return
    assert "(plots/latency.png)" in md and "no per-request latencies" not in md
    assert (run / "plots" / "latency.png").stat().st_size > 5000


@pytest.mark.parametrize("name", ["amd-avx2-demo", "h200-speed-sized"])
def test_a_run_that_did_not_finish_names_no_verdict_to_verify(name: str, tmp_path: Path) -> None:
    run = copy(name, tmp_path, finished=False)
    shown = kvprobe("show", run)
    assert shown.stdout.splitlines()[0].startswith("NOT verified: no verdict.json (the run did not finish)")
    result = kvprobe("report", run)
    assert result.exit_code in (1, 2), result.output
    assert not (run / "verdict.json").exists()
    for text in (shown.output, result.output, (run / "report.md").read_text(), (run / "report.html").read_text()):
        assert "kvprobe verify" not in text and not any(line.startswith("verdict: ") for line in text.splitlines())
        assert text.count("verdict.json") == text.count("no verdict.json (the run did not finish)")


def test_an_unsigned_verdict_is_not_given_a_signature_to_check(tmp_path: Path) -> None:
    """The recorded report.md was written when the run had its signature; re-rendered here, where it has none,
    the report names no verdict.json.sig and no command that would check one."""
    run = copy("h200-canary-5m", tmp_path)
    assert "-s verdict.json.sig" in (RUNS / "h200-canary-5m" / "report.md").read_text()
    result = kvprobe("report", run)
    assert f"verdict: {run / 'verdict.json'} (NOT verified)" in result.stderr  # it is there, unsigned
    for text in ((run / "report.md").read_text(), (run / "report.html").read_text()):
        assert "Not signed." in text and "ssh-keygen" not in text and "kvprobe verify ." not in text


def test_a_probe_that_ran_under_rules2_is_not_called_not_run(tmp_path: Path) -> None:
    """h200-gpu's perplexity and tasks ran under rules/2: decided again under today's rules (no verdict.json), each
    check names the figures the files lack, and no report says the probe did not run or has no result."""
    run = copy("h200-gpu", tmp_path, finished=False)
    result = kvprobe("report", run, "-v")
    md = (run / "report.md").read_text()
    assert ("perplexity delta: not measured (perplexity ran under rules/2, whose perplexity.json kept totals: its "
            "per-passage figures for fp8 are not recorded)") in md
    assert ("kvprobe_qa exact_match drop: not measured (tasks ran under rules/2, whose tasks.json kept totals: its "
            "per-document kvprobe_qa scores for auto are not recorded)") in md
    for text in (" ".join(result.stdout.split()), md):  # the terminal's tables fold long cells
        assert "perplexity probe not run" not in text and "no perplexity result" not in text
        assert "ran under rules/2" in text
    assert "*Perplexity delta vs the reference, with 95% intervals, against the bar: no candidate's perplexity " \
           "delta has a value: perplexity delta: not measured (perplexity ran under rules/2" in md


def test_a_probe_that_did_not_run_is_still_said_not_run(tmp_path: Path) -> None:
    run = copy("h200-speed-sized", tmp_path)
    kvprobe("report", run)
    md = (run / "report.md").read_text()
    assert "*Perplexity delta vs the reference, with 95% intervals, against the bar: perplexity probe not run*" in md
    assert "*Needle heatmaps: needle probe not run*" in md


def test_a_load_probe_with_no_events_log_says_where_the_latencies_would_be(tmp_path: Path) -> None:
    run = copy("h200-slow-twin", tmp_path)
    (run / "events.jsonl.gz").unlink()
    kvprobe("report", run)
    assert ("*Latency CDFs per server: no events log (events.jsonl or events.jsonl.gz) in the run directory: the "
            "load probe's per-request latencies are kept there*") in (run / "report.md").read_text()


def test_every_measured_probe_of_a_recorded_run_has_a_table_of_its_own() -> None:
    """report/tables.py's per-probe switch follows kvprobe.probes.PROBES: each probe a recorded run measured
    draws a table that goes when its evidence goes (capacity: the Decisions table's KV tokens column; fill,
    which no recorded run served, is held by tests/probes/test_fill.py)."""
    from kvprobe.probes import PROBES
    from kvprobe.report.tables import all_tables

    seen = set()
    for name in ALL:
        verdict = json.loads((RUNS / name / "verdict.json").read_text())
        whole = [(t.title, t.headers, t.rows) for t in all_tables(verdict)]
        for probe, data in (verdict.get("probes") or {}).items():
            if not data:
                continue
            without = json.loads(json.dumps(verdict))
            without["probes"][probe] = None
            if probe == "capacity":
                for decision in without["decisions"].values():
                    decision.pop("kv_cache_tokens", None)
            assert [(t.title, t.headers, t.rows) for t in all_tables(without)] != whole, (name, probe)
            seen.add(probe)
    assert seen == set(PROBES) - {"fill"}
