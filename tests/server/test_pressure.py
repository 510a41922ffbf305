"""KV-pressure diagnosis (kvprobe.server.pressure) on windows of real /metrics captures whose gauges and counters
are edited to tell a story: the CPU capture taken under load (auto-8101/metrics_under_load: vLLM 0.32, 32
requests running, prefix-cache counters already counting) and the H200's (vllm-gpu-h200/auto/metrics.txt:
vLLM 0.26). Only the values of existing series change; every name and label is the server's own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from replay import MultiReplay, Replay, capture, dev_server_info
from replay_gpu import GPU_FIXTURES, PORTS, gpu_servers

from kvprobe.cli.audit import WATCHED
from kvprobe.server.client import Client
from kvprobe.server.inventory import Inventory, take_inventories
from kvprobe.server.metrics import only_families, parse_metrics
from kvprobe.server.pressure import Sample, TwoX, diagnose, increase, summarize, two_x_format

NEEDLE_LLAMA = Path(__file__).parents[2] / "demo" / "models" / "needle-llama" / "config.json"
CPU_LOAD = capture("auto-8101", "metrics_under_load").decode()
CPU_IDLE = capture("auto-8101", "metrics_fresh").decode()
GPU = (GPU_FIXTURES / "auto" / "metrics.txt").read_text()

USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CAPACITY = 'vllm:num_requests_waiting_by_reason{reason="capacity"}'
PREEMPTIONS = "vllm:num_preemptions_total"
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
PROMPT = "vllm:prompt_tokens_total"
GENERATED = "vllm:generation_tokens_total"


def edit(text: str, **values: float) -> str:
    """The capture with the value of each named series replaced. Keys are metric names; a key with a
    {label="x"} part only touches the series carrying that label."""
    wanted = {}
    for key, value in values.items():
        name, _, label = KEYS[key].partition("{")
        wanted[name] = [*wanted.get(name, []), (label.rstrip("}"), value)]
    out = []
    for line in text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        for label, value in wanted.get(name, []) if not line.startswith("#") else []:
            if not label or label in line:
                line = f"{line.rsplit(' ', 1)[0]} {value}"
        out.append(line)
    return "\n".join(out) + "\n"


KEYS = {"usage": USAGE, "running": RUNNING, "waiting": WAITING, "capacity": CAPACITY, "preemptions": PREEMPTIONS,
        "queries": QUERIES, "hits": HITS, "prompt": PROMPT, "generated": GENERATED}


def window(base: str, steps: list[dict[str, float]], every: float = 2.0) -> list[Sample]:
    """Samples as `audit --watch` reads them: only the families it watches."""
    base = only_families(base, WATCHED)
    return [Sample(i * every, parse_metrics(edit(base, **step))) for i, step in enumerate(steps)]


def ramp(n: int, **ends: tuple[float, float]) -> list[dict[str, float]]:
    """n steps, each value moving linearly from its first to its last figure."""
    return [{k: a + (b - a) * i / (n - 1) for k, (a, b) in ends.items()} for i in range(n)]


# A minute at 2 s: the pool fills, 12 preemptions, 5 requests queue for capacity, 32 keep running.
KV_BOUND = ramp(31, usage=(0.60, 0.97), running=(32, 32), waiting=(0, 5), capacity=(0, 5), preemptions=(0, 12),
                queries=(263_080, 363_080), hits=(238_080, 263_080), prompt=(0, 100_000), generated=(0, 4_000))


def test_a_full_pool_that_preempts_is_kv_bound_with_the_estimate_capped_by_the_queue() -> None:
    w = summarize(window(CPU_LOAD, KV_BOUND))
    assert w.seconds == 60 and w.samples == 31
    assert w.peak_kv_usage == pytest.approx(0.97) and w.running_at_peak == 32
    assert w.preemptions_per_min == pytest.approx(12.0)
    assert w.peak_waiting_capacity == 5 and w.peak_waiting == 5
    assert w.prefix_cache_hit_rate == pytest.approx(25_000 / 100_000)
    d = diagnose(w, TwoX(dtype="fp8", ratio=2.0))
    assert d.verdict == "kv_bound" and d.more_sequences == 5
    assert d.sentence == (
        "KV-bound: peak KV usage 97%, 12 preemptions/min, 5 requests waiting for capacity: a 2x KV format "
        "(fp8: 2.00x the KV tokens by the memory map) would let about 5 more sequences run (an estimate: "
        "32 running x (2.00 - 1) = 32, capped by the 5 waiting)")


def test_the_estimate_is_running_times_ratio_minus_one_and_max_num_seqs_caps_it() -> None:
    steps = [{**s, "waiting": 50, "capacity": 50} for s in KV_BOUND]
    w = summarize(window(CPU_LOAD, steps))
    assert diagnose(w, TwoX(dtype="fp8", ratio=1.5)).more_sequences == 16  # 32 x 0.5
    d = diagnose(w, TwoX(dtype="fp8", ratio=2.0), max_num_seqs=40)
    assert d.more_sequences == 8 and d.sentence.endswith("= 32, capped by max_num_seqs 40)")


def test_without_the_memory_map_the_sentence_says_why_there_is_no_estimate() -> None:
    w = summarize(window(CPU_LOAD, KV_BOUND))
    d = diagnose(w, TwoX(reason="the memory map needs the model's config.json: /models/tiny-llama/config.json "
                                "is not on this disk"))
    assert d.verdict == "kv_bound" and d.more_sequences is None
    assert d.sentence.endswith(": the memory map needs the model's config.json: /models/tiny-llama/config.json is "
                               "not on this disk, so no estimate of what a 2x KV format frees")


def test_one_preemption_is_kv_bound_even_when_no_sample_caught_the_peak() -> None:
    # vLLM preempts only when a running request's next blocks cannot be allocated: the pool was full
    steps = ramp(31, usage=(0.5, 0.6), running=(32, 32), preemptions=(40, 41), prompt=(0, 9_000))
    d = diagnose(summarize(window(CPU_LOAD, steps)))
    assert d.verdict == "kv_bound" and d.sentence.startswith(
        "KV-bound: peak KV usage 60%, 1 preemptions/min, nothing waiting for capacity: ")


def test_a_pool_with_headroom_and_nothing_queued_is_not_kv_bound() -> None:
    steps = ramp(31, usage=(0.05, 0.31), running=(4, 12), prompt=(0, 20_000), generated=(0, 900))
    d = diagnose(summarize(window(CPU_LOAD, steps)), TwoX(dtype="fp8", ratio=2.0))
    assert d.verdict == "not_kv_bound" and d.more_sequences is None
    assert d.sentence == "not KV-bound: peak KV usage 31%, nothing waiting for capacity: more KV frees nothing you use"


def test_a_queue_beside_a_pool_with_room_waits_on_something_else() -> None:
    steps = ramp(31, usage=(0.20, 0.31), running=(32, 32), waiting=(0, 5), capacity=(0, 5), prompt=(0, 50_000))
    d = diagnose(summarize(window(CPU_LOAD, steps)))
    assert d.verdict == "not_kv_bound"
    assert d.sentence == ("not KV-bound: peak KV usage 31%, 5 requests waiting for capacity with KV to spare "
                          "(max_num_seqs or the token budget holds them): more KV frees nothing you use")


def test_an_idle_server_is_not_enough_traffic_to_tell() -> None:
    samples = [Sample(2.0 * i, parse_metrics(only_families(CPU_IDLE, WATCHED))) for i in range(31)]
    d = diagnose(summarize(samples), TwoX(dtype="fp8", ratio=2.0))
    assert d.verdict == "no_traffic"
    assert d.sentence == "not enough traffic in the window to tell: no request ran or waited in 60 s"


def test_a_server_without_the_by_reason_gauge_counts_its_whole_queue() -> None:
    """Servers from before vllm:num_requests_waiting_by_reason, with the pre-0.9.2 usage gauge's name."""
    def older(text: str) -> str:
        text = re.sub(r"^vllm:num_requests_waiting_by_reason.*\n", "", text, flags=re.M)
        return text.replace(USAGE, "vllm:gpu_cache_usage_perc")

    steps = ramp(31, usage=(0.9, 0.95), running=(32, 32), waiting=(3, 3), prompt=(0, 9_000))
    base = only_families(CPU_LOAD, WATCHED)
    samples = [Sample(2.0 * i, parse_metrics(older(edit(base, **s)))) for i, s in enumerate(steps)]
    w = summarize(samples)
    assert w.peak_waiting_capacity is None and w.peak_kv_usage == pytest.approx(0.95)
    d = diagnose(w)
    assert d.verdict == "kv_bound" and ", 0 preemptions/min, 3 requests waiting: " in d.sentence


