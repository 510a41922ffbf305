"""The client's own load (kvprobe.load.client_load): measured while a case runs, and the rule that
marks a case client_limited, which makes its speed bars inconclusive in the verdict."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from verdict_inputs import Measurements

from kvprobe.load.client_load import limited, watching
from kvprobe.verdict.build import build_verdict, rederive

# timing-sensitive: scripts/test runs these alone, after the parallel unit tests
pytestmark = pytest.mark.serial


async def test_a_blocked_loop_shows_as_loop_lag_and_cpu() -> None:
    async with watching("kernel") as load:
        for _ in range(5):
            await asyncio.sleep(0.02)
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:  # the loop is busy: the ticker wakes ~30 ms late
                pass
    summary = load.summary()
    assert summary["client_stamps"] == "kernel" and summary["client_loop_lag_p99_s"] > 0.02
    assert summary["client_read_lag_p99_s"] is None  # no stream read in the block
    async with watching("kernel") as idle:
        await asyncio.sleep(0.25)
    # Busy-waiting costs CPU, sleeping does not (by how much depends on what else runs on the box).
    assert summary["client_cpu_share"] > idle.summary()["client_cpu_share"] + 0.1


async def test_an_idle_loop_is_not_late() -> None:
    async with watching("loop") as load:
        await asyncio.sleep(0.2)
    assert load.summary()["client_loop_lag_p99_s"] < 0.01 and load.summary()["client_cpu_share"] < 0.5


CASE = {"ttft_p99_s": 0.2, "itl_p99_s": 0.03, "e2e_p99_s": 2.0, "itl_p50_s": 0.02, "e2e_p50_s": 1.5}


def test_the_rule_a_tenth_of_the_bar_on_the_p99_the_lag_would_move() -> None:
    # Loop stamps: the lag lands in every chunk's time, so the smallest p99 (ITL 30 ms) counts: 0.3 ms.
    assert limited({"client_stamps": "loop", "client_loop_lag_p99_s": 0.0002}, CASE, 0.10) is None
    why = limited({"client_stamps": "loop", "client_loop_lag_p99_s": 0.0005}, CASE, 0.10)
    assert why and "0.50 ms late" in why and "0.30 ms" in why
    # Kernel stamps: receive times are exact while reads keep up with the tokens (median gap 20 ms)...
    kernel = {"client_stamps": "kernel", "client_loop_lag_p99_s": 0.03, "client_read_lag_p99_s": 0.01,
              "client_loop_lag_mean_s": 0.001}
    assert limited(kernel, CASE, 0.10) is None
    assert limited(kernel | {"client_read_lag_p99_s": 0.05}, CASE, 0.10).startswith(
        "the client read arrived bytes 50.00 ms late")
    # ...and a late loop only sends turns late: 10 ms on average of a 1.5 s request is 0.67% > 0.5%.
    assert "0.7% of a request's median span" in limited(kernel | {"client_loop_lag_mean_s": 0.01}, CASE, 0.10)
    assert "95% of a core" in limited({"client_stamps": "kernel", "client_cpu_share": 0.95}, CASE, 0.10)


def test_a_client_limited_block_is_dropped_and_never_counted(tmp_path: Path) -> None:
    m = Measurements()  # 4 blocks: the first look of the default design
    m.load["servers"]["cand"]["cases"][0] |= {"client_stamps": "loop", "client_loop_lag_p99_s": 0.05,
                                              "client_cpu_share": 0.95}  # the client used a whole core
    v = build_verdict(m.write(tmp_path / "r"))
    endpoint = next(c for c in v["decisions"]["cand"]["checks"] if c["id"] == "load.endpoint.throughput_drop")
    assert endpoint["outcome"] == "inconclusive" and "1 client-limited block dropped" in endpoint["text"]
    assert endpoint["sequential"]["blocks"] == 3  # short of the first look: no decision on 3
    assert v["decisions"]["cand"]["decision"] == "inconclusive" and rederive(v) == []
    # The same numbers without the client's figures (a run recorded before kvprobe measured it) pass.
    assert build_verdict(Measurements().write(tmp_path / "s"))["decisions"]["cand"]["decision"] == "adopt"
