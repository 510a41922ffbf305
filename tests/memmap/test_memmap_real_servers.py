"""memmap against real vLLM CPU servers: predicted kv_cache_size_tokens within 1% of /metrics.

- dense: the shared needle-llama trio of this CPU (kvprobe.servers.testbed; read-only: /metrics and
  /v1/models), with each server's weight dtype;
- hybrid: the tiny random NemotronH served for real by this test at max_model_len 8192, the reference
  then a candidate that changes capacity on this CPU (two starts, one at a time, each stopped at the
  end): fp8 KV where the CPU runs it (1.40x, not 2x, with the attention block raised to 512 / 1,024
  tokens), else a float16 SSM state (the Mamba page shrinks, so the block does too). Both the
  alignment and the dilution by Mamba state are checked; the 512-token case against the captures.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from scenarios import trio
from tiny_hybrid import CONFIG as HYBRID_CONFIG
from tiny_hybrid import tiny_hybrid_model

from kvprobe.memmap import Settings, build
from kvprobe.scrape import parse_metrics
from kvprobe.servers.launcher import NEEDLE_LLAMA, free_port, start
from kvprobe.servers.testbed import hybrid_specs

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
    for server in {id(s): s for s in vllm_servers.values()}.values():
        dtype = server.spec.kv_cache_dtype
        tokens, labels, length = measured(server.url)
        settings = Settings(kv_memory_bytes=int(labels["kv_cache_memory_bytes"]), model_dtype=server.spec.dtype)
        plan = build(Path(NEEDLE_LLAMA) / "config.json", [dtype], length, settings).plans[dtype]
        print(f"needle-llama {dtype} @ {length}: predicted {plan.kv_cache_tokens:,} measured {tokens:,}")
        assert abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens
        assert plan.num_blocks == int(labels["num_gpu_blocks"])


def _knob(spec) -> tuple[str, str]:
    """(kv dtype, ssm state dtype) of a hybrid spec."""
    args = list(spec.extra_args)
    ssm = args[args.index("--mamba-ssm-cache-dtype") + 1] if "--mamba-ssm-cache-dtype" in args else "auto"
    return spec.kv_cache_dtype, ssm


def test_hybrid_prediction_matches_real_servers() -> None:
    model = tiny_hybrid_model()
    seen: dict[str, int] = {}
    predicted = {}
    specs = hybrid_specs(free_port(), free_port(), model, served_model_name="tiny-hybrid", reasoning_parser=None,
                         max_model_len=8192)
    for role, spec in zip(("reference", "candidate"), specs, strict=True):  # one at a time: ~3.4 GB each
        kv, ssm = _knob(spec)
        plan = build(HYBRID_CONFIG, [kv], 8192, Settings(mamba_ssm_cache_dtype=ssm)).plans[kv]
        server = start(spec, reuse=False)
        try:
            tokens, labels, length = measured(server.url)
        finally:
            server.stop()
        print(f"tiny-hybrid {kv} ssm {ssm} @ {length}: predicted {plan.kv_cache_tokens:,} measured {tokens:,} "
              f"(block {plan.attention_block_size} vs {labels['block_size']})")
        assert length == 8192
        assert labels["cache_dtype"] == kv
        assert labels["mamba_ssm_cache_dtype"] == ("float32" if ssm == "auto" else ssm)  # NemotronH: float32
        assert abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens
        assert plan.attention_block_size == int(labels["block_size"])
        assert plan.num_blocks == int(labels["num_gpu_blocks"])
        seen[role], predicted[role] = tokens, plan.kv_cache_tokens
    assert seen["candidate"] > seen["reference"]  # the knob moves capacity on this CPU...
    assert seen["candidate"] / seen["reference"] == pytest.approx(  # ...by what the memory map predicts
        predicted["candidate"] / predicted["reference"], rel=0.01)


async def test_eval_capacity_carries_the_memory_map(vllm_servers, tmp_path: Path) -> None:
    from rich.console import Console

    from kvprobe.config import parse_config
    from kvprobe.evaluation import run_eval
    from kvprobe.store import RunDir

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
