"""Helpers for tests that are about one scenario of the testbed (kvprobe.testbed.scenarios)."""

from __future__ import annotations

import pytest

from kvprobe.testbed import Testbed


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


def wait_quiet(urls: list[str], timeout_s: float = 120.0) -> float:
    """Wait until no server at `urls` has a request running or waiting (their /metrics); the seconds
    waited. A timing test runs on a quiet box: the servers share its 2 cores, and a request an earlier
    test abandoned (a canary cut at its budget) is still prefilling for up to ~10 s after that test."""
    import time
    import urllib.request

    from kvprobe.server.metrics import RUNNING, WAITING, parse_metrics

    t0 = time.monotonic()
    while True:
        busy = {}
        for url in urls:
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
                gauges = parse_metrics(resp.read().decode()).gauges()
            if gauges.get(RUNNING, 0) or gauges.get(WAITING, 0):
                busy[url] = gauges
        if not busy:
            time.sleep(1.0)  # a server's threads spin for up to ~1 s after its last request
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"servers still busy after {timeout_s:.0f} s: {busy}")
        time.sleep(0.25)
