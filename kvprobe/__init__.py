"""kvprobe: is a KV-cache setting worth deploying? Measured against a gold reference, with evidence.

`import kvprobe` loads only the config and the errors; the rest is imported on first use, so nothing
heavy (lm-eval, matplotlib) comes with it.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import Any

from kvprobe.config import Bars, Config, Server, load_config
from kvprobe.errors import ConfigError, DiskError, KvprobeError, ServerError, SignatureError, Unreachable, Unreadable

try:
    __version__ = _version("kvprobe")  # one source: pyproject.toml
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "Client": "kvprobe.server.client",
    "Generation": "kvprobe.server.client",
    "Inventory": "kvprobe.server.inventory",
    "take_inventories": "kvprobe.server.inventory",
    "EvalOutcome": "kvprobe.evaluate.orchestrate",
    "run_eval": "kvprobe.evaluate.orchestrate",
    "RunDir": "kvprobe.run.store",
    "write_verdict": "kvprobe.verdict.build",
    "verify_verdict": "kvprobe.verdict.verify",
    "PROBES": "kvprobe.probes",
    "Probe": "kvprobe.probes",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvprobe' has no attribute {name!r}")


__all__ = ["Bars", "Config", "ConfigError", "DiskError", "KvprobeError", "Server", "ServerError", "SignatureError",
           "Unreachable", "Unreadable", "__version__", "load_config", *_LAZY]
