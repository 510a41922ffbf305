"""memmap against real vLLM CPU servers: predicted kv_cache_size_tokens within 1% of /metrics.

- dense: the shared needle-llama trio (auto, fp8, int8_per_token_head; read-only: /metrics and /v1/models);
- hybrid: the tiny random NemotronH served for real by this test at max_model_len 8192, auto then
  fp8 (two starts, one at a time, each stopped at the end). At 8192 tokens the two dtypes differ
  (1.40x, not 2x) and the attention block is raised to 512 / 1,024 tokens, so both the alignment and
  the dilution by Mamba state are checked; the 512-token case is checked against the captures.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from tiny_hybrid import CONFIG as HYBRID_CONFIG
from tiny_hybrid import tiny_hybrid_model

from kvprobe.memmap import Settings, build
from kvprobe.scrape import parse_metrics
from kvprobe.servers.launcher import NEEDLE_LLAMA, ServerSpec, free_port, start

pytestmark = pytest.mark.integration


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
    for dtype, server in vllm_servers.items():
        tokens, labels, length = measured(server.url)
        settings = Settings(kv_memory_bytes=int(labels["kv_cache_memory_bytes"]))
        plan = build(Path(NEEDLE_LLAMA) / "config.json", [dtype], length, settings).plans[dtype]
        print(f"needle-llama {dtype} @ {length}: predicted {plan.kv_cache_tokens:,} measured {tokens:,}")
        assert abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens
        assert plan.num_blocks == int(labels["num_gpu_blocks"])


def test_hybrid_prediction_matches_real_servers() -> None:
    model = tiny_hybrid_model()
    mm = build(HYBRID_CONFIG, ["auto", "fp8"], 8192)
    seen: dict[str, int] = {}
    for dtype in ("auto", "fp8"):  # one at a time: each server holds ~3.4 GB
        spec = ServerSpec(port=free_port(), model=model, served_model_name="tiny-hybrid", reasoning_parser=None,
                          max_model_len=8192, kv_cache_dtype=dtype)
        server = start(spec, reuse=False)
        try:
            tokens, labels, length = measured(server.url)
        finally:
            server.stop()
        plan = mm.plans[dtype]
        print(f"tiny-hybrid {dtype} @ {length}: predicted {plan.kv_cache_tokens:,} measured {tokens:,} "
              f"(block {plan.attention_block_size} vs {labels['block_size']})")
        assert length == 8192
        assert labels["cache_dtype"] == dtype
        assert abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens
        assert plan.attention_block_size == int(labels["block_size"])
        assert plan.num_blocks == int(labels["num_gpu_blocks"])
        seen[dtype] = tokens
    assert seen["fp8"] / seen["auto"] == pytest.approx(mm.ratio("fp8"), rel=0.01)


async def test_eval_capacity_carries_the_memory_map(vllm_servers, tmp_path: Path) -> None:
    from rich.console import Console

    from kvprobe.config import parse_config
    from kvprobe.evaluation import run_eval
    from kvprobe.store import RunDir

    config = parse_config({
        "model_config": str(Path(NEEDLE_LLAMA) / "config.json"),
        "server": [{"name": dtype, "url": server.url, "role": "reference" if dtype == "auto" else "candidate"}
                   for dtype, server in vllm_servers.items()],
    })
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(config, run, ["capacity"], Console(stderr=True))
    assert outcome.exit_code == 0
    memmap = run.read_json("capacity.json")["memmap"]
    for name, row in memmap["servers"].items():
        assert row["measured_kv_cache_tokens"] == row["predicted_kv_cache_tokens"], name
    assert memmap["explain"] == {}  # every candidate doubles capacity: nothing to explain
    assert memmap["conclusion"].startswith("Full-attention KV is all of each sequence's bytes at 8,192 tokens")
