"""Wait between load cases by the servers' own state instead of a fixed sleep.

The next case may start once every server's /metrics has shown nothing running and nothing waiting for
a short quiet window: a server still finishing (or draining an abandoned stream) would otherwise share
the box with the case being measured. `settle_s` only caps the wait: a server whose /metrics cannot be
read or never goes quiet costs at most the old fixed pause, never more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from kvprobe.errors import KvprobeError
from kvprobe.server.client import Client
from kvprobe.server.metrics import RUNNING, WAITING, only_families, parse_metrics

# Idle this long on every server before a case starts: past the ~0.2 s a CUDA worker thread keeps
# spinning after its last batch, short enough that a GPU case of a few seconds keeps the box busy.
QUIET_S = 0.3


def on_shared_cpus(devices: Sequence[str | None]) -> bool:
    """Servers on CPUs (a test box, sharing cores with each other and the client): the last case's OpenMP
    threads spin down for up to ~1 s after /metrics already says idle, and polling /metrics meanwhile costs the
    servers' cores too. There the fixed settle_s pause stays, the measured choice of earlier runs: with a 1 s
    quiet window on a 2-core Intel Xeon (AMX) the client's loop ran late (mean 3-11 ms, p99 40-190 ms) in enough
    cases that 7 of 12 demo blocks were dropped as client-limited, though the same box dropped 3 of 4 with the
    2 s pause too, so the window is not shown to be the cause. `devices`: "cpu", "cuda", or None."""
    return "cpu" in devices
POLL_S = 0.1


async def _busy(client: Client) -> float | None:
    """Requests running or waiting on the server; None when /metrics does not say."""
    try:
        gauges = parse_metrics(only_families(await client.metrics_text(), (RUNNING, WAITING))).gauges()
    except KvprobeError:
        return None
    running, waiting = gauges.get(RUNNING), gauges.get(WAITING)
    if running is None or waiting is None:
        return None
    return running + waiting


async def quiet(clients: Sequence[Client], cap_s: float, quiet_s: float = QUIET_S,
                poll_s: float = POLL_S) -> float:
    """Wait until every server has been idle for `quiet_s` (or `cap_s` has passed); the seconds waited."""
    t0 = time.perf_counter()
    idle_since: float | None = None
    while True:
        now = time.perf_counter()
        if now - t0 >= cap_s:
            return now - t0
        try:  # a scrape that hangs must not outlast the cap (the client's own timeout is minutes)
            busy = await asyncio.wait_for(asyncio.gather(*(_busy(c) for c in clients)), cap_s - (now - t0))
        except TimeoutError:
            return time.perf_counter() - t0
        now = time.perf_counter()
        if all(b == 0 for b in busy):
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= quiet_s:
                return now - t0
        else:
            idle_since = None  # unreadable counts as busy: the cap then decides, as the fixed pause did
        await asyncio.sleep(min(poll_s, max(0.0, cap_s - (time.perf_counter() - t0))))
