"""Shared fixtures. Integration tests run against real vLLM CPU servers serving needle-llama,
started by kvprobe's own launcher and reused across modules and sessions while they are fit."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kvprobe.servers import LocalServer, demo_specs, start_many, stop


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVPROBE_SKIP_INTEGRATION") == "1":
        skip = pytest.mark.skip(reason="KVPROBE_SKIP_INTEGRATION=1")
        for item in items:
            if "integration" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def _started_ports() -> Iterator[set[int]]:
    """Ports of the servers this session started: stopped at the end unless KVPROBE_KEEP_SERVERS=1
    (servers that were already running, like the demo's, are left alone)."""
    ports: set[int] = set()
    yield ports
    if os.environ.get("KVPROBE_KEEP_SERVERS") != "1":
        for port in sorted(ports):
            stop(port)


@pytest.fixture(scope="module")
def vllm_servers(_started_ports: set[int]) -> dict[str, LocalServer]:
    """The demo trio: kv-cache-dtype auto (:8101), fp8 (:8102), int8_per_token_head (:8103).

    Same model, same flags; only the KV dtype differs. Checked per module, not once per session: the
    launcher recycles an int8_per_token_head server that has served too many tokens (that CPU kernel
    writes past its buffer once its block ids pass half the claimed pool; see launcher.OVERRUN_DTYPES),
    so each module starts from a server that is fit for it."""
    servers = start_many(demo_specs())
    _started_ports.update(s.spec.port for s in servers if not s.reused)
    return {s.spec.kv_cache_dtype: s for s in servers}


@pytest.fixture(autouse=True, scope="session")
def _private_config_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`eval` signs its verdict: no test creates or uses a key in the user's real config directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
        mp.delenv("KVPROBE_SIGNING_KEY", raising=False)
        mp.delenv("KVPROBE_ALLOWED_SIGNERS", raising=False)
        yield
