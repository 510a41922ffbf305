"""Local real-vLLM servers for the demo and the integration tests (vLLM runs in its own venv)."""

from kvprobe.servers.launcher import (
    NEEDLE_LLAMA,
    LaunchError,
    LocalServer,
    ServerSpec,
    ensure_venv,
    start,
    start_many,
    status,
    stop,
    stop_all,
)

# The demo trio: same model and flags, only the KV dtype differs.
DEMO_PORTS = {"auto": 8101, "fp8": 8102, "int8_per_token_head": 8103}


def demo_specs() -> list[ServerSpec]:
    return [ServerSpec(port=port, kv_cache_dtype=dtype) for dtype, port in DEMO_PORTS.items()]


__all__ = [
    "DEMO_PORTS",
    "NEEDLE_LLAMA",
    "LaunchError",
    "LocalServer",
    "ServerSpec",
    "demo_specs",
    "ensure_venv",
    "start",
    "start_many",
    "status",
    "stop",
    "stop_all",
]
