"""Capacity: KV cache tokens per server from /metrics, and each candidate's ratio to the reference."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprobe.errors import Unreadable
from kvprobe.server.inventory import Inventory
from kvprobe.server.pin import PinCheck
from kvprobe.server.untrusted import MAX_TOKENS, number

if TYPE_CHECKING:  # memmap is imported only when servers.toml asks for it
    from kvprobe.memmap import Plan, Settings


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


def _settings(inv: Inventory, ref: Inventory) -> Settings | None:
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


def _predict(config_path: str, inv: Inventory, ref: Inventory) -> Plan | None:
    """This server's own prediction; None where memmap has no byte model for one of its settings."""
    from kvprobe.errors import ConfigError
    from kvprobe.memmap import build
    from kvprobe.memmap.dtypes import KV_DTYPES

    settings = _settings(inv, ref)
    if settings is None or inv.cache_dtype not in KV_DTYPES:
        return None
    try:
        return build(config_path, [inv.cache_dtype], inv.max_model_len or ref.max_model_len, settings).plans[
            inv.cache_dtype]
    except ConfigError:
        return None


def memory_map_summary(config_path: str, reference: str, inventories: dict[str, Inventory],
                       capacity_gain_min: float, chart: Path | None = None) -> dict[str, Any]:
    """The memory map of servers.toml's `model_config`, beside each server's measured capacity.

    The map itself (dtypes, conclusion, lever) is the reference's: its max_model_len, KV memory and
    Mamba state settings from cache_config_info. Each server is predicted with its own labels, so a
    candidate that changes the SSM state dtype or prefix caching instead of the KV dtype is sized right.

    A config memmap cannot read is bad input: the result carries `error` and the caller stops.
    A setting memmap has no byte model for is a limit, not an error: that server is left unpredicted.
    """
    from kvprobe.errors import ConfigError, NotModelled
    from kvprobe.memmap import build, lever
    from kvprobe.memmap.dtypes import KV_DTYPES

    ref = inventories[reference]
    settings = _settings(ref, ref)
    if ref.cache_dtype not in KV_DTYPES:
        return {"config": config_path, "skipped": f"no byte model for the reference dtype {ref.cache_dtype}"}
    if settings is None:
        mode = (ref.cache_config or {}).get("mamba_cache_mode")
        return {"config": config_path, "skipped": f"no allocator model for the reference's mamba_cache_mode {mode}"}
    dtypes = [inv.cache_dtype for inv in (ref, *inventories.values()) if inv.cache_dtype in KV_DTYPES]
    where = f"servers.toml model_config {config_path}"
    try:
        mm = build(config_path, dtypes, ref.max_model_len, settings)
    except NotModelled as exc:
        return {"config": config_path, "skipped": "; ".join(exc.problems)}
    except ConfigError as exc:
        return {"config": config_path, "error": f"{where}: {'; '.join(exc.problems)}"}
    lv = lever(mm)
    sentence = lv.sentence()

    plans = {name: _predict(config_path, inv, ref) for name, inv in inventories.items()}
    ref_plan = plans[reference]
    servers: dict[str, Any] = {}
    explain: dict[str, str] = {}
    ref_tokens = ref.capacity.kv_cache_tokens if ref.capacity else None
    for name, inv in inventories.items():
        measured = inv.capacity.kv_cache_tokens if inv.capacity and not inv.capacity.estimate else None
        plan = plans[name]
        predicted = plan.kv_cache_tokens if plan else None
        predicted_ratio = (plan.kv_cache_tokens / ref_plan.kv_cache_tokens
                           if plan and ref_plan and ref_plan.kv_cache_tokens else None)
        labels = inv.cache_config or {}
        servers[name] = {
            "cache_dtype": inv.cache_dtype,
            "mamba_ssm_cache_dtype": labels.get("mamba_ssm_cache_dtype"),
            "mamba_cache_mode": labels.get("mamba_cache_mode"),
            "predicted_kv_cache_tokens": predicted, "measured_kv_cache_tokens": measured,
            "predicted_ratio": predicted_ratio,
            "error_pct": 100.0 * (predicted - measured) / measured if predicted and measured else None,
        }
        ratio = inv.capacity.kv_cache_tokens / ref_tokens if inv.capacity and ref_tokens else None
        if name != reference and ratio is not None and ratio < 1 + capacity_gain_min:
            predicted_text = (f"memmap predicted {predicted_ratio:.2f}x" if predicted_ratio is not None
                              else "memmap cannot size it")
            # The lever sentence last: a KV dtype that frees nothing is told which knob would.
            explain[name] = (f"{name} gives {ratio:.2f}x the capacity of {reference}, under the "
                             f"{1 + capacity_gain_min:.2f}x bar; {predicted_text}. {mm.conclusion()} {sentence}")
    out = {"config": config_path, **mm.details(), "servers": servers, "explain": explain,
           "lever": lv.to_json()}
    if chart is not None:
        from kvprobe.report.bytes_chart import bytes_chart
        from kvprobe.report.lever_chart import lever_chart

        out["chart"] = bytes_chart(mm, chart).name
        if lv.ssm_dtypes:
            out["lever_chart"] = lever_chart(lv, chart.with_name(f"{chart.stem}-lever.png")).name
    return out