def test_the_gpu_capture_under_an_edited_load() -> None:
    steps = ramp(16, usage=(0.7, 0.99), running=(40, 48), waiting=(0, 9), capacity=(0, 9), preemptions=(0, 6),
                 prompt=(0, 80_000))
    w = summarize(window(GPU, steps))
    d = diagnose(w, TwoX(dtype="fp8", ratio=2.0))
    assert w.seconds == 30 and w.preemptions_per_min == pytest.approx(12.0)
    assert d.verdict == "kv_bound" and d.more_sequences == 9 and "peak KV usage 99%" in d.sentence


def test_counters_that_restart_count_from_zero_again() -> None:
    assert increase([5, 8, 2, 4]) == 7  # 3, then a restart at 2, then 2
    steps = [{"preemptions": p, "usage": 0.5, "running": 1, "prompt": 10.0 * i} for i, p in enumerate((5, 8, 2, 4))]
    assert summarize(window(CPU_LOAD, steps)).preemptions == 7


def test_too_few_samples_or_no_usage_gauge_cannot_tell() -> None:
    assert diagnose(summarize([])).verdict == "unknown"
    assert diagnose(summarize(window(CPU_LOAD, [{}]))).sentence == (
        "cannot tell: 1 readable /metrics sample(s) in the window")
    bare = re.sub(r"^vllm:kv_cache_usage_perc.*\n", "", CPU_LOAD, flags=re.M)
    d = diagnose(summarize([Sample(0, parse_metrics(bare)), Sample(2, parse_metrics(bare))]))
    assert d.verdict == "unknown" and "vllm:kv_cache_usage_perc" in d.sentence


