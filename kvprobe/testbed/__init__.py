"""Local real-vLLM servers for the demo and the integration tests (vLLM runs in its own venv)."""

from kvprobe.testbed.launcher import (
    NEEDLE_LLAMA,
    LaunchError,
    LocalServer,
    ServerSpec,
    StartRefused,
    ensure_venv,
    start,
    start_each,
    start_many,
    status,
    stop,
    stop_all,
)
from kvprobe.testbed.scenarios import Scenario, Testbed, testbed


def demo_specs() -> list[ServerSpec]:
    """The demo trio this CPU can run: same model and flags, only the KV dtype differs."""
    return [sc.spec for sc in testbed().demo() if sc.spec is not None]


__all__ = [
    "NEEDLE_LLAMA",
    "LaunchError",
    "LocalServer",
    "Scenario",
    "ServerSpec",
    "StartRefused",
    "Testbed",
    "demo_specs",
    "ensure_venv",
    "start",
    "start_each",
    "start_many",
    "status",
    "stop",
    "stop_all",
    "testbed",
]
