"""End to end on the real vLLM CPU trio (the reference, a lossy 2x and, where this CPU runs one, a
lossless 2x candidate; see kvprobe.testbed.scenarios): `eval` writes a
signed verdict and the reports, `kvprobe verify` and `ssh-keygen -Y verify` accept it, and a run
killed mid-way and resumed reaches the same decisions as an uninterrupted one.

The run uses the canary's small probe settings so it takes minutes; whichever probes are installed
run (capacity at least)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from scenarios import require, trio

from kvprobe.evaluate.canary import CANARY_AGREEMENT, CANARY_LOAD, CANARY_NEEDLE, CANARY_PERPLEXITY, canary_probes
from kvprobe.verdict.sign import NAMESPACE

pytestmark = [pytest.mark.integration, pytest.mark.serves_tokens(250_000)]  # logged in conftest

QUALITY_PROBES = {"perplexity", "needle"}


def _toml_table(name: str, values: dict) -> str:
    def fmt(v):
        return "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else str(v)

    return f"[{name}]\n" + "".join(f"{k} = {fmt(v)}\n" for k, v in values.items())


@pytest.fixture(scope="module")
def servers_file(vllm_servers, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "servers.toml"
    servers = "".join(f'[[server]]\nname = "{s["name"]}"\nurl = "{s["url"]}"\nrole = "{s["role"]}"\n\n'
                      for s in trio(vllm_servers))
    path.write_text("\n".join([_toml_table("perplexity", CANARY_PERPLEXITY), _toml_table("agreement", CANARY_AGREEMENT),
                               _toml_table("needle", CANARY_NEEDLE),
                               # a fixed design of 2 blocks, advisory: these tests are of signing and resuming, and
                               # the sequential design's own are in tests/integration/test_speed_decision.py. Gating,
                               # two blocks on a busy 2-core box decided fp8's speed one way in one run and the other
                               # in its resumed twin (ratio 0.93 [0.26, 3.39] vs 0.905 [0.875, 0.936], t 18 > 12.71)
                               _toml_table("load", {**CANARY_LOAD, "repeats": 2, "advisory": "true"}), servers]))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The signing key is created in a private config dir, never the user's."""
    out = dict(os.environ)
    out["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg"))
    out.pop("KVPROBE_SIGNING_KEY", None)
    out.pop("KVPROBE_ALLOWED_SIGNERS", None)
    return out


def kvprobe(*args: str, env: dict[str, str], timeout: float = 3000) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvprobe.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def decisions(run_dir: Path) -> dict:
    v = orjson.loads((run_dir / "verdict.json").read_bytes())
    return {"decisions": {n: (d["decision"], d["capacity_ratio"]) for n, d in v["decisions"].items()},
            "recommendation": v["recommendation"]["server"], "exit_code": v["exit_code"]}


