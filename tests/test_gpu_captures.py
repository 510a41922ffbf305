"""The real vLLM 0.26 H200 captures (tests/replay_gpu.py) through the paths the CPU captures take: inventory,
capacity, the one-knob check, the memory map per platform, audit and the report's server table.

What the GPU shows that the CPU build does not: block size 16; int8_per_token_head at 986,880 tokens
(1.88x: a float32 scale per token, head and K/V); compiled-for (CUDA 13.0, kernels for sm_90a) beside
run-on (H200, driver 580.159.04, CUDA 13.0.88 runtime); an attention backend only the log names."""

from __future__ import annotations

import io
import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from replay_gpu import DENSE, HYBRID, PORTS, GpuReplay, gpu_server_info, gpu_servers, gpu_servers_toml
from rich.console import Console

from kvprobe import cli
from kvprobe.cli import audit as audit_cli
from kvprobe.config import parse_config
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.memmap import Settings, build
from kvprobe.report.platform_text import platform_text
from kvprobe.report.tables import servers_table
from kvprobe.report.terminal import audit_table
from kvprobe.run.store import RunDir
from kvprobe.server.client import Client
from kvprobe.server.inventory import take_inventories
from kvprobe.server.platform import arch_mismatch, platform_from_system_env

NEEDLE_CONFIG = Path(__file__).parents[1] / "demo" / "models" / "needle-llama" / "config.json"
# Reported by each server's /metrics (kv_cache_size_tokens), 1 GiB of KV, max_model_len 8192.
TOKENS = {"auto": 524_288, "fp8": 1_048_576, "int8_per_token_head": 986_880}
HYBRID_TOKENS = {"hybrid-auto": 192_768, "hybrid-fp8": 231_321, "hybrid-ssm16": 319_561}


def url(name: str) -> str:
    return f"http://127.0.0.1:{PORTS[name]}"


async def inventories(names: tuple[str, ...] = DENSE, **kw: Any):
    multi = gpu_servers(names)
    clients = [Client(n, url(n), transport=multi.transport(), backoff_s=0) for n in names]
    try:
        return await take_inventories(clients, roles={names[0]: "reference"}, **kw)
    finally:
        for c in clients:
            await c.aclose()


async def test_inventory_reads_capacity_block_and_platform_of_each_gpu_server() -> None:
    invs = {inv.name: inv for inv in await inventories(DENSE + HYBRID)}
    for name, inv in invs.items():
        assert inv.status == "ok" and inv.smoke and inv.smoke.ok, (name, inv.error)
        assert inv.version == "0.26.0" and inv.capacity and not inv.capacity.estimate
        assert inv.capacity.kv_cache_tokens == {**TOKENS, **HYBRID_TOKENS}[name]
        p = inv.platform
        assert p is not None and p.device == "cuda" and p.compute_capability == "9.0"
        assert (p.nvidia_gpu_models, p.nvidia_driver_version) == ("GPU 0: NVIDIA H200", "580.159.04")
        assert (p.cuda_runtime_version, p.cuda_compiled_version, p.cuda_archs) == ("13.0.88", "13.0", ["9.0a"])
        assert not [w for w in inv.warnings if "compiled-for" in w]  # sm_90a kernels on an sm_90 GPU
    assert {n: invs[n].capacity.block_size for n in DENSE} == {n: 16 for n in DENSE}  # type: ignore[union-attr]
    assert invs["int8_per_token_head"].capacity.kv_cache_tokens / TOKENS["auto"] == pytest.approx(1.88, abs=0.005)


def test_a_gpu_the_build_has_no_kernels_for_is_named() -> None:
    h200 = platform_from_system_env(gpu_server_info("auto")["system_env"])
    assert arch_mismatch(h200) is None
    rtx = replace(h200, nvidia_gpu_models="GPU 0: NVIDIA GeForce RTX 5090")
    assert arch_mismatch(rtx) == "built for sm_90a, running on sm_120"
    assert arch_mismatch(replace(rtx, cuda_archs=["9.0a", "12.0"])) is None
    assert arch_mismatch(replace(rtx, cuda_archs=["8.0", "9.0+PTX"])) is None  # PTX is JIT-compiled forward
    assert arch_mismatch(replace(h200, nvidia_gpu_models="GPU 0: NVIDIA B200", cuda_archs=["10.0f"])) is None
    assert arch_mismatch(replace(rtx, nvidia_gpu_models="GPU 0: NVIDIA B200", cuda_archs=["9.0a"])) \
        == "built for sm_90a, running on sm_100"


