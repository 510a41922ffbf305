"""Sample a server's /metrics while a load case runs: gauges over time, counters as deltas over the
case window (vLLM counters are totals since the server started)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from kvprobe.errors import KvprobeError
from kvprobe.load import spec_decode
from kvprobe.server.client import Client
from kvprobe.server.metrics import (
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RUNNING,
    SPEC_DECODE,
    WAITING,
    MetricsSnapshot,
    counter_deltas,
    only_families,
    parse_metrics,
)

# What a load case samples: the gauges and the counters whose deltas it reports.
SAMPLED = (KV_USAGE, RUNNING, WAITING, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, PROMPT_TOKENS, GENERATION_TOKENS,
           *SPEC_DECODE)

DELTA_NAMES = {
    PREEMPTIONS: "preemptions",
    PREFIX_QUERIES: "prefix_cache_queries",
    PREFIX_HITS: "prefix_cache_hits",
    PROMPT_TOKENS: "prompt_tokens",
    GENERATION_TOKENS: "generation_tokens",
}


class MetricsSampler:
    """`async with MetricsSampler(client, 0.5) as s:` run the case; then `s.summary()`."""

    def __init__(self, client: Client, interval_s: float):
        self.client = client
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.before: MetricsSnapshot | None = None
        self.after: MetricsSnapshot | None = None
        self._t0 = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _scrape(self) -> MetricsSnapshot | None:
        try:
            snap = parse_metrics(only_families(await self.client.metrics_text(), SAMPLED))
        except KvprobeError as exc:
            self._error(str(exc))
            return None
        for line in snap.unreadable:  # those samples are left out of the snapshot
            self._error(line)
        return snap

    def _error(self, line: str) -> None:
        if len(self.errors) < 5 and line not in self.errors:
            self.errors.append(line)

    def _record(self, snap: MetricsSnapshot) -> None:
        gauges = snap.gauges()
        row: dict[str, Any] = {
            "t": round(time.perf_counter() - self._t0, 3),
            "kv_usage": gauges.get(KV_USAGE),
            "running": gauges.get(RUNNING),
            "waiting": gauges.get(WAITING),
        }
        if self.before is not None:
            row["preemptions"] = counter_deltas(self.before, snap).get(PREEMPTIONS)
        self.samples.append(row)

    async def _loop(self) -> None:
        while True:
            started = time.perf_counter()
            snap = await self._scrape()
            if snap is not None:
                self._record(snap)
            await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))

    async def __aenter__(self) -> MetricsSampler:
        self._t0 = time.perf_counter()
        self.before = await self._scrape()
        if self.before is not None:
            self._record(self.before)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if exc[0] is None:
            self.after = await self._scrape()
            if self.after is not None:
                self._record(self.after)

    def summary(self) -> dict[str, Any]:
        """Highest gauges over the case, counter deltas over its window and, where the server drafts
        speculatively, the drafts' acceptance over it."""
        def top(key: str) -> float | None:
            vals = [s[key] for s in self.samples if s.get(key) is not None]
            return max(vals) if vals else None

        deltas: dict[str, float] = {}
        spec = None
        if self.before is not None and self.after is not None:
            raw = counter_deltas(self.before, self.after)
            deltas = {DELTA_NAMES[k]: v for k, v in raw.items() if k in DELTA_NAMES}
            spec = spec_decode.window(self.before, self.after)
        queries, hits = deltas.get("prefix_cache_queries"), deltas.get("prefix_cache_hits")
        out: dict[str, Any] = {
            "kv_usage_max": top("kv_usage"),
            "running_max": top("running"),
            "waiting_max": top("waiting"),
            "deltas": deltas,
            "prefix_cache_hit_rate": (hits / queries) if queries and hits is not None else None,
            "samples": self.samples,
            "errors": self.errors,
        }
        if spec is not None:  # absent, not zero, on a server without speculative decoding
            out["spec_decode"] = spec
        return out
