"""The testbed on real vLLM CPU servers: the server that cannot start on this CPU (or on the AVX2
path) is refused with the engine's own reason and leaves nothing running; the demo evaluates what
started and says what was left out.

A candidate that frees nothing (`no_gain`) is judged on real servers in tests/integration/
test_default_settings_hybrid.py (float16 KV against the bfloat16 hybrid: the same bytes) and, where fp8
runs, tests/integration/test_hybrid_lever.py; the testbed's own no_gain pair cost two more starts (100 s)
on the AVX2 kind for the same finding."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.testbed import StartRefused, Testbed, start
from kvprobe.testbed.demo import CAPACITY_ONLY_TOKENS
from kvprobe.testbed.launcher import healthy, port_free, status

pytestmark = pytest.mark.integration

REFUSAL = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def test_the_server_that_cannot_start_is_refused_with_the_engines_reason(bed: Testbed) -> None:
    spec = bed["no_start"].spec
    with pytest.raises(StartRefused) as refused:
        start(spec, reuse=False)
    assert refused.value.reason == REFUSAL
    assert port_free(spec.port) and not healthy(spec.url)
    assert spec.port not in [row["port"] for row in status()]  # no state, no process group left
    # remembered: the next start of the same spec on this machine (the demo's, below) says so at once
    t0 = time.monotonic()
    with pytest.raises(StartRefused) as again:
        start(spec)
    assert again.value.reason == REFUSAL and time.monotonic() - t0 < 5
    assert "it was not started again" in str(again.value)


def test_the_demo_evaluates_what_started_and_says_what_was_left_out(bed: Testbed, start_servers,
                                                                     tmp_path: Path) -> None:
    # Started through the fixture first, so the session stops them; the demo then reuses them.
    servers = start_servers([sc.spec for sc in bed.demo() if sc.key != "no_start"], CAPACITY_ONLY_TOKENS)
    # Each server's worker may run on every core (vLLM pins them all to core 0, where one starved another for
    # 300 s on an AVX2 EPYC): THREAD_ENV reached the engine.
    every_core = os.sched_getaffinity(0)
    for server in servers:
        workers = _workers(server.pid)
        assert workers, f"no VLLM::Worker process in {server.url}'s process group"
        assert all(os.sched_getaffinity(w) == every_core for w in workers), (server.url, every_core)
    out = tmp_path / "run"
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    result = CliRunner(env=env).invoke(main, ["demo", "--probes", "capacity", "--out", str(out)],
                                       catch_exceptions=False)
    assert result.exit_code in (0, 1), result.stderr  # the decisions, never "cannot run"
    verdict = json.loads((out / "verdict.json").read_text())
    expected = [sc.name for sc in bed.demo() if sc.key != "no_start" or bed.isa == "avx512"]
    assert list(verdict["decisions"]) == expected[1:] and verdict["reference"] == "auto"
    assert all(d["capacity_ratio"] == 2.0 for d in verdict["decisions"].values())
    left_out = verdict["run"]["left_out"]
    report = (out / "report.md").read_text()
    if bed.isa == "avx2":
        line = f"fp8 KV does not start on this CPU: {REFUSAL}"
        assert left_out == [{"name": "fp8", "scenario": "no_start", "reason": line}]
        assert line in " ".join(result.stderr.split())
        assert "Left out" in report and line in report
    else:
        assert left_out == [] and "Left out" not in report


def _workers(group: int) -> list[int]:
    """The pids of the VLLM::Worker processes in process group `group` (a server's)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone since the listing
        comm, rest = text[text.index("(") + 1: text.rindex(")")], text[text.rindex(")") + 2:].split()
        if comm.startswith("VLLM::Worker") and int(rest[2]) == group:
            found.append(int(stat.parent.name))
    return found