async def test_the_inventory_warns_when_compiled_for_is_not_run_on() -> None:
    info = gpu_server_info("fp8")
    info["system_env"]["nvidia_gpu_models"] = "GPU 0: NVIDIA GeForce RTX 5090"  # the sm_90a build on sm_120
    replay = GpuReplay("fp8")
    replay.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=info)
    client = Client("fp8", url("fp8"), transport=httpx.MockTransport(replay), backoff_s=0)
    try:
        [inv] = await take_inventories([client], run_smoke=False)
    finally:
        await client.aclose()
    assert any(w.startswith("built for sm_90a, running on sm_120: the vLLM build carries no kernels")
               for w in inv.warnings), inv.warnings


async def test_the_three_dense_servers_are_one_knob_apart_and_the_backend_is_not_assumed() -> None:
    from kvprobe.server.pin import check_pin

    invs = await inventories()
    pin = check_pin(invs[0], invs[1:])
    assert pin.valid and pin.knob_values == {"auto": "auto", "fp8": "fp8", "int8_per_token_head": "int8_per_token_head"}
    assert set(pin.attention_backends.values()) == {"not exposed"}  # /server_info forces none
    declared = await inventories(backends={"auto": "FLASH_ATTN", "fp8": "FLASH_ATTN",
                                           "int8_per_token_head": "TRITON_ATTN"})
    pin = check_pin(declared[0], declared[1:])
    assert pin.attention_backends == {"auto": "FLASH_ATTN (declared)", "fp8": "FLASH_ATTN (declared)",
                                      "int8_per_token_head": "TRITON_ATTN (declared)"}
    assert pin.valid  # the backend follows the KV dtype (FlashAttention takes no per-token-head format)


async def test_a_mamba_config_difference_is_named_by_the_one_knob_check() -> None:
    from kvprobe.server.pin import check_pin

    info = gpu_server_info("hybrid-auto")
    info["vllm_config"]["mamba_config"]["enable_stochastic_rounding"] = True
    replay = GpuReplay("hybrid-auto")
    replay.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=info)
    multi = gpu_servers(("hybrid-auto",))
    clients = [Client("a", url("hybrid-auto"), transport=multi.transport(), backoff_s=0),
               Client("b", url("hybrid-auto"), transport=httpx.MockTransport(replay), backoff_s=0)]
    try:
        ref, cand = await take_inventories(clients, run_smoke=False)
    finally:
        for c in clients:
            await c.aclose()
    pin = check_pin(ref, [cand])
    assert not pin.valid
    assert [d.text for d in pin.differences["b"]] == [
        "server_info.vllm_config.mamba_config.enable_stochastic_rounding: a=False b=True"]
    # ...unless it is the knob under test: then it is the one difference allowed, read from /server_info.
    pin = check_pin(ref, [cand], knob="enable_mamba_cache_stochastic_rounding")
    assert pin.valid and pin.knob_values == {"a": False, "b": True}
    assert pin.to_dict()["knob_label"] == "vllm_config.mamba_config.enable_stochastic_rounding"


async def test_with_dev_mode_off_mamba_config_is_not_exposed_never_the_same() -> None:
    from kvprobe.server.pin import check_pin

    plain = GpuReplay("hybrid-auto")
    plain.routes.pop(("GET", "/server_info"))
    clients = [Client(n, url("hybrid-auto"), transport=httpx.MockTransport(plain), backoff_s=0) for n in "ab"]
    try:
        ref, cand = await take_inventories(clients, run_smoke=False)
    finally:
        for c in clients:
            await c.aclose()
    pin = check_pin(ref, [cand], knob="mamba_backend")
    assert pin.knob_values == {"a": None, "b": None}
    assert "a: its mamba_backend is not exposed (MambaConfig is only in /server_info, which needs " \
           "VLLM_SERVER_DEV_MODE=1)" in pin.unchecked
    assert any(u.endswith("(MambaConfig: mamba backend, stochastic rounding: not exposed)") for u in pin.unchecked)


