from __future__ import annotations

import json

import pytest
from replay import dev_server_info, on_avx2

from kvprobe.server.platform import Platform, platform_facts, platform_from_system_env

REAL_ISA = ["avx2", "avx512_bf16", "avx512_vnni", "avx512f"]


@pytest.mark.parametrize("name", ["auto", "fp8"])
def test_real_captures_parse_to_the_cpu_that_served_them(name: str) -> None:
    p = platform_from_system_env(dev_server_info(name)["system_env"])
    assert p == Platform(cpu_model="AMD EPYC", cpu_family=25, cpu_model_number=17, isa=REAL_ISA,
                         nvidia_gpu_models=None, nvidia_driver_version=None, cuda_runtime_version="13.0.88",
                         cuda_compiled_version=None, cuda_available=False, cuda_archs=None)
    assert p.device == "cpu" and p.compute_capability is None


def test_only_the_kernel_facts_are_kept_never_the_lscpu_text() -> None:
    data = json.dumps(platform_from_system_env(dev_server_info("auto")["system_env"]).to_dict())
    assert "fpu" not in data and "Vulnerability" not in data and "avx512vl" not in data
    assert set(json.loads(data)) == {"cpu_model", "cpu_family", "cpu_model_number", "isa", "nvidia_gpu_models",
                                     "nvidia_driver_version", "cuda_runtime_version", "cuda_compiled_version",
                                     "cuda_available", "cuda_archs"}


def test_avx2_host_and_amx_flags() -> None:
    avx2 = platform_from_system_env(on_avx2(dev_server_info("auto"))["system_env"])
    assert (avx2.cpu_family, avx2.cpu_model_number, avx2.isa) == (25, 1, ["avx2"])
    system = dev_server_info("auto")["system_env"]
    system["cpu_info"] = system["cpu_info"].replace("Flags:", "Flags: amx_tile amx_int8 amx_bf16")
    assert platform_from_system_env(system).isa == ["amx_bf16", "amx_int8", "amx_tile", *REAL_ISA]


@pytest.mark.parametrize("system", [None, 42, "lscpu", [], {}, {"cpu_info": None}, {"cpu_info": 7},
                                    {"cpu_info": {"Flags": "avx2"}}, {"cpu_info": "Could not collect"},
                                    {"cpu_info": "Model name:\nCPU family: x86\nModel: 0x11\n"}])
def test_garbage_gives_none_fields_not_a_traceback(system: object) -> None:
    assert platform_from_system_env(system) == Platform()


def test_missing_lines_are_none_and_a_flags_line_without_kernel_flags_is_empty() -> None:
    p = platform_from_system_env({"cpu_info": "Model name: Neoverse-N1\nFlags: fp asimd evtstrm\n",
                                  "nvidia_gpu_models": ["not", "a", "string"], "nvidia_driver_version": 550})
    assert p == Platform(cpu_model="Neoverse-N1", isa=[], nvidia_driver_version="550")


def test_round_trip_and_garbage_from_disk() -> None:
    p = platform_from_system_env(dev_server_info("fp8")["system_env"])
    assert Platform.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert Platform.from_dict(None) is None and Platform.from_dict("x") is None
    assert Platform.from_dict({"isa": ["avx2", {"x": 1}, "fpu", "avx2"], "cpu_family": True}) == Platform(isa=["avx2"])
    assert platform_facts(p)["platform.isa"] == REAL_ISA