def test_garbage_in_the_by_reason_gauge_is_unreadable_not_a_queue() -> None:
    snap = parse_metrics(edit(CPU_LOAD, capacity=float("nan")))
    assert snap.labelled_total("vllm:num_requests_waiting_by_reason", "reason", "capacity") is None
    assert any("num_requests_waiting_by_reason" in line for line in snap.unreadable)


# -- the memory map's 2x figure, from the model's config.json -------------------------------------------

async def _inventory(multi: MultiReplay, url: str) -> Inventory:
    client = Client(url, url, transport=multi.transport(), backoff_s=0)
    try:
        (inv,) = await take_inventories([client], run_smoke=False)
    finally:
        await client.aclose()
    return inv


def test_two_x_needs_the_config_on_this_disk_and_says_so() -> None:
    dev = Replay("auto-8101")
    dev.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=dev_server_info("auto"))
    inv = asyncio.run(_inventory(MultiReplay({"127.0.0.1:8101": dev}), "http://127.0.0.1:8101"))
    assert two_x_format(inv) == TwoX(reason="the memory map needs the model's config.json: "
                                            "/models/tiny-llama/config.json is not on this disk")
    # the same server, its model on this disk: bfloat16 KV (auto on bfloat16 weights) halves to fp8
    assert two_x_format(inv, NEEDLE_LLAMA) == TwoX(dtype="fp8", ratio=2.0)


def test_two_x_on_the_h200_is_sized_with_the_gpu_layout() -> None:
    url = f"http://127.0.0.1:{PORTS['fp8']}"
    inv = asyncio.run(_inventory(gpu_servers(("fp8",)), url))
    two_x = two_x_format(inv, NEEDLE_LLAMA)
    # fp8 is 1 byte; the GPU's int4_per_token_head adds a float32 scale per token and head: 1.78x, not 2x
    assert two_x.dtype == "int4_per_token_head" and two_x.ratio == pytest.approx(1.78, abs=0.01)