def test_memmap_predicts_each_platform() -> None:
    cuda = build(NEEDLE_CONFIG, list(TOKENS), 8192, Settings(platform="cuda", block_size=16))
    assert {d: p.kv_cache_tokens for d, p in cuda.plans.items()} == TOKENS
    cpu = build(NEEDLE_CONFIG, list(TOKENS), 8192, Settings())
    assert cpu.plans["int8_per_token_head"].kv_cache_tokens == 1_048_576  # the CPU build keeps no scales
    nvfp4 = build(NEEDLE_CONFIG, ["auto", "nvfp4"], 8192, Settings(platform="cuda")).plans["nvfp4"]
    # 4 layers x 2 KV heads x K,V x (32 bytes of fp4 data + 4 fp8 block scales)
    assert sum(nvfp4.attention_bytes_per_token.values()) == 4 * 2 * 2 * (32 + 4)


# vLLM's CacheDType choices (vllm/config/cache.py), as the interface reference lists them.
VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "turboquant_k8v4",
                  "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3",
                  "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
                  "fp8_per_token_head", "nvfp4", "nvfp4_4over6")


@pytest.mark.parametrize("dtype", VLLM_KV_DTYPES)
def test_every_vllm_kv_dtype_is_sized_on_cuda_or_refused_with_its_reason(dtype: str) -> None:
    from kvprobe.errors import NotModelled

    try:
        plan = build(NEEDLE_CONFIG, ["auto", dtype], 8192, Settings(platform="cuda")).plans[dtype]
    except NotModelled as exc:
        assert f"--kv-dtype {dtype} on cuda: no byte model (" in exc.problems[0]
    else:
        assert 0 < plan.kv_cache_tokens <= 4 * TOKENS["auto"]


def test_memmap_refuses_what_it_has_no_gpu_model_for() -> None:
    from kvprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="turboquant_k8v4 on cuda: no byte model"):
        build(NEEDLE_CONFIG, ["auto", "turboquant_k8v4"], 8192, Settings(platform="cuda"))
    hybrid = Path(__file__).parents[1] / "demo" / "models" / "needle-hybrid" / "config.json"
    with pytest.raises(ConfigError, match=r"hybrid .* on cuda"):
        build(hybrid, ["auto"], 512, Settings(platform="cuda"))


