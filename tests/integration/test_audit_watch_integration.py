"""`kvprobe audit --watch` on real vLLM CPU servers: one with a small KV pool (4,096 tokens: two full-length
requests at max_model_len 2,048) driven past it by 8 concurrent long requests while the audit watches,
and one left idle. The busy one must read KV-bound from its own counters, with the memory map's estimate
(its /v1/models root is the staged model folder, on this disk); the idle one must not.

Both servers are started on fresh ports for this module only and stopped in a finally, also when a start
or the audit fails halfway."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.scrape import RUNNING, parse_metrics
from kvprobe.servers import LaunchError, LocalServer, Testbed, start_each, stop
from kvprobe.servers.launcher import free_port

pytestmark = pytest.mark.integration

POOL_TOKENS = 4_096
MAX_MODEL_LEN = 2_048
PROMPT_TOKENS = 1_200  # three prompts fill ~30 of the pool's 32 blocks of 128; their decodes then need more
MAX_TOKENS = 600
CONCURRENT = 8
VOCAB = 4_096  # needle-llama's vocab_size


def _pool_bytes(bed: Testbed) -> int:
    """Bytes for POOL_TOKENS at the reference's bytes per token (the same arithmetic as the fill test)."""
    ref = bed["reference"]
    return POOL_TOKENS * 2**30 * ref.spec.kv_space_gib // ref.kv_tokens


def _load(url: str, model: str, stop_event: threading.Event) -> None:
    """One client: long requests back to back until told to stop. Random token ids, so no two prompts share
    a cached prefix block and each holds its own KV; ignore_eos, so each decodes all MAX_TOKENS."""
    rng = random.Random()
    with httpx.Client(timeout=300) as client:
        while not stop_event.is_set():
            prompt = [rng.randrange(16, VOCAB) for _ in range(PROMPT_TOKENS)]
            try:
                client.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                           "temperature": 0, "ignore_eos": True})
            except httpx.HTTPError:
                return  # the server is being stopped


def _running(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode()).total(RUNNING) or 0.0


@pytest.fixture(scope="module")
def audited(bed: Testbed) -> Iterator[dict[str, Any]]:
    """{"busy": row, "idle": row, "stdout": the table run's text}: the audit's JSON rows of both servers."""
    spec = replace(bed["reference"].spec, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=_pool_bytes(bed))
    specs = [replace(spec, port=free_port()), replace(spec, port=free_port())]
    stop_event = threading.Event()
    threads: list[threading.Thread] = []
    try:
        results = start_each(specs)
        for r in results:
            if isinstance(r, LaunchError):
                raise r
        busy, idle = (r for r in results if isinstance(r, LocalServer))
        threads = [threading.Thread(target=_load, args=(busy.url, spec.served_model_name, stop_event), daemon=True)
                   for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while _running(busy.url) < 1:  # the window should open on a server already at work
            assert time.monotonic() < deadline, "no request running 120 s after the load started"
            time.sleep(1)
        result = CliRunner().invoke(main, ["audit", "--json", "--no-smoke", "--watch", "20s", busy.url, idle.url],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        rows = {row["url"]: row for row in json.loads(result.stdout)["servers"]}
        yield {"busy": rows[busy.url], "idle": rows[idle.url]}
    finally:
        stop_event.set()
        for spec_ in specs:  # fresh ports: whatever runs on them is this module's
            stop(spec_.port)
        for t in threads:
            t.join(timeout=30)


def test_a_server_driven_past_its_pool_reads_kv_bound(audited: dict[str, Any]) -> None:
    pressure = audited["busy"]["pressure"]
    print(pressure["sentence"])
    assert pressure["verdict"] == "kv_bound", pressure
    assert pressure["sentence"].startswith("KV-bound: peak KV usage ")
    assert pressure["peak_kv_usage"] >= 0.5 and pressure["samples"] >= 8
    # the staged model folder is on this disk, so the memory map sizes a format half as wide
    assert pressure["two_x"]["ratio"] is not None, pressure["two_x"]
    assert "would let about" in pressure["sentence"] and pressure["more_sequences"] is not None


def test_an_idle_server_reads_not_enough_traffic_or_not_kv_bound(audited: dict[str, Any]) -> None:
    pressure = audited["idle"]["pressure"]
    assert pressure["verdict"] in ("no_traffic", "not_kv_bound"), pressure
    assert pressure["sentence"].startswith(("not enough traffic in the window to tell", "not KV-bound: "))
