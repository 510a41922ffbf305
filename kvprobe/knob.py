"""The knob under test: the one server setting a comparison may change, and the labels that follow from it.

`knob` (top level of servers.toml) names a vLLM cache setting. Its value on each server is read from
that server's own `vllm:cache_config_info` label, never from servers.toml: what a server says it runs is
what was measured.
"""

from __future__ import annotations

DEFAULT = "kv_cache_dtype"

# The knobs kvprobe knows by their vLLM flag name, and the cache_config_info label that carries each.
# Any other label may be declared as a knob by its label name.
KNOWN = {
    "kv_cache_dtype": "cache_dtype",
    "mamba_ssm_cache_dtype": "mamba_ssm_cache_dtype",
    "mamba_cache_dtype": "mamba_cache_dtype",
}

# Labels that are outcomes of the allocator (pool size, blocks, page alignment) or the data-parallel
# index: any cache knob moves them, so they are never a second difference.
FOLLOWING = frozenset({
    "engine", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency",
    "block_size", "mamba_block_size", "mamba_page_size_padded", "skip_page_size_padded",
    "hash_block_size", "cache_hit_alignment_tokens", "effective_attention_block_size",
    "kv_cache_dtype_skip_layers",
})

# vLLM resolves `--mamba-ssm-cache-dtype auto` to the conv state's dtype, so with the mamba_cache_dtype
# knob the SSM label follows too: the labels cannot tell "auto" from an explicit equal value.
_ALSO_FOLLOWING = {"mamba_cache_dtype": frozenset({"mamba_ssm_cache_dtype"})}

# Mamba-state settings vLLM keeps outside CacheConfig (MambaConfig, vllm/config/mamba.py): no
# cache_config_info label carries them, only /server_info's vllm_config (dev mode). Quantized Nemotron-3
# hybrids rely on stochastic rounding for correctness (vllm#48018), so they are knobs a comparison can test.
ENGINE = {
    "enable_mamba_cache_stochastic_rounding": "vllm_config.mamba_config.enable_stochastic_rounding",
    "mamba_cache_philox_rounds": "vllm_config.mamba_config.stochastic_rounding_philox_rounds",
    "mamba_backend": "vllm_config.mamba_config.backend",
}
ENGINE_FLAGS = {knob: "--" + knob.replace("_", "-") for knob in ENGINE}

FLAGS = {"cache_dtype": "--kv-cache-dtype", "mamba_ssm_cache_dtype": "--mamba-ssm-cache-dtype",
         "mamba_cache_dtype": "--mamba-cache-dtype"}


def label_of(knob: str) -> str:
    """The cache_config_info label that carries `knob` (for an ENGINE knob, its /server_info key)."""
    return ENGINE.get(knob) or KNOWN.get(knob, knob)


def engine_key(knob: str) -> str | None:
    """The /server_info key of a MambaConfig knob; None for a cache_config_info knob."""
    return ENGINE.get(knob)


def free_labels(knob: str) -> frozenset[str]:
    """The cache_config_info labels allowed to differ when `knob` is under test."""
    if knob in ENGINE:
        return FOLLOWING
    return FOLLOWING | {label_of(knob)} | _ALSO_FOLLOWING.get(knob, frozenset())


def flag(knob: str) -> str:
    """How an operator sets it: the vLLM flag when known, else the label's name."""
    return ENGINE_FLAGS.get(knob) or FLAGS.get(label_of(knob), knob)