def test_memmap_command_predicts_the_h200_capacities() -> None:
    result = CliRunner().invoke(cli.main, [
        "memmap", str(NEEDLE_CONFIG), "--platform", "cuda", "--block-size", "16", "--max-model-len", "8192",
        "--kv-dtype", "auto,fp8,int8_per_token_head", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["platform"] == "cuda" and {d: out["dtypes"][d]["kv_cache_tokens"] for d in TOKENS} == TOKENS


async def test_eval_predicts_each_gpu_server_from_its_own_platform(tmp_path: Path) -> None:
    config = parse_config(tomllib.loads(f'model_config = "{NEEDLE_CONFIG}"\n\n' + gpu_servers_toml()))
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(config, run, ["capacity"], Console(file=io.StringIO()),
                             transport=gpu_servers().transport())
    assert outcome.exit_code == 0
    rows = run.read_json("capacity.json")["memmap"]["servers"]
    assert {n: (r["predicted_kv_cache_tokens"], r["measured_kv_cache_tokens"]) for n, r in rows.items()} \
        == {n: (t, t) for n, t in TOKENS.items()}
    verdict = run.read_json("verdict.json")
    assert round(verdict["decisions"]["int8_per_token_head"]["capacity_ratio"], 2) == 1.88
    assert verdict["pin"]["valid"] and verdict["pin"]["attention_backends"]["fp8"] == "not exposed"
    servers = servers_table(verdict)
    assert "Attention backend: auto not exposed, fp8 not exposed" in servers.note
    platform = {row[0]: row[servers.headers.index("platform")] for row in servers.rows}
    assert all("H200 sm_90 (driver 580.159.04, CUDA 13.0.88 runtime, compiled for CUDA 13.0" in p
               for p in platform.values())


async def test_eval_leaves_a_gpu_hybrid_unpredicted_rather_than_wrong(tmp_path: Path) -> None:
    hybrid = Path(__file__).parents[1] / "demo" / "models" / "needle-hybrid" / "config.json"
    text = f'model_config = "{hybrid}"\nknob = "mamba_ssm_cache_dtype"\n\n' + gpu_servers_toml(("hybrid-auto",
                                                                                               "hybrid-ssm16"))
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(parse_config(tomllib.loads(text)), run, ["capacity"], Console(file=io.StringIO()),
                             transport=gpu_servers(HYBRID).transport())
    memmap = run.read_json("capacity.json")["memmap"]
    assert memmap["skipped"].startswith("a hybrid (Mamba/GDN state) model on cuda"), memmap
    assert "servers" not in memmap  # no predicted number at all, rather than a wrong one
    verdict = run.read_json("verdict.json")
    assert outcome.exit_code == 0 and round(verdict["decisions"]["hybrid-ssm16"]["capacity_ratio"], 2) == 1.66


def test_audit_shows_compiled_for_beside_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    multi = gpu_servers()
    monkeypatch.setattr(audit_cli, "Client", lambda name, u, **kw: Client(name, u, transport=multi.transport(),
                                                                   backoff_s=0, **kw))
    result = CliRunner().invoke(cli.main, ["audit", "--json", *(url(n) for n in DENSE)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["servers"]
    assert [r["kv_cache_tokens"] for r in rows] == list(TOKENS.values())
    assert all("NVIDIA H200 sm_90" in r["platform_text"] and r["platform_short"] == "H200 CUDA 13.0" for r in rows)
    assert all(r["platform"]["cuda_compiled_version"] == "13.0" and r["platform"]["cuda_archs"] == ["9.0a"]
               for r in rows)
    text = platform_text(platform_from_system_env(gpu_server_info("auto")["system_env"]))
    assert "NVIDIA H200 sm_90 (driver 580.159.04, CUDA 13.0.88 runtime, compiled for CUDA 13.0, " \
           "kernels for sm_90a)" in text
    # and in the terminal, under the table: the one platform the three servers share, in full
    result = CliRunner(env={"COLUMNS": "100"}).invoke(cli.main, ["audit", *(url(n) for n in DENSE)],
                                                      catch_exceptions=False)
    assert result.exit_code == 0, result.output
    said = " ".join(line.strip() for line in result.stdout[result.stdout.index("platform of "):].splitlines())
    hosts = ", ".join(url(n).removeprefix("http://") for n in DENSE)
    assert said.startswith(f"platform of {hosts}: ") and said.count("platform of ") == 1
    assert "NVIDIA H200 sm_90 (driver 580.159.04, CUDA 13.0.88 runtime, compiled for CUDA 13.0, kernels for " \
           "sm_90a)" in said
    assert all(len(line) <= 100 for line in result.stdout.splitlines())


async def test_audit_table_keeps_the_gpu_facts() -> None:
    out = io.StringIO()
    Console(file=out, width=500, color_system=None).print(audit_table(await inventories(), width=500))
    lines = [line for line in out.getvalue().splitlines() if "127.0.0.1:82" in line]
    assert len(lines) == 3
    # the table's short form; the full run-on beside compiled-for is --json's platform_text (above)
    assert all("H200 CUDA 13.0" in line for line in lines)
    assert "986,880" in out.getvalue()


async def test_servers_toml_declares_the_backend_the_log_names(tmp_path: Path) -> None:
    text = gpu_servers_toml().replace('name = "int8_per_token_head"',
                                      'name = "int8_per_token_head"\nattention_backend = "TRITON_ATTN"')
    run = RunDir.create(tmp_path / "run")
    await run_eval(parse_config(tomllib.loads(text)), run, ["capacity"], Console(file=io.StringIO()),
                   transport=gpu_servers().transport())
    backends = run.read_json("verdict.json")["pin"]["attention_backends"]
    assert backends == {"auto": "not exposed", "fp8": "not exposed", "int8_per_token_head": "TRITON_ATTN (declared)"}
    assert run.read_json("inventory/int8_per_token_head.json")["attention_backend_source"] == "declared"
