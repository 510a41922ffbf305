"""Capacity: KV cache tokens per server from /metrics, and each candidate's ratio to the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprobe.inventory import Inventory
from kvprobe.pin import PinCheck
from kvprobe.untrusted import MAX_TOKENS, Unreadable, number


def capacity_summary(reference: str, inventories: dict[str, Inventory], pin: PinCheck) -> dict[str, Any]:
    ref = inventories[reference].capacity
    servers: dict[str, Any] = {}
    for name, inv in inventories.items():
        cap = inv.capacity
        servers[name] = {
            "cache_dtype": inv.cache_dtype,
            "kv_cache_tokens": cap.kv_cache_tokens if cap else None,
            "estimate": cap.estimate if cap else None,
            "max_concurrency": cap.max_concurrency if cap else None,
            "block_size": cap.block_size if cap else None,
            "num_blocks": cap.num_blocks if cap else None,
            "ratio": (cap.kv_cache_tokens / ref.kv_cache_tokens) if cap and ref and ref.kv_cache_tokens else None,
        }
    return {"reference": reference, "servers": servers, "pin": pin.to_dict()}


def memory_map_summary(config_path: str, reference: str, inventories: dict[str, Inventory],
                       capacity_gain_min: float, chart: Path | None = None) -> dict[str, Any]:
    """The memory map of servers.toml's `model_config`, predicted with the reference's facts (max_model_len,
    KV memory, Mamba state dtypes from cache_config_info), set beside each server's measured capacity.

    A config memmap cannot read is bad input: the result carries `error` and the caller stops.
    A KV dtype memmap has no byte model for is a limit, not an error: that server is left unpredicted.
    """
    from kvprobe.errors import ConfigError
    from kvprobe.memmap import Settings, build
    from kvprobe.memmap.dtypes import KV_DTYPES, MAMBA_DTYPES, STATE_DTYPE_BYTES

    ref = inventories[reference]
    labels = ref.cache_config or {}

    def label(name: str, allowed: tuple[str, ...], default: str) -> str:
        value = labels.get(name)
        return value if value in allowed else default

    try:
        memory = number(labels.get("kv_cache_memory_bytes"), "kv_cache_memory_bytes", integer=True, minimum=1,
                        maximum=MAX_TOKENS * 2**20, text=True)
    except Unreadable:  # the allocator's default then: the prediction says which memory it assumed
        memory = Settings.kv_memory_bytes
    # The weights' dtype as served ("torch.float32"), which "auto" KV takes; only /server_info shows it.
    served = str((ref.server_info or {}).get("vllm_config.model_config.dtype") or "").removeprefix("torch.")
    settings = Settings(
        model_dtype=served if served in STATE_DTYPE_BYTES else None,
        kv_memory_bytes=memory,
        mamba_cache_dtype=label("mamba_cache_dtype", MAMBA_DTYPES, "auto"),
        mamba_ssm_cache_dtype=label("mamba_ssm_cache_dtype", MAMBA_DTYPES, "auto"),
    )
    dtypes = [inv.cache_dtype for inv in (ref, *inventories.values()) if inv.cache_dtype in KV_DTYPES]
    where = f"servers.toml model_config {config_path}"
    if ref.cache_dtype not in KV_DTYPES:
        return {"config": config_path, "skipped": f"no byte model for the reference dtype {ref.cache_dtype}"}
    try:
        mm = build(config_path, dtypes, ref.max_model_len, settings)
    except ConfigError as exc:
        return {"config": config_path, "error": f"{where}: {'; '.join(exc.problems)}"}

    servers: dict[str, Any] = {}
    explain: dict[str, str] = {}
    ref_tokens = ref.capacity.kv_cache_tokens if ref.capacity else None
    for name, inv in inventories.items():
        measured = inv.capacity.kv_cache_tokens if inv.capacity and not inv.capacity.estimate else None
        plan = mm.plans.get(inv.cache_dtype or "")
        predicted = plan.kv_cache_tokens if plan else None
        servers[name] = {
            "cache_dtype": inv.cache_dtype,
            "predicted_kv_cache_tokens": predicted, "measured_kv_cache_tokens": measured,
            "predicted_ratio": mm.ratio(inv.cache_dtype) if plan else None,
            "error_pct": 100.0 * (predicted - measured) / measured if predicted and measured else None,
        }
        ratio = inv.capacity.kv_cache_tokens / ref_tokens if inv.capacity and ref_tokens else None
        if name != reference and ratio is not None and ratio < 1 + capacity_gain_min:
            predicted_text = f"memmap predicted {mm.ratio(inv.cache_dtype):.2f}x" if plan else "memmap cannot size it"
            explain[name] = (f"{name} gives {ratio:.2f}x the capacity of {reference}, under the "
                             f"{1 + capacity_gain_min:.2f}x bar; {predicted_text}. {mm.conclusion()}")
    out = {"config": config_path, **mm.details(), "servers": servers, "explain": explain}
    if chart is not None:
        from kvprobe.report.bytes_chart import bytes_chart

        out["chart"] = bytes_chart(mm, chart).name
    return out
