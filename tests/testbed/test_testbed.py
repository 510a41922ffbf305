"""The testbed picks real scenarios by the CPU's ISA the way vLLM does, and a refused start reads as the
engine's own reason (from a real startup log)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay import dev_server_info, on_avx2

from kvprobe.testbed import launcher, testbed
from kvprobe.testbed.cpu import cpu_flags
from kvprobe.testbed.launcher import ServerSpec, died_of, engine_error, overruns
from kvprobe.testbed.scenarios import FACTS, FORCE_NO_AVX512, _build, detect_isa

LOG = Path(__file__).parents[1] / "fixtures" / "vllm-cpu-no-avx512" / "fp8-startup.log"


def _lscpu_flags(info: dict) -> frozenset[str]:
    line = next(li for li in info["system_env"]["cpu_info"].splitlines() if li.startswith("Flags:"))
    return frozenset(line.partition(":")[2].split())


def test_isa_follows_the_flags_vllm_asks_torch_about() -> None:
    avx512 = _lscpu_flags(dev_server_info("auto"))  # AMD EPYC family 25 model 17
    avx2 = _lscpu_flags(on_avx2(dev_server_info("auto")))  # family 25 model 1
    assert detect_isa(avx512, environ={}) == "avx512"
    assert detect_isa(avx2, environ={}) == "avx2"
    assert detect_isa(avx2 | {"amx_tile"}, environ={}) == "avx512"  # AMX alone is enough for vLLM
    assert detect_isa(avx2 | {"avx512f"}, environ={}) == "avx2"  # AVX512F without VL/BW/DQ is not
    assert detect_isa(avx512, environ={FORCE_NO_AVX512: "1"}) == "avx2"


def test_cpu_flags_reads_the_flags_line() -> None:
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert cpu_flags("no flags here") == frozenset()


def test_avx512_testbed_offers_every_scenario_on_one_reference() -> None:
    bed = _build("avx512", False)
    assert [(sc.key, sc.name) for sc in bed.demo()] == [
        ("reference", "auto"), ("lossless_2x", "fp8"), ("lossy_2x", "int8_per_token_head")]
    assert all(bed.available(k) for k in ("reference", "lossless_2x", "lossy_2x", "no_start", "no_gain"))
    assert {bed[k].reference for k in ("lossless_2x", "lossy_2x", "no_start", "no_gain")} == {"reference"}
    # No quantized dtype refuses here, so the refusal is the same fp8 server on the AVX2 path.
    assert bed["no_start"].spec.no_avx512 and not bed["reference"].spec.no_avx512
    assert [bed[k].kv_tokens for k in ("reference", "lossless_2x", "lossy_2x", "no_gain")] \
        == [524_288, 1_048_576, 1_048_576, 524_288]


def test_avx2_testbed_lacks_only_the_lossless_2x_and_says_why() -> None:
    bed = _build("avx2", False)
    assert not bed.available("lossless_2x")
    assert "AVX-512 or AMX" in bed["lossless_2x"].missing
    missing = [k for k in bed.scenarios if not bed.available(k)]
    assert missing == ["lossless_2x"]
    assert [(sc.key, sc.name) for sc in bed.demo()] == [("reference", "auto"), ("no_start", "fp8"),
                                                       ("lossy_2x", "bfloat16")]
    # The trio's pool is 2 GiB here, so its lossy server lives through the demo's ~500k tokens; the demo and
    # the tests share the very servers.
    assert [sc.kv_tokens for sc in bed.demo()] == [524_288, None, 1_048_576]
    assert [sc.spec for sc in bed.demo()] == [bed[k].spec for k in ("reference", "no_start", "lossy_2x")]
    ref, lossy = bed["reference"].spec, bed["lossy_2x"].spec
    assert ref.dtype == lossy.dtype == "float32"  # the pair differs only in the KV dtype
    # float16 KV on float32 weights would double the pool too: the no-gain pair has its own reference.
    assert bed["no_gain"].reference == "reference_bf16"
    assert bed["no_gain"].kv_tokens == bed["reference_bf16"].kv_tokens == 524_288
    assert not any(sc.spec.no_avx512 for sc in bed.scenarios.values() if sc.spec)


def test_forced_testbed_sends_every_server_down_the_avx2_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE_NO_AVX512, "1")
    bed = testbed()
    assert bed.isa == "avx2"
    assert bed.forced == (detect_isa(environ={}) == "avx512")
    if bed.forced:
        assert all(sc.spec.no_avx512 for sc in bed.scenarios.values() if sc.spec)


def test_specs_differ_from_each_other_in_what_they_run() -> None:
    plain, forced = ServerSpec(port=1, model="m"), ServerSpec(port=1, model="m", no_avx512=True)
    assert plain.digest() != forced.digest()  # a live server of the other path is never reused
    f32 = ServerSpec(port=1, model="m", dtype="float32", kv_cache_dtype="bfloat16")
    assert f32.argv()[f32.argv().index("--dtype") + 1] == "float32"
    assert "--enable-tokenizer-info-endpoint" not in ServerSpec(port=1, model="m", tokenizer_info=False).argv()


def test_a_server_started_under_another_thread_setting_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threads a server computes on are part of what it runs: one started while vLLM pinned every worker to
    core 0 (where one starved another) is restarted, not reused."""
    spec = ServerSpec(port=1, model="m")
    now = spec.digest()
    monkeypatch.setattr(launcher, "THREAD_ENV", {"VLLM_CPU_OMP_THREADS_BIND": "auto"})
    assert spec.digest() != now


