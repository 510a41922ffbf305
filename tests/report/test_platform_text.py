from __future__ import annotations

from replay import dev_server_info, on_avx2

from kvprobe.report.markdown import table
from kvprobe.report.platform_text import NOT_EXPOSED, platform_text
from kvprobe.report.tables import servers_table
from kvprobe.report.text_table import render
from kvprobe.server.platform import Platform, platform_from_system_env


def test_one_line_per_platform() -> None:
    assert platform_text(None) == NOT_EXPOSED == "platform not exposed"
    assert platform_text(platform_from_system_env(on_avx2(dev_server_info("auto"))["system_env"])) == \
        "AMD EPYC (25/1) avx2"
    assert platform_text(Platform()) == "CPU ? ISA ?"
    assert platform_text(Platform(cpu_model="Neoverse-N1", isa=[])) == "Neoverse-N1 no AVX2/AVX-512/AMX"
    gpus = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3" for i in range(8))
    assert platform_text(Platform(cpu_family=25, isa=["avx2"], nvidia_gpu_models=gpus, nvidia_driver_version="550.54",
                                  cuda_runtime_version="12.4")) == \
        "CPU ? (25/?) avx2; 8x NVIDIA H100 80GB HBM3 sm_90 (driver 550.54, CUDA 12.4 runtime)"


def test_the_report_server_table_shows_the_platforms_the_pin_check_compared() -> None:
    auto = platform_from_system_env(dev_server_info("auto")["system_env"])
    v = {"order": ["auto", "fp8", "old"],
         "servers": {"auto": {"role": "reference", "status": "ok"}, "fp8": {"status": "ok"}, "old": {"status": "ok"}},
         "pin": {"valid": True, "differences": [], "platforms": {"auto": auto.to_dict(), "fp8": None}}}
    t = servers_table(v)
    column = [row[t.headers.index("platform")] for row in t.rows]
    assert column == ["AMD EPYC (25/17) avx2 avx512_bf16 avx512_vnni avx512f", NOT_EXPOSED, "-"]
    assert "| AMD EPYC (25/17) avx2 avx512_bf16 avx512_vnni avx512f |" in table(t)
    # --verbose at 80 columns: too long beside ten columns, it goes under the table, whole
    lines = [line.plain for line in render(t, 80)]
    assert lines[lines.index("platform") + 1:lines.index("platform") + 3] == [
        "  auto: AMD EPYC (25/17) avx2 avx512_bf16 avx512_vnni avx512f", f"  fp8: {NOT_EXPOSED}"]
    # A verdict written before platforms were recorded: no column of false "not exposed".
    del v["pin"]["platforms"]
    assert {row[t.headers.index("platform")] for row in servers_table(v).rows} == {"-"}