@pytest.fixture(scope="module")
def full_run(servers_file, env, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "full"
    probes = ",".join(canary_probes())
    result = kvprobe("eval", "--servers", str(servers_file), "--out", str(out), "--probes", probes, env=env)
    return out, result, probes


def test_eval_writes_a_signed_verdict_and_reports(full_run, vllm_servers, bed):
    out, result, probes = full_run
    assert result.returncode in (0, 1), result.stderr
    for name in ("verdict.json", "verdict.json.sig", "report.md", "report.html", "plots/capacity.png"):
        assert (out / name).is_file(), name
    v = orjson.loads((out / "verdict.json").read_bytes())
    assert v["reference"] == "auto" and v["pin"]["valid"] is True
    assert v["servers"]["auto"]["kv_cache_tokens"] == bed["reference"].kv_tokens
    candidates = [s["name"] for s in trio(vllm_servers) if s["role"] == "candidate"]
    for cand in candidates:
        assert v["decisions"][cand]["capacity_ratio"] == 2.0
        assert f"{cand}:" in result.stdout
    assert v["exit_code"] == result.returncode
    assert "report:" in result.stderr and "report.html" in result.stderr
    ran = set(probes.split(","))
    if not ran & QUALITY_PROBES:
        # Only capacity measured: no candidate is adopted on capacity alone, and the run says why.
        assert {d["decision"] for d in v["decisions"].values()} == {"inconclusive"}
        assert v["probes_status"]["perplexity"] == "not run" and result.returncode == 0


def test_the_lossy_2x_candidate_is_rejected_on_quality(full_run, vllm_servers):
    out, _, probes = full_run
    if not set(probes.split(",")) & QUALITY_PROBES:
        pytest.skip(f"no quality probe installed among {probes}")
    v = orjson.loads((out / "verdict.json").read_bytes())
    lossy = vllm_servers["lossy_2x"].spec.kv_cache_dtype
    # The KV format that wrecks the model on this CPU build must be caught by the quality probes.
    assert v["decisions"][lossy]["decision"] == "reject", v["decisions"][lossy]
    assert any(c["outcome"] == "fail" and c["probe"] in QUALITY_PROBES for c in v["decisions"][lossy]["checks"])


def test_the_lossless_2x_candidate_passes_quality(full_run, vllm_servers, bed):
    require(bed, "lossless_2x")
    out, _, probes = full_run
    if not set(probes.split(",")) & QUALITY_PROBES:
        pytest.skip(f"no quality probe installed among {probes}")
    v = orjson.loads((out / "verdict.json").read_bytes())
    lossless = vllm_servers["lossless_2x"].spec.kv_cache_dtype
    assert v["decisions"][lossless]["decision"] in ("adopt", "inconclusive")
    assert not any(c["outcome"] == "fail" and c["probe"] in QUALITY_PROBES
                   for c in v["decisions"][lossless]["checks"])


def test_verify_and_ssh_keygen_accept_the_eval_verdict(full_run, env, tmp_path):
    out, _, _ = full_run
    result = kvprobe("verify", str(out), env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "signature ok" in result.stdout and "decisions re-derived" in result.stdout
    ssh_keygen = shutil.which("ssh-keygen")
    if ssh_keygen is None:
        pytest.skip("ssh-keygen not installed")
    allowed = Path(env["XDG_CONFIG_HOME"]) / "kvprobe" / "allowed_signers"
    principal = allowed.read_text().split()[0]
    with open(out / "verdict.json", "rb") as fh:
        check = subprocess.run([ssh_keygen, "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", NAMESPACE,
                                "-s", str(out / "verdict.json.sig")], stdin=fh, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    tampered = tmp_path / "verdict.json"
    data = (out / "verdict.json").read_bytes()
    assert b'"kv_cache_tokens": ' in data
    tampered.write_bytes(data.replace(b'"kv_cache_tokens": ', b'"kv_cache_tokens": 1', 1))
    shutil.copy(out / "verdict.json.sig", tmp_path / "verdict.json.sig")
    bad = kvprobe("verify", str(tampered), env=env, timeout=120)
    assert bad.returncode == 1 and "changed after it was signed" in bad.stderr


def _first_measurement(events: Path) -> bool:
    """True once a probe has recorded a measurement (beyond inventory and bookkeeping)."""
    if not events.exists():
        return False
    for line in events.read_bytes().splitlines():
        try:
            kind = orjson.loads(line).get("kind")
        except orjson.JSONDecodeError:
            continue
        if kind not in ("inventory", "pin", "probe_done", "broken"):
            return True
    return False


@pytest.fixture(scope="module")
def killed_and_resumed(full_run, servers_file, env, tmp_path_factory):
    """The full run's twin, killed after its first measurement and finished with --resume: a module fixture,
    so `compare` can read it beside the full run."""
    _, _, probes = full_run
    out = tmp_path_factory.mktemp("runs") / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "kvprobe.cli", "eval", "--servers", str(servers_file),
                             "--out", str(out), "--probes", probes], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    long_probes = set(probes.split(",")) - {"capacity"}
    deadline = time.monotonic() + 1200
    # With a probe that records measurements, kill after its first one; with capacity alone the
    # only long step is the inventory's first-prefill smoke, so kill inside it.
    while time.monotonic() < deadline and proc.poll() is None:
        if (long_probes and _first_measurement(out / "events.jsonl")) or (
                not long_probes and (out / "run.json").exists()):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "verdict.json").exists()
    resumed = kvprobe("eval", "--servers", str(servers_file), "--resume", str(out), env=env)
    return out, resumed


def test_a_killed_and_resumed_run_reaches_the_same_decisions(full_run, killed_and_resumed, env):
    full, _, probes = full_run
    out, resumed = killed_and_resumed
    assert resumed.returncode in (0, 1), resumed.stderr
    assert "(resumed)" in resumed.stderr
    meta = orjson.loads((out / "run.json").read_bytes())
    assert len(meta["resumed"]) == 1 and meta["probes"] == probes.split(",")
    assert decisions(out) == decisions(full)
    assert kvprobe("verify", str(out), env=env, timeout=120).returncode == 0


def test_compare_the_full_run_with_its_killed_and_resumed_twin(full_run, killed_and_resumed, env):
    """Two real signed runs of the same servers and settings: compare verifies both, finds the same decisions
    and capacities, and pairs the needle cases both asked (the same plan, so every one of them)."""
    full, _, probes = full_run
    out, resumed = killed_and_resumed
    assert resumed.returncode in (0, 1), resumed.stderr
    result = kvprobe("compare", str(full), str(out), "--json", env=env, timeout=300)
    assert result.returncode in (0, 1), result.stderr
    data = orjson.loads(result.stdout)
    assert data["a"]["verified"] is True and data["b"]["verified"] is True
    assert data["reference"] == "auto" and data["knob"] == "kv_cache_dtype"
    for cand, c in data["candidates"].items():
        assert not c["decision"]["changed"] and not c["decision"]["worse"], (cand, c["decision"])
        assert c["capacity_ratio"] == {"a": 2.0, "b": 2.0, "changed": False}
    # Same decisions, so a regression can only be a noisy check of a candidate rejected in both runs
    # (a pass -> fail anywhere else would have changed its decision); exit 1 says exactly that.
    assert result.returncode == (1 if data["regressions"] else 0)
    for line in data["regressions"]:
        cand = line.split(":")[0]
        assert line.endswith("pass -> fail") and data["candidates"][cand]["decision"]["a"] == "reject", line
    if "needle" in probes.split(","):
        needle_rows = [r for r in data["paired"] if r["evidence"] == "needle hits"]
        assert needle_rows and all(r["pairs"] == CANARY_NEEDLE["count"] and not r["note"] for r in needle_rows)
    text = kvprobe("compare", str(full), str(out), env=env, timeout=300)
    assert text.returncode == result.returncode
    said = " ".join(text.stdout.split())  # compare wraps at the terminal's width (120 in a pipe)
    assert "signed by" in said and "decisions re-derived" in said
    assert text.stdout.startswith("no regression:") == (result.returncode == 0)  # the conclusion first


def test_resume_refuses_a_changed_servers_file(full_run, servers_file, env, tmp_path):
    full, _, _ = full_run
    changed = tmp_path / "servers.toml"
    changed.write_text("[bars]\nperplexity_delta_max = 0.5\n\n" + servers_file.read_text())
    result = kvprobe("eval", "--servers", str(changed), "--resume", str(full), env=env, timeout=120)
    assert result.returncode == 2
    assert "differs from the one this run started with (at bars)" in result.stderr


def test_canary_against_a_verified_baseline(full_run, servers_file, env, tmp_path):
    full, _, _ = full_run
    out = tmp_path / "canary"
    # A budget keeps this third canary run of the suite short; drift is read from whatever it measured.
    result = kvprobe("canary", "--servers", str(servers_file), "--baseline", str(full), "--out", str(out),
                     "--budget", "60s", env=env)
    assert "baseline" in result.stderr and "signature ok" in result.stderr
    drift = orjson.loads((out / "canary.json").read_bytes())
    capacity_drift = [i for i in drift["items"] if i["what"] == "kv_cache_tokens"]
    assert capacity_drift == []  # same servers, same KV space: same capacity
    assert result.returncode == (1 if drift["fails"] else decisions(out)["exit_code"])
    assert (out / "verdict.json.sig").is_file()

    tampered = tmp_path / "tampered"
    shutil.copytree(full, tampered)
    data = (tampered / "verdict.json").read_bytes()
    (tampered / "verdict.json").write_bytes(data.replace(b'"exit_code": ', b'"exit_code":  ', 1))
    bad = kvprobe("canary", "--servers", str(servers_file), "--baseline", str(tampered), env=env, timeout=120)
    assert bad.returncode == 2 and "--baseline" in bad.stderr and "changed after it was signed" in bad.stderr


def test_ctrl_c_keeps_the_run_and_says_how_to_resume(servers_file, env, tmp_path, terminal_sigint):
    # Interrupted after its first measurement, with perplexity still to score on three servers: it must stop
    # unsigned. The suite may run in the background (`.ci/run &`, nohup), where the shell starts it with
    # SIGINT ignored and every child inherits that, as Unix means it to: kvprobe then rightly ignores Ctrl-C
    # and the run signs its verdict (it did, 2026-12-04). So the child starts with SIGINT's default, as an
    # operator's terminal gives it (the terminal_sigint fixture).
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "kvprobe.cli", "eval", "--servers", str(servers_file),
                             "--out", str(out), "--probes", "capacity,perplexity"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and not _first_measurement(out / "events.jsonl") and time.monotonic() < deadline:
        time.sleep(0.02)
    # How the child stands towards SIGINT when it is sent (bit 1 of each mask), for the failure message.
    status = Path(f"/proc/{proc.pid}/status")
    masks = [line for line in (status.read_text().splitlines() if status.exists() else [])
             if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    kinds = [orjson.loads(line).get("kind") for line in (out / "events.jsonl").read_bytes().splitlines()]
    assert proc.returncode == 130, f"{stderr}\nevents: {kinds}\nchild at the signal: {masks}"
    assert "interrupted" in stderr and f"--resume {out}" in stderr
    assert (out / "run.json").is_file() and not (out / "verdict.json").exists()
