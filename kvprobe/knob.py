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

# The labels vLLM's vllm:cache_config_info carries (0.2x to 0.3x: the captures in tests/fixtures). A knob
# a slip away from one of these names, or from a KNOWN or ENGINE knob, is a typo, not another label: it
# would compare nothing, and the servers' real knob would read as a second difference.
LABELS = frozenset({
    "block_size", "cache_dtype", "cache_hit_alignment_tokens", "calculate_kv_scales",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching",
    "engine", "gpu_memory_utilization", "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers",
    "kv_cache_layout", "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
    "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size",
    "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks",
    "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval", "prefix_caching_hash_algo",
    "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded", "sliding_window", "swa_bounded_replay",
    "use_kda_recoverssm", "use_replayssm", "user_specified_block_size", "user_specified_mamba_block_size",
})
NAMES = frozenset(KNOWN) | frozenset(ENGINE) | LABELS


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


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def near_miss(knob: str) -> str | None:
    """The known name `knob` is a slip of (at most two edits, one for a short name); None when `knob` is
    itself known or near none."""
    if knob in NAMES:
        return None
    most = min(2, len(knob) // 4)
    best = min(NAMES, key=lambda name: (_edits(knob, name), name))
    return best if _edits(knob, best) <= most else None
