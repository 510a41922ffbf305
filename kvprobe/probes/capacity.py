"""Capacity: KV cache tokens per server from /metrics, and each candidate's ratio to the reference."""

from __future__ import annotations

from typing import Any

from kvprobe.inventory import Inventory
from kvprobe.pin import PinCheck


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
