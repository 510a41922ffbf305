"""The speed decision against a real vLLM server (kvprobe.stats.sequential, kvprobe.verdict.checks.speed): three names
for the one reference server. The twin is the same server under another name: an A/A pair, which must
never fail, and must pass within the design's 20 blocks wherever its blocks were quiet enough for that
(no proxy for these two: on a 2-core box a Python proxy's threads take the cores the server computes on).
The slow one goes through a pass-through proxy (tests/faultproxy.py) that holds every streamed event 2.5
times the server's own gap between tokens (measured on one stream), so it, not the server, sets the pace:
about half the output tokens/s (the ratio is printed). It must fail at an early look, and get no more blocks after.

kvprobe runs as the `kvprobe eval` command in its own process, as an operator runs it, so the proxy's
threads never share an interpreter with the client they time."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from faultproxy import Fault, FaultProxy

from kvprobe.stats import sequential
from kvprobe.testbed import LocalServer

pytestmark = [pytest.mark.integration, pytest.mark.serves_tokens(30_000)]  # logged in conftest

# A 20% bar, declared for this box: on a 2-core machine that the server shares with its client, runs of 16
# requests (3-4 s) spread by about 0.17 in block log ratio (measured on the AVX2 EPYC, 2026-12-03), and by 0.23
# on a host that stole the cores (a CI run, 2026-12-05). The robust design (kvprobe.stats.sequential.operating)
# passes an equal candidate within 20 blocks 0.96 of the time at 0.15, 0.90 at 0.17, 0.73 at 0.20, 0.56 at 0.23:
# so the twin must pass only where its own blocks' spread gives 0.95 or more (_equal_pass).
CONFIG = """
[bars]
throughput_drop_max = 0.20

[load]
agents = [4]
turns = 2
system_tokens = 64
tokens_per_turn = 64
max_output_tokens = 32
requests_per_case = 16
settle_s = 0.5
max_blocks = 20
look_every = 4

[[server]]
name = "ref"
url = "{ref}"
role = "reference"

[[server]]
name = "twin"
url = "{twin}"

[[server]]
name = "slow"
url = "{slow}"
"""


def _token_gap(url: str) -> float:
    """The server's mean gap between streamed tokens, from one 64-token answer: its span over its gaps. The
    client reads several events at once when they queue, so a median of the gaps between reads is 0 (it was,
    and the hold with it: the slowdown was the proxy's own, and noisy)."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 64,
            "ignore_eos": True, "stream": True, "temperature": 0}
    stamps = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def _equal_pass(load_json: Path, ref: str, cand: str, bar: float) -> tuple[float, float]:
    """The spread of the pair's block log ratios (output tokens/s, block by block), and the recorded
    design's P(pass | equal) at that spread (kvprobe.stats.sequential.operating, seeded)."""
    load = json.loads(load_json.read_text())

    def rates(name: str) -> list[float]:
        return [r["output_tokens_per_s"] for r in load["servers"][name]["cases"][0]["repeats"]]

    ratios = [math.log(c / r) for r, c in zip(rates(ref), rates(cand), strict=False)]
    spread = statistics.stdev(ratios)
    design = sequential.of_settings(load["design"])
    return spread, sequential.operating(design, spread, -math.log1p(-bar), 0.0, 4_000)[0]


def test_a_twin_passes_speed_and_a_slowed_candidate_fails(vllm_servers: dict[str, LocalServer],
                                                          tmp_path: Path) -> None:
    upstream = vllm_servers["reference"].url
    gap = _token_gap(upstream)
    hold = Fault(event_delay_s=2.5 * gap)
    with FaultProxy(upstream, {"/v1/chat/completions": hold}) as slow:
        cfg = tmp_path / "servers.toml"
        cfg.write_text(CONFIG.format(ref=upstream, twin=upstream, slow=slow))
        out = tmp_path / "run"
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "kvprobe.cli", "eval", "--servers", str(cfg), "--probes",
                               "load", "--out", str(out)], capture_output=True, text=True, timeout=1500)
        took = time.monotonic() - t0
    print(done.stderr[-4000:])
    print(f"token gap {gap * 1000:.1f} ms, held {hold.event_delay_s * 1000:.1f} ms per event; eval {took:.0f} s")
    assert done.returncode in (0, 1), done.stderr[-2000:]  # same server, same capacity: no_gain for both
    verdict = json.loads((out / "verdict.json").read_text())

    def endpoint(name: str) -> dict:
        return next(c for c in verdict["decisions"][name]["checks"] if c["id"] == "load.endpoint.throughput_drop")

    slow_check, twin_check = endpoint("slow"), endpoint("twin")
    assert slow_check["outcome"] == "fail", slow_check["text"]
    assert slow_check["ratio"] < 0.7  # held on purpose: well past the 20% bar
    # A 30% loss is settled before the design's last look (20 blocks). Which look depends on the box's noise: at 8
    # on most runs; at 12 on an AVX2 EPYC, 2026-12-07 (t = 5.21 against the first look's boundary 6.20).
    assert slow_check["sequential"]["look"]["n"] < 20
    # The twin is equal by construction: it never fails, and it passes wherever the box was quiet enough for
    # this design to pass an equal candidate (P >= 0.95 at the spread its own blocks measured). On a host
    # that steals the cores, blocks spread 0.23 (a CI run: 20 blocks, t 3.82 against 3.92), and then
    # inconclusive is the honest answer, with the blocks it would take.
    assert twin_check["outcome"] in ("pass", "inconclusive"), twin_check["text"]
    spread, p_pass = _equal_pass(out / "load.json", "ref", "twin", 0.20)
    print(f"twin blocks spread {spread:.3f} (log ratio): the design passes an equal candidate {p_pass:.3f}")
    if p_pass >= 0.95:
        assert twin_check["outcome"] == "pass", twin_check["text"]
    else:
        assert twin_check["outcome"] == "pass" or "inconclusive (all 20 blocks used" in twin_check["text"], \
            twin_check["text"]
    assert twin_check["sequential"]["look"]["n"] in twin_check["sequential"]["design"]["looks"]
    # once failed, the slow candidate gets no more blocks; the reference runs every block the twin needs
    cases = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    blocks = {name: {e["repeat"] for e in cases if e["kind"] == "load_case" and e["server"] == name}
              for name in ("ref", "twin", "slow")}
    assert max(blocks["slow"]) < max(blocks["twin"]) or slow_check["sequential"]["look"]["n"] == \
        twin_check["sequential"]["look"]["n"]
    assert blocks["ref"] >= blocks["twin"]
    # live progress said where the decision stood at each look
    assert "twin throughput drop, sweep mean of 1 case: ratio" in " ".join(done.stderr.split())
