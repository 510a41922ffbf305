from __future__ import annotations

import re

import pytest
from replay import capture

from kvprobe.errors import MetricsError
from kvprobe.server.metrics import KV_USAGE, counter_deltas, parse_metrics


def metrics(server: str, name: str) -> str:
    return capture(server, name).decode()


def test_capacity_from_kv_cache_size_tokens_auto_and_fp8() -> None:
    auto = parse_metrics(metrics("auto-8101", "metrics_fresh"))
    fp8 = parse_metrics(metrics("fp8-8102", "metrics_fresh"))
    assert auto.capacity().kv_cache_tokens == 1_048_576
    assert fp8.capacity().kv_cache_tokens == 2_097_152
    assert not auto.capacity().estimate
    assert auto.capacity().max_concurrency == 128.0
    assert auto.cache_config["cache_dtype"] == "auto" and fp8.cache_config["cache_dtype"] == "fp8"
    assert "engine" not in auto.cache_config


def test_hybrid_capacity_is_not_blocks_times_size() -> None:
    snap = parse_metrics(metrics("hybrid-nemotronh", "metrics-auto-maxlen512"))
    cap = snap.capacity()
    assert cap.kv_cache_tokens == 80_659
    assert cap.num_blocks * cap.block_size == 1_048_576  # what the naive estimate would say
    fp8 = parse_metrics(metrics("hybrid-nemotronh", "metrics-fp8-maxlen512")).capacity()
    assert fp8.kv_cache_tokens == cap.kv_cache_tokens  # fp8 frees nothing at 512 tokens


def test_old_server_without_capacity_labels_falls_back_to_estimate() -> None:
    text = re.sub(r'kv_cache_size_tokens="\d+",', "", metrics("auto-8101", "metrics_fresh"))
    cap = parse_metrics(text).capacity()
    assert cap.estimate is True
    assert cap.kv_cache_tokens == 8192 * 128


def test_old_metric_names_are_aliased() -> None:
    text = metrics("auto-8101", "metrics_under_load")
    old = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc").replace(
        "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
    assert "vllm:kv_cache_usage_perc" not in old
    new_snap, old_snap = parse_metrics(text), parse_metrics(old)
    assert old_snap.kv_usage == pytest.approx(new_snap.kv_usage)
    assert old_snap.kv_usage == pytest.approx(0.013307288487364177)
    assert old_snap.counters()["vllm:prefix_cache_hits_total"] == 238080.0


def test_missing_cache_config_info_gives_no_capacity() -> None:
    text = "\n".join(line for line in metrics("auto-8101", "metrics_fresh").splitlines()
                     if "cache_config_info" not in line)
    snap = parse_metrics(text)
    assert snap.cache_config is None
    assert snap.capacity() is None
    assert snap.gauges()[KV_USAGE] == 0.0


def test_malformed_metrics_raise_one_line() -> None:
    with pytest.raises(MetricsError) as info:
        parse_metrics('vllm:num_requests_running{engine="0" 1.0\n')
    assert "not valid Prometheus text" in str(info.value)
    assert "\n" not in str(info.value)


def test_counter_deltas_cover_only_the_window() -> None:
    before = parse_metrics(metrics("auto-8101", "metrics_fresh"))
    after = parse_metrics(metrics("auto-8101", "metrics_under_load"))
    deltas = counter_deltas(before, after)
    assert deltas["vllm:prompt_tokens_total"] == 270351.0
    assert deltas["vllm:num_preemptions_total"] == 0.0
    assert counter_deltas(after, after)["vllm:prompt_tokens_total"] == 0.0
