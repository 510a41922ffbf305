"""`kvprobe eval` with `model_config`: the capacity summary carries the memory map, and a no-gain
candidate is explained by it. The servers are replays of the real hybrid captures (512 tokens)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from replay import MultiReplay, Replay
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.errors import ConfigError
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.store import RunDir

HYBRID = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "hybrid-nemotronh"


def hybrid_replay(dtype: str) -> Replay:
    """A server answering with the hybrid's real /metrics and /v1/models (the rest from auto-8101)."""
    server = Replay("auto-8101")
    metrics = (HYBRID / f"metrics-{dtype}-maxlen512.txt").read_bytes()
    models = (HYBRID / f"models-{dtype}-maxlen512.json").read_bytes()
    server.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, content=metrics)
    server.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, content=models)
    return server


def config(model_config: str) -> dict:
    return {
        "model_config": model_config,
        "server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                   {"name": "fp8", "url": "http://127.0.0.1:8102"}],
    }


async def evaluate(tmp_path: Path, model_config: str):
    transport = MultiReplay({"127.0.0.1:8101": hybrid_replay("auto"),
                             "127.0.0.1:8102": hybrid_replay("fp8")}).transport()
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(parse_config(config(model_config)), run, ["capacity"], Console(stderr=True),
                             transport=transport)
    return run, outcome


async def test_capacity_summary_has_the_memory_map(tmp_path: Path) -> None:
    run, outcome = await evaluate(tmp_path, str(HYBRID / "config.json"))
    assert outcome.exit_code == 0
    memmap = run.read_json("capacity.json")["memmap"]
    assert memmap["max_model_len"] == 512  # taken from the reference's /v1/models
    assert memmap["settings"]["kv_memory_bytes"] == 1 << 30  # from cache_config_info
    assert memmap["settings"]["mamba_ssm_cache_dtype"] == "float32"
    for name in ("auto", "fp8"):
        row = memmap["servers"][name]
        assert row["measured_kv_cache_tokens"] == 80_659
        assert row["predicted_kv_cache_tokens"] == 80_659
        assert row["error_pct"] == 0.0
    assert set(memmap["dtypes"]) == {"auto", "fp8"}
    # fp8 frees nothing here, and the memory map says why.
    assert "auto" not in memmap["explain"]
    assert memmap["explain"]["fp8"].startswith("fp8 gives 1.00x the capacity of auto, under the 1.05x bar; "
                                               "memmap predicted 1.00x. Mamba2 state is 92%")
    assert (run.path / memmap["chart"]).read_bytes()[:4] == b"\x89PNG"


async def test_an_unreadable_model_config_stops_the_run_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        await evaluate(tmp_path, str(tmp_path / "missing.json"))
    missing = tmp_path / "missing.json"
    assert err.value.problems == [f"servers.toml model_config {missing}: {missing}: "
                                  "cannot read the model config: No such file or directory"]
    # What was measured is kept.
    kept = RunDir.open(tmp_path / "run")
    assert kept.read_json("capacity.json")["servers"]["auto"]["kv_cache_tokens"] == 80_659
    assert (tmp_path / "run" / "inventory" / "fp8.json").exists()


async def test_without_model_config_there_is_no_memory_map(tmp_path: Path) -> None:
    transport = MultiReplay({"127.0.0.1:8101": hybrid_replay("auto"),
                             "127.0.0.1:8102": hybrid_replay("fp8")}).transport()
    cfg = config("x")
    del cfg["model_config"]
    run = RunDir.create(tmp_path / "run")
    await run_eval(parse_config(cfg), run, ["capacity"], Console(stderr=True), transport=transport)
    assert "memmap" not in run.read_json("capacity.json")
