"""The allocator settings a server reports in cache_config_info and /server_info, as the memory map's
Settings: what capacity predicts each server with, and what `audit --watch` sizes a half-width format by."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvprobe.server.inventory import Inventory
from kvprobe.server.untrusted import MAX_TOKENS, Unreadable, number

if TYPE_CHECKING:  # memmap is imported only when it is asked for
    from kvprobe.memmap import Settings


def memmap_settings(inv: Inventory, ref: Inventory) -> Settings | None:
    """The allocator settings a server reports in cache_config_info (the reference's where it says
    nothing), so a pair that differs in its Mamba state dtype or prefix caching is predicted as served.
    None: a setting memmap does not model (a mamba_cache_mode other than align / none)."""
    from kvprobe.memmap import Settings
    from kvprobe.memmap.dtypes import MAMBA_DTYPES, STATE_DTYPE_BYTES

    labels = {**(ref.cache_config or {}), **(inv.cache_config or {})}

    def label(name: str, allowed: tuple[str, ...], default: str) -> str:
        value = labels.get(name)
        return value if value in allowed else default

    try:
        memory = number(labels.get("kv_cache_memory_bytes"), "kv_cache_memory_bytes", integer=True, minimum=1,
                        maximum=MAX_TOKENS * 2**20, text=True)
    except Unreadable:  # the allocator's default then: the prediction says which memory it assumed
        memory = Settings.kv_memory_bytes
    mode = labels.get("mamba_cache_mode")
    if mode not in (None, "align", "none"):
        return None
    # The weights' dtype as served ("torch.float32"), which "auto" KV takes; only /server_info shows it.
    info = inv.server_info or ref.server_info or {}
    served = str(info.get("vllm_config.model_config.dtype") or "").removeprefix("torch.")
    # The byte layout of the platform the server runs on (a GPU's per-token-head formats carry scales);
    # a server that does not say is taken as the CPU build, and its row shows predicted beside measured.
    device = (inv.platform or ref.platform).device if (inv.platform or ref.platform) else None
    return Settings(
        platform="cuda" if device == "cuda" else "cpu",
        model_dtype=served if served in STATE_DTYPE_BYTES else None,
        kv_memory_bytes=memory,
        mamba_cache_dtype=label("mamba_cache_dtype", MAMBA_DTYPES, "auto"),
        mamba_ssm_cache_dtype=label("mamba_ssm_cache_dtype", MAMBA_DTYPES, "auto"),
        mamba_cache_mode=mode,
    )
