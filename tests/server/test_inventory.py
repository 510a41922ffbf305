from __future__ import annotations

import json

import httpx
from replay import MultiReplay, Replay, capture

from kvprobe.server.client import Client
from kvprobe.server.inventory import Inventory, take_inventories, take_inventory


async def inventory_of(replay: Replay, **kw) -> Inventory:
    async with Client("s", "http://127.0.0.1:8101", transport=replay.transport(), backoff_s=0) as client:
        return await take_inventory(client, **kw)


async def test_inventory_of_a_real_capture() -> None:
    replay = Replay("auto-8101")
    inv = await inventory_of(replay)
    assert inv.status == "ok" and inv.error is None
    assert inv.version == "0.32.0"
    assert inv.model == inv.model_root == "/models/tiny-llama"
    assert inv.max_model_len == 8192
    assert inv.cache_dtype == "auto"
    assert inv.capacity.kv_cache_tokens == 1_048_576
    assert inv.has_tokenize
    assert inv.smoke.ok and inv.smoke.target_tokens == 4096
    assert inv.smoke.system_fingerprint == "vllm-0.32.0-" + json.loads(
        capture("auto-8101", "completions_gen16"))["system_fingerprint"].rsplit("-", 1)[1]
    assert Inventory.from_dict(json.loads(json.dumps(inv.to_dict()))).capacity == inv.capacity


async def test_smoke_sends_a_long_token_prompt_that_is_not_cached() -> None:
    replay = Replay("auto-8101")
    prompts = []
    gen = replay.routes[("POST", "/v1/completions")]

    def spy(request: httpx.Request) -> httpx.Response:
        prompts.append(json.loads(request.content)["prompt"])
        return gen(request)

    replay.routes[("POST", "/v1/completions")] = spy
    await inventory_of(replay, smoke_fraction=0.25)
    await inventory_of(replay, smoke_fraction=0.25)
    assert all(isinstance(p, list) and len(p) == 2048 for p in prompts)


async def test_server_that_dies_after_health_is_broken_with_its_error() -> None:
    replay = Replay("auto-8101")
    crash = capture("crash-seed-chunked-prefill", "response")
    replay.routes[("POST", "/v1/completions")] = lambda r: httpx.Response(500, content=crash)
    inv = await inventory_of(replay)
    assert inv.healthy and inv.status == "broken"
    assert "first-prefill smoke" in inv.error and "EngineCore encountered an issue" in inv.error
    assert inv.capacity.kv_cache_tokens == 1_048_576  # what was learnt before is kept


async def test_unreachable_and_unauthorized() -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/v1/models")] = lambda r: httpx.Response(401, json={"error": "Unauthorized"})
    inv = await inventory_of(replay)
    assert inv.status == "unauthorized" and "API key" in inv.error

    multi = MultiReplay({})
    async with Client("gone", "http://127.0.0.1:8199", transport=multi.transport(), backoff_s=0) as client:
        inv = await take_inventory(client)
    assert inv.status == "unreachable" and "cannot reach http://127.0.0.1:8199" in inv.error


async def test_health_500_is_broken() -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/health")] = lambda r: httpx.Response(500, text="engine dead")
    inv = await inventory_of(replay)
    assert inv.status == "broken" and "engine dead" in inv.error


async def test_malformed_metrics_and_missing_cache_config_are_warnings_not_crashes() -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text='vllm:x{a="1" 2\n')
    inv = await inventory_of(replay)
    assert inv.status == "ok" and inv.capacity is None
    assert any("not valid Prometheus text" in w for w in inv.warnings)

    text = "\n".join(line for line in capture("auto-8101", "metrics_fresh").decode().splitlines()
                     if "cache_config_info" not in line)
    replay.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text=text)
    inv = await inventory_of(replay)
    assert inv.capacity is None and inv.cache_config is None
    assert any("no vllm:cache_config_info" in w for w in inv.warnings)


async def test_no_tokenize_endpoint_means_approximate_smoke() -> None:
    replay = Replay("auto-8101")
    del replay.routes[("POST", "/tokenize")]
    inv = await inventory_of(replay)
    assert not inv.has_tokenize and inv.smoke.ok and inv.smoke.approximate


async def test_one_failing_server_does_not_stop_the_others() -> None:
    multi = MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")})
    clients = [Client(n, f"http://127.0.0.1:{p}", transport=multi.transport(), backoff_s=0)
               for n, p in (("auto", 8101), ("fp8", 8102), ("gone", 8103))]
    invs = await take_inventories(clients)
    assert [i.status for i in invs] == ["ok", "ok", "unreachable"]
    assert invs[1].capacity.kv_cache_tokens == 2 * invs[0].capacity.kv_cache_tokens


async def test_a_dev_mode_server_exposes_its_platform_and_it_round_trips() -> None:
    from replay import dev_server_info

    replay = Replay("auto-8101")
    replay.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=dev_server_info("auto"))
    inv = await inventory_of(replay, run_smoke=False)
    assert inv.platform.cpu_model == "AMD EPYC" and inv.platform.isa == ["avx2", "avx512_bf16", "avx512_vnni",
                                                                           "avx512f"]
    # One fact, one place: the GPU facts are in the platform, not repeated as server_info.system.*.
    assert sorted(k for k in inv.server_info if k.startswith("system.")) == [
        "system.hip_runtime_version", "system.rocm_version", "system.torch_version", "system.vllm_version"]
    again = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert again.platform == inv.platform and again.to_dict() == inv.to_dict()


async def test_without_server_info_the_platform_is_not_exposed() -> None:
    inv = await inventory_of(Replay("auto-8101"), run_smoke=False)
    assert inv.server_info is None and inv.platform is None
    assert inv.to_dict()["platform"] is None and Inventory.from_dict(inv.to_dict()).platform is None
    old = inv.to_dict()
    del old["platform"]  # an inventory written before platforms were read
    assert Inventory.from_dict(old).platform is None


def test_smoke_spans_more_than_one_attention_block_when_the_block_is_known() -> None:
    from kvprobe.server.inventory import smoke_length

    # The hybrid with a 16-bit SSM state: max_model_len 512, attention block 256. Half of 512 stays in
    # one block (the real server serves it); 272 crosses into a second (the real server dies at 268).
    assert smoke_length(512, 0.5, 8, None) == 256
    assert smoke_length(512, 0.5, 8, 256) == 272
    # float32 state: the block is the whole context, so no prompt can span two; the longest that fits.
    assert smoke_length(512, 0.5, 8, 512) == 504
    assert smoke_length(8192, 0.5, 8, 128) == 4096  # dense: half the context already spans many blocks
