"""The client's own load during a load case, measured while the case runs.

A load generator that is itself the bottleneck measures itself: its p99s are its event loop's queue
and its throughput is its CPU. So every case records, on the client:
- loop lag: how late a 10 ms ticker wakes (any callback of the loop is late by as much);
- read lag: how long bytes waited between their kernel receive stamp and the loop reading them
  (kvprobe.server.rxstamp; only with kernel stamps);
- CPU: the process's CPU seconds over the case's wall seconds (1.0 is one core, all of it).

Whether these figures could have moved the case's numbers (client_limited) is kvprobe.stats.client_limit's
rule, which the verdict applies too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TICK_S = 0.01
_KEEP = 20_000  # read-lag samples kept per case (a reservoir would cost more than it saves)


@dataclass
class ClientLoad:
    stamps: str = "loop"
    loop_lag: list[float] = field(default_factory=list)
    read_lag: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def on_read(self, lag_s: float) -> None:
        if len(self.read_lag) < _KEEP:
            self.read_lag.append(lag_s)

    def summary(self) -> dict[str, Any]:
        def p99(values: list[float]) -> float | None:
            return float(np.percentile(values, 99)) if values else None

        return {"client_stamps": self.stamps, "client_loop_lag_p99_s": p99(self.loop_lag),
                "client_loop_lag_mean_s": float(np.mean(self.loop_lag)) if self.loop_lag else None,
                "client_read_lag_p99_s": p99(self.read_lag),
                "client_cpu_share": self.cpu_s / self.wall_s if self.wall_s > 0 else None}


@contextlib.asynccontextmanager
async def watching(load: ClientLoad | str):
    """Measure the client while the body runs; the ClientLoad is complete after the block."""
    load = ClientLoad(load) if isinstance(load, str) else load

    async def tick() -> None:
        due = time.perf_counter() + TICK_S
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            load.loop_lag.append(max(0.0, now - due))
            due = max(due + TICK_S, now)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    ticker = asyncio.create_task(tick())
    try:
        yield load
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        load.cpu_s, load.wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
