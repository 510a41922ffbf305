"""Capacity: KV cache tokens per server from /metrics, and each candidate's ratio to the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprobe.errors import ConfigError, NotModelled
from kvprobe.server.allocator import memmap_settings
from kvprobe.server.inventory import Inventory
from kvprobe.server.pin import PinCheck

if TYPE_CHECKING:  # memmap is imported only when servers.toml asks for it
    from kvprobe.memmap import Plan
    from kvprobe.run.context import EvalContext


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


def _predict(config_path: str, inv: Inventory, ref: Inventory) -> Plan | None:
    """This server's own prediction; None where memmap has no byte model for one of its settings."""
    from kvprobe.memmap import build
    from kvprobe.memmap.dtypes import KV_DTYPES

    settings = memmap_settings(inv, ref)
    if settings is None or inv.cache_dtype not in KV_DTYPES:
        return None
    try:
        return build(config_path, [inv.cache_dtype], inv.max_model_len or ref.max_model_len, settings).plans[
            inv.cache_dtype]
    except ConfigError:
        return None


def _server_row(inv: Inventory, plan: Any, ref_plan: Any) -> dict[str, Any]:
    """One server's labels, its predicted and measured KV tokens, and how far the prediction is off."""
    measured = inv.capacity.kv_cache_tokens if inv.capacity and not inv.capacity.estimate else None
    predicted = plan.kv_cache_tokens if plan else None
    labels = inv.cache_config or {}
    return {
        "cache_dtype": inv.cache_dtype,
        "mamba_ssm_cache_dtype": labels.get("mamba_ssm_cache_dtype"),
        "mamba_cache_mode": labels.get("mamba_cache_mode"),
        "predicted_kv_cache_tokens": predicted, "measured_kv_cache_tokens": measured,
        "predicted_ratio": (plan.kv_cache_tokens / ref_plan.kv_cache_tokens
                            if plan and ref_plan and ref_plan.kv_cache_tokens else None),
        "error_pct": 100.0 * (predicted - measured) / measured if predicted and measured else None,
    }


def memory_map_summary(config_path: str, reference: str, inventories: dict[str, Inventory],
                       capacity_gain_min: float, chart: Path | None = None,
                       draw: Callable[[Any, Any, Path], Path | None] | None = None) -> dict[str, Any]:
    """The memory map of servers.toml's `model_config`, beside each server's measured capacity.

    The map itself (dtypes, conclusion, lever) is the reference's: its max_model_len, KV memory and
    Mamba state settings from cache_config_info. Each server is predicted with its own labels, so a
    candidate that changes the SSM state dtype or prefix caching instead of the KV dtype is sized right.

    A config memmap cannot read is bad input: the result carries `error` and the caller stops.
    A setting memmap has no byte model for is a limit, not an error: that server is left unpredicted.
    """
    from kvprobe.memmap import build, lever
    from kvprobe.memmap.dtypes import KV_DTYPES

    ref = inventories[reference]
    settings = memmap_settings(ref, ref)
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
    servers = {name: _server_row(inv, plans[name], plans[reference]) for name, inv in inventories.items()}
    explain: dict[str, str] = {}
    ref_tokens = ref.capacity.kv_cache_tokens if ref.capacity else None
    for name, inv in inventories.items():
        ratio = inv.capacity.kv_cache_tokens / ref_tokens if inv.capacity and ref_tokens else None
        if name != reference and ratio is not None and ratio < 1 + capacity_gain_min:
            predicted_ratio = servers[name]["predicted_ratio"]
            predicted_text = (f"memmap predicted {predicted_ratio:.2f}x" if predicted_ratio is not None
                              else "memmap cannot size it")
            # The lever sentence last: a KV dtype that frees nothing is told which knob would.
            explain[name] = (f"{name} gives {ratio:.2f}x the capacity of {reference}, under the "
                             f"{1 + capacity_gain_min:.2f}x bar; {predicted_text}. {mm.conclusion()} {sentence}")
    out = {"config": config_path, **mm.details(), "servers": servers, "explain": explain,
           "lever": lv.to_json()}
    if chart is not None and draw is not None:
        if (drawn := draw("memmap", mm, chart)) is not None:
            out["chart"] = drawn.name
        if lv.ssm_dtypes and (drawn := draw("lever", lv, chart.with_name(f"{chart.stem}-lever.png"))) is not None:
            out["lever_chart"] = drawn.name
    return out


async def run(ctx: EvalContext) -> dict[str, Any]:
    """capacity.json: what each server claims, and the memory map's prediction when servers.toml names
    the model's config.json. Asks no server anything: the inventory already holds it."""
    summary = capacity_summary(ctx.reference, ctx.inventories, ctx.pin)
    memmap: dict[str, Any] = {}
    if ctx.config.model_config_path:
        memmap = summary["memmap"] = memory_map_summary(
            ctx.config.model_config_path, ctx.reference, ctx.inventories, ctx.config.bars.capacity_gain_min,
            ctx.run.path / "memmap.png", ctx.reporter.draw)
    ctx.run.write_json("capacity.json", summary)
    if "error" in memmap:
        raise ConfigError([memmap["error"]])
    if memmap:
        ctx.console.print(f"memory map: {memmap.get('conclusion') or memmap.get('skipped')}", highlight=False)
        if sentence := (memmap.get("lever") or {}).get("sentence"):
            ctx.console.print(f"lever: {sentence}", highlight=False)
    return summary
