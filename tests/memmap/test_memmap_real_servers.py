"""memmap against real vLLM CPU servers: predicted kv_cache_size_tokens within 1% of /metrics, on the
shared needle-llama trio of this CPU (kvprobe.testbed.scenarios; read-only: /metrics and /v1/models), with
each server's weight dtype.

The hybrid's prediction is checked on real servers where they already run: tests/integration/
test_hybrid_lever.py (needle-hybrid at 512 tokens: four servers, float32 and float16 SSM state, prefix
caching on and off; tokens, attention block and block count). The 8,192-token alignment (fp8's block
raised to 1,024 tokens) is checked against the captures in tests/memmap/test_memmap_lever.py. A separate
pair of tiny-hybrid starts at 8,192 tokens here cost 100 s of CI for what those two already show.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from scenarios import trio

from kvprobe.memmap import Settings, build
from kvprobe.server.metrics import parse_metrics
from kvprobe.testbed.launcher import NEEDLE_LLAMA

pytestmark = [pytest.mark.integration, pytest.mark.serves_tokens(20_000)]  # logged in conftest


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def measured(url: str) -> tuple[int, dict[str, str], int]:
    """(kv_cache_size_tokens, cache_config_info labels, max_model_len) as the server reports them."""
    snap = parse_metrics(get(f"{url}/metrics"))
    cap = snap.capacity()
    assert cap is not None and not cap.estimate, "the server must report kv_cache_size_tokens"
    models = json.loads(get(f"{url}/v1/models"))["data"]
    return cap.kv_cache_tokens, snap.cache_config or {}, models[0]["max_model_len"]


def test_dense_prediction_matches_the_shared_servers(vllm_servers) -> None:
    for server in {id(s): s for s in vllm_servers.values()}.values():
        dtype = server.spec.kv_cache_dtype
        tokens, labels, length = measured(server.url)
        settings = Settings(kv_memory_bytes=int(labels["kv_cache_memory_bytes"]), model_dtype=server.spec.dtype)
        plan = build(Path(NEEDLE_LLAMA) / "config.json", [dtype], length, settings).plans[dtype]
        print(f"needle-llama {dtype} @ {length}: predicted {plan.kv_cache_tokens:,} measured {tokens:,}")
        assert abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens
        assert plan.num_blocks == int(labels["num_gpu_blocks"])


async def test_eval_capacity_carries_the_memory_map(vllm_servers, tmp_path: Path) -> None:
    from rich.console import Console

    from kvprobe.config import parse_config
    from kvprobe.evaluate.orchestrate import run_eval
    from kvprobe.run.store import RunDir

    config = parse_config({
        "model_config": str(Path(NEEDLE_LLAMA) / "config.json"),
        "server": trio(vllm_servers),
    })
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(config, run, ["capacity"], Console(stderr=True))
    assert outcome.exit_code == 0
    memmap = run.read_json("capacity.json")["memmap"]
    for name, row in memmap["servers"].items():
        assert row["measured_kv_cache_tokens"] == row["predicted_kv_cache_tokens"], name
    assert memmap["explain"] == {}  # every candidate doubles capacity: nothing to explain
    assert memmap["conclusion"].startswith("Full-attention KV is all of each sequence's bytes at 8,192 tokens")