def test_the_overrunning_kernels_are_known() -> None:
    assert overruns(ServerSpec(port=1, model="m", kv_cache_dtype="int8_per_token_head"))
    assert overruns(ServerSpec(port=1, model="m", dtype="float32", kv_cache_dtype="bfloat16"))
    assert not overruns(ServerSpec(port=1, model="m", kv_cache_dtype="bfloat16"))
    assert not overruns(ServerSpec(port=1, model="m", kv_cache_dtype="fp8"))


def test_engine_error_is_the_root_cause_of_a_real_refusal() -> None:
    lines = LOG.read_text().splitlines()
    assert engine_error(lines) == "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    assert engine_error(["just a line"]) == "just a line"
    assert engine_error([]) == "no output"


def test_a_server_that_died_mid_run_is_explained_by_its_own_log(tmp_path: Path) -> None:
    fixtures = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"
    segfault = fixtures / "segfault-reshape-and-cache" / "server-log-excerpt.txt"
    assert died_of(segfault) == "a segfault in cpu_attention::AttentionImpl<>::reshape_and_cache (cpu_attn_vec.hpp:305)"
    # the engine died of an exception: its first error line, the root cause
    crash = fixtures / "crash-seed-chunked-prefill" / "server-log-excerpt.txt"
    assert died_of(crash) == "RuntimeError: CPU Generator does not use offset"
    quiet = tmp_path / "quiet.log"
    quiet.write_text("INFO: started\n")
    assert died_of(quiet) == "no reason in its log"
    assert died_of(tmp_path / "gone.log") == "its log cannot be read (No such file or directory)"


def test_the_demo_says_which_of_its_servers_died_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from kvprobe.cli import demo

    log = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "segfault-reshape-and-cache" / "server-log-excerpt.txt"
    said = Console(file=io.StringIO(), width=300)
    monkeypatch.setattr(demo, "err_console", said)
    spec = ServerSpec(port=8103, model="m", kv_cache_dtype="bfloat16", dtype="float32")
    dead = SimpleNamespace(alive=lambda: False, log=log, spec=spec)
    alive = SimpleNamespace(alive=lambda: True, log=log, spec=ServerSpec(port=8101, model="m", kv_cache_dtype="auto"))
    demo._say_which_died([(SimpleNamespace(name="lossy_2x"), dead), (SimpleNamespace(name="reference"), alive)])
    text = said.file.getvalue()
    assert text.startswith("  lossy_2x: its vLLM server (kv-cache-dtype=bfloat16) stopped during the run: a "
                           "segfault in cpu_attention::AttentionImpl<>::reshape_and_cache (cpu_attn_vec.hpp:305); "
                           "log: "), text
    assert "reference" not in text


def test_facts_table_is_consistent() -> None:
    for isa, dtype, kv, tokens, _ in FACTS:
        assert isa in ("both", "avx512", "avx2") and dtype in ("bfloat16", "float32")
        assert tokens is None or tokens % 1024 == 0, kv


def test_demo_from_an_install_without_the_models_says_it_needs_a_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from kvprobe.cli import main
    from kvprobe.testbed import launcher

    launcher.require_checkout()  # this checkout has both models
    with pytest.raises(launcher.LaunchError, match="needs a source checkout"):
        launcher.require_checkout(tmp_path)
    monkeypatch.setattr(launcher, "PROJECT_ROOT", tmp_path)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 2  # EXIT_CANNOT_RUN
    assert "needs a source checkout (demo/models/needle-llama" in result.output
    assert "starting the demo servers" not in result.output
