"""The one-knob check: do the servers differ only in KV-cache dtype?

A comparison whose servers differ in anything else (max_model_len, memory, version, prefix caching)
is a moving baseline, not a result. Each candidate is compared with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvprobe.inventory import Inventory

# cache_config_info labels that follow from cache_dtype (vllm-interface.md §1, pinning recipe step 4),
# plus `engine`, which is the data-parallel index, not a setting.
DERIVED_LABELS = frozenset({
    "cache_dtype", "engine", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency",
    "block_size", "mamba_block_size", "mamba_page_size_padded", "skip_page_size_padded",
    "hash_block_size", "cache_hit_alignment_tokens", "effective_attention_block_size",
    "kv_cache_dtype_skip_layers",
})


@dataclass
class Difference:
    field: str
    values: dict[str, Any]

    @property
    def text(self) -> str:
        return f"{self.field}: " + " ".join(f"{name}={value}" for name, value in self.values.items())

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "values": self.values, "text": self.text}


@dataclass
class PinCheck:
    valid: bool
    differences: dict[str, list[Difference]] = field(default_factory=dict)  # candidate -> differences
    unchecked: list[str] = field(default_factory=list)

    def candidate_valid(self, name: str) -> bool:
        return not self.differences.get(name)

    def all_differences(self) -> list[Difference]:
        return [d for diffs in self.differences.values() for d in diffs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "differences": [d.to_dict() for d in self.all_differences()],
            "by_candidate": {k: [d.to_dict() for d in v] for k, v in self.differences.items()},
            "unchecked": self.unchecked,
        }


# /server_info keys that differ between two identically configured servers, or follow from the KV dtype.
_ENGINE_VOLATILE = frozenset({
    "vllm_config.instance_id",
    "vllm_env.VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",
    "vllm_env.VLLM_PORT",
    "vllm_env.VLLM_DP_MASTER_PORT",
})


# /server_info keys that repeat a fact compared anyway (one difference, named once).
_ENGINE_COVERED = frozenset({
    "vllm_config.model_config.max_model_len",
    "system.vllm_version",
})


# Environment variables that name where a server keeps files or how it is reached: they differ between
# hosts and users without changing a number the server computes.
_LOCAL_ENV_SUFFIXES = ("_ROOT", "_CACHE", "_CACHE_PATH", "_DIR", "_PATH", "_IP", "_HOST", "_PORT", "_BUFFER_NAME")


def _engine_key_allowed(key: str) -> bool:
    if key in _ENGINE_VOLATILE or key in _ENGINE_COVERED:
        return True
    if key.startswith("vllm_env.") and key.endswith(_LOCAL_ENV_SUFFIXES):
        return True
    prefix = "vllm_config.cache_config."
    return key.startswith(prefix) and key[len(prefix):] in DERIVED_LABELS


def _fingerprint_build(fp: str | None) -> str | None:
    """`vllm-<ver>[-tpN][-ppN][-dpN][-ep]-<hash8>`: the hash covers cache_dtype, so drop it."""
    if not fp:
        return None
    head, _, _ = fp.rpartition("-")
    return head or fp


def _facts(inv: Inventory) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "version": inv.version,
        "model_root": inv.model_root,
        "max_model_len": inv.max_model_len,
    }
    if (build := _fingerprint_build(inv.system_fingerprint)) is not None:
        facts["fingerprint"] = build
    for label, value in (inv.cache_config or {}).items():
        if label not in DERIVED_LABELS:
            facts[f"cache_config.{label}"] = value
    for key, value in (inv.server_info or {}).items():
        if not _engine_key_allowed(key):
            facts[f"server_info.{key}"] = value
    return facts


def check_pin(reference: Inventory, candidates: list[Inventory]) -> PinCheck:
    """Compare each reachable candidate with the reference on every setting except KV dtype."""
    result = PinCheck(valid=True)
    ref = _facts(reference)
    for cand in candidates:
        if cand.status in ("unreachable", "unauthorized"):
            result.unchecked.append(f"{cand.name}: not reachable, not compared")
            continue
        facts = _facts(cand)
        diffs = []
        for key in sorted(set(ref) | set(facts)):
            if key == "fingerprint" and (key not in ref or key not in facts):
                continue  # only known after a successful smoke
            if key.startswith("cache_config.") and (reference.cache_config is None or cand.cache_config is None):
                continue
            if key.startswith("server_info.") and (reference.server_info is None or cand.server_info is None):
                continue
            if ref.get(key) != facts.get(key):
                diffs.append(Difference(key, {reference.name: ref.get(key), cand.name: facts.get(key)}))
        result.differences[cand.name] = diffs
        for inv in (reference, cand):
            if inv.cache_config is None:
                result.unchecked.append(f"{inv.name}: no vllm:cache_config_info, cache settings not compared")
            if inv.server_info is None:
                result.unchecked.append(f"{inv.name}: no /server_info (VLLM_SERVER_DEV_MODE=1 shows it), "
                                        "engine settings beyond /metrics not compared")
    result.unchecked = sorted(set(result.unchecked))
    result.valid = not result.all_differences()
    return result


