"""Memory map: where a model's per-request bytes are in vLLM's KV cache, and the most a KV dtype can
free, predicted from its Hugging Face config.json by modelling vLLM's allocator. Pure computation:
no vLLM import, no network.

    shape.py      config.json -> the layers that hold KV or recurrent state
    dtypes.py     bytes per element per KV / state dtype
    allocator.py  vLLM's pages, hybrid alignment, groups, blocks per request, capacity
    summary.py    several dtypes side by side: ratios, ceiling, the one-sentence conclusion
    lever.py      KV dtype x Mamba SSM state dtype grid, and the sentence naming the knob that moves
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from kvprobe.errors import ConfigError
from kvprobe.memmap.allocator import Plan, Settings, plan
from kvprobe.memmap.dtypes import STATE_DTYPE_BYTES
from kvprobe.memmap.lever import Lever, lever
from kvprobe.memmap.shape import ModelShape, load_config, model_shape
from kvprobe.memmap.summary import MemoryMap, memory_map

__all__ = ["Lever", "MemoryMap", "ModelShape", "Plan", "Settings", "build", "lever", "load_config", "memory_map",
           "model_shape", "plan"]


def build(config: str | Path | dict[str, Any], dtypes: list[str], max_model_len: int | None = None,
          settings: Settings | None = None) -> MemoryMap:
    """The memory map of a config.json (path or parsed dict) for `dtypes` (the first is the reference)."""
    source = str(config) if not isinstance(config, dict) else "config.json"
    data = config if isinstance(config, dict) else load_config(config)
    name = None
    if not isinstance(config, dict):
        path = Path(config)
        name = path.name if path.is_dir() else path.parent.name or None
    model = model_shape(data, source, name)
    length = max_model_len or model.max_position_embeddings
    if not length:
        raise ConfigError([f"{source}: no max_position_embeddings: pass --max-model-len"])
    if not dtypes:
        raise ConfigError(["--kv-dtype: give at least one KV dtype, e.g. auto,fp8"])
    settings = settings or Settings()
    if settings.model_dtype:
        if settings.model_dtype not in STATE_DTYPE_BYTES:
            raise ConfigError([f"--dtype {settings.model_dtype!r}: choose from {', '.join(STATE_DTYPE_BYTES)}"])
        model = replace(model, dtype=settings.model_dtype)
    return memory_map(model, dtypes, int(length), settings)
