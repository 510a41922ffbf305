"""`kvprobe report` and `kvprobe show` on copies of the recorded AVX2 demo run (tests/fixtures/runs/amd-avx2-demo),
signed here with a test key: whether the verdict verifies is said first (terminal, report.md, report.html), a
verdict that does not verify never exits 0, `-q` exits with the verdict's code, and `show` writes nothing."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from recorded import RUNS
from verdict_inputs import Measurements

from kvprobe.cli import main
from kvprobe.verdict.build import verdict_bytes, write_verdict
from kvprobe.verdict.sign import SigningKey, allowed_signers_line, sign_file

DEMO = RUNS / "amd-avx2-demo"
KEY = SigningKey(Ed25519PrivateKey.generate(), "test key")


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own allowed_signers file never decides a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_ALLOWED_SIGNERS", raising=False)


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "allowed_signers"
    path.write_text(allowed_signers_line("tester", KEY.key.public_key()) + "\n")
    return path


def demo_copy(tmp_path: Path, sign: bool = True) -> Path:
    """The demo run, its verdict signed by the test key (its own signature's key is not here)."""
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    if sign:
        sign_file(run / "verdict.json", KEY)
    return run


def kvprobe(*args: Any) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def standing_in_html(run: Path) -> tuple[str, str]:
    """(class, text) of report.html's standing line, which must come before the recommendation."""
    html = (run / "report.html").read_text()
    found = re.search(r'<div class="standing (\w+)" id="standing">([^<]*)</div>', html)
    assert found and found.start() < html.index('id="recommendation"'), "the standing is not above the answer"
    return found.group(1), found.group(2).replace("&#39;", "'")


def test_a_verified_run_says_so_first_and_exits_with_its_verdicts_code(tmp_path: Path, allowed: Path) -> None:
    run = demo_copy(tmp_path)
    result = kvprobe("report", run, "--allowed-signers", allowed)
    assert result.exit_code == 1, result.output  # the verdict's own: bfloat16 is rejected
    first = result.stdout.splitlines()[0]
    assert first == (f"signature verified: signed by {KEY.fingerprint} (tester in {allowed}); every decision "
                     "re-derived from the recorded numbers")
    assert (run / "report.md").read_text().splitlines()[2] == f"**{first}**"
    assert standing_in_html(run) == ("verified", first)
    assert f"verdict: {run / 'verdict.json'} (signature verified)" in result.stderr


@pytest.mark.parametrize("resign", [False, True], ids=["signature-broken", "re-signed-by-the-trusted-key"])
def test_an_edited_decision_is_never_shown_as_signed(tmp_path: Path, allowed: Path, resign: bool) -> None:
    """The issue's edit: bfloat16 adopted above four failing bars, and here the exit code and recommendation
    edited to match, so only the check can make the exit non-zero. Re-signed by the trusted key, the signature
    holds and the decisions still do not follow from the checks."""
    run = demo_copy(tmp_path)
    path = run / "verdict.json"
    verdict = orjson.loads(path.read_bytes())
    verdict["decisions"]["bfloat16"]["decision"] = "adopt"
    verdict["recommendation"] |= {"server": "bfloat16", "change": True}
    verdict["exit_code"] = 0
    path.write_bytes(verdict_bytes(verdict))
    if resign:
        sign_file(path, KEY)
    result = kvprobe("report", run, "--allowed-signers", allowed)
    assert result.exit_code == 1, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("NOT verified: ")
    assert "bfloat16: recorded decision 'adopt', the numbers give 'reject'" in first
    assert ("the verdict was changed after it was signed" in first) != resign
    assert "bfloat16: adopt" in result.stdout  # what the file says is shown, under the line that says it does not hold
    md = (run / "report.md").read_text()
    assert md.splitlines()[2] == f"**{first}**" and "Signed (" not in md
    assert standing_in_html(run) == ("bad", first)
    assert f"verdict: {path} (NOT verified)" in result.stderr
    quiet = kvprobe("report", run, "--allowed-signers", allowed, "-q")
    assert quiet.exit_code == 1 and quiet.stdout == "bfloat16: adopt\n"
    assert quiet.stderr.startswith("NOT verified: ")


def test_report_quiet_exits_with_the_verdicts_code(tmp_path: Path, allowed: Path) -> None:
    """`-q` prints the decision lines only and exits as eval would: 1 for the demo's reject, 0 for an adopt."""
    rejected = kvprobe("report", demo_copy(tmp_path), "--allowed-signers", allowed, "-q")
    assert (rejected.exit_code, rejected.stdout, rejected.stderr) == (1, "bfloat16: reject\n", "")
    run = Measurements().write(tmp_path / "adopt")
    write_verdict(run)
    sign_file(run.path / "verdict.json", KEY)
    adopted = kvprobe("report", run.path, "--allowed-signers", allowed, "-q")
    assert (adopted.exit_code, adopted.stdout, adopted.stderr) == (0, "cand: adopt\n", "")
    (run.path / "verdict.json.sig").unlink()
    unsigned = kvprobe("report", run.path, "--allowed-signers", allowed, "-q")
    assert unsigned.exit_code == 1 and unsigned.stdout == "cand: adopt\n"
    assert "no signature: the verdict is unsigned" in unsigned.stderr


def digests(root: Path) -> dict[str, str]:
    """Every file and folder under `root`, each file with the SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "unfinished"])
def test_show_leaves_the_run_byte_identical(tmp_path: Path, allowed: Path, finished: bool) -> None:
    run = demo_copy(tmp_path)
    if not finished:  # as a run still measuring is: no verdict yet
        (run / "verdict.json").unlink()
        (run / "verdict.json.sig").unlink()
    before = digests(run)
    for view in ([], ["-v"], ["-q"]):
        result = kvprobe("show", run, "--allowed-signers", allowed, *view)
        assert result.exit_code == 1, result.output  # a reject; the unfinished one is also unsigned
        assert "bfloat16: reject" in result.stdout and "report:" not in result.output
    assert digests(run) == before
    first = kvprobe("show", run, "--allowed-signers", allowed).stdout.splitlines()[0]
    assert first.startswith("signature verified: " if finished else "NOT verified: no verdict.json")


def test_a_verdict_that_cannot_be_read_is_not_shown(tmp_path: Path, allowed: Path) -> None:
    run = demo_copy(tmp_path)
    (run / "verdict.json").write_text("{")
    for command in ("report", "show"):
        result = kvprobe(command, run, "--allowed-signers", allowed)
        assert result.exit_code == 1 and result.stdout == ""
        assert re.fullmatch(r"error: NOT verified: .*: not JSON: .*: nothing to show; move verdict.json aside and "
                            r"`kvprobe report` decides from the measurements \(unsigned\)\n", result.stderr)
    assert (run / "report.md").read_bytes() == (DEMO / "report.md").read_bytes()  # not re-rendered
