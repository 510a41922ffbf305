"""The hybrid testbed: needle-hybrid (NemotronH, 8 Mamba2 + 2 attention) on vLLM 0.32 CPU, max_model_len 512.

Three comparisons show the third trap (more KV bytes can free nothing) and its one lever (measured at 1 GiB):
- `kv`: fp8 KV next to auto frees nothing (80,659 tokens both), AVX-512 only;
- `ssm_default`: a float16 SSM state with vLLM's defaults (prefix caching on) gives 149,796 tokens
  (1.86x) and the engine dies at the first prompt that spans two 256-token attention blocks;
- `ssm_pinned`: both servers with prefix caching off, 209,715 vs 349,525 tokens (1.67x), retrieval
  intact; bfloat16 state behaves as float16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvprobe.testbed.launcher import NEEDLE_HYBRID, ServerSpec, staged_model
from kvprobe.testbed.scenarios import testbed

SERVED_NAME = "needle-hybrid"
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Comparison:
    key: str
    knob: str
    shows: str
    reference: ServerSpec
    candidates: dict[str, ServerSpec]  # server name -> spec


def _base(port: int, prefix_caching: bool | None) -> ServerSpec:
    return ServerSpec(port=port, model=staged_model(NEEDLE_HYBRID), served_model_name=SERVED_NAME,
                      max_model_len=MAX_MODEL_LEN, no_avx512=testbed().forced, prefix_caching=prefix_caching)


def comparisons() -> dict[str, Comparison]:
    """What this CPU can run, by key."""
    default, pinned = _base(8111, None), _base(8114, False)
    out: dict[str, Comparison] = {}
    if testbed().isa == "avx512":
        out["kv"] = Comparison("kv", "kv_cache_dtype", "fp8 KV frees nothing on an attention-light hybrid",
                               default, {"fp8": replace(default, port=8112, kv_cache_dtype="fp8")})
    out["ssm_default"] = Comparison(
        "ssm_default", "mamba_ssm_cache_dtype", "the SSM state is the lever, but with vLLM's defaults it breaks",
        default, {"ssm_float16": replace(default, port=8113, mamba_ssm_cache_dtype="float16")})
    out["ssm_pinned"] = Comparison(
        "ssm_pinned", "mamba_ssm_cache_dtype", "pinned with prefix caching off, the SSM state frees 1.67x with "
        "retrieval intact", pinned, {"ssm_float16": replace(pinned, port=8115, mamba_ssm_cache_dtype="float16")})
    return out
