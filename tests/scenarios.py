"""Helpers for tests that are about one scenario of the testbed (kvprobe.servers.testbed)."""

from __future__ import annotations

import pytest

from kvprobe.servers import Testbed


def require(bed: Testbed, key: str) -> None:
    """Skip, saying why, when this CPU cannot run the scenario a test is about."""
    if not bed.available(key):
        pytest.skip(f"no {key} scenario on this {bed.isa} CPU: {bed[key].missing}")


def names(bed: Testbed, *keys: str) -> list[str]:
    """The [[server]] names of the scenarios this CPU runs, in order."""
    return [bed[k].name for k in keys if bed.available(k)]


TRIO = ("reference", "lossless_2x", "lossy_2x")


def trio(vllm_servers: dict) -> list[dict[str, str]]:
    """[[server]] tables for the trio the vllm_servers fixture started: the reference first, each named
    by its KV dtype."""
    return [{"name": vllm_servers[k].spec.kv_cache_dtype, "url": vllm_servers[k].url,
             "role": "reference" if k == "reference" else "candidate"} for k in TRIO if k in vllm_servers]
