"""Run one load case on one server: N agents, closed loop (each agent sends its next turn when the last
finished) or open loop (Poisson arrivals at a fixed rate); every finished request becomes a row.

A failed request with a 5xx or no answer triggers one /health check; if the server does not answer
it, the case stops at once (in-flight requests are abandoned) and reports the server dead with the
request's error, so the caller can mark it broken and keep what finished.

A runner can drive one shard of a case (kvprobe.load.processes): the agents whose number is its
shard modulo the shard count. The closed loop's request budget is split by agents; the open loop
walks the whole case's arrival schedule and sends only its own agents' turns, so the schedule is
the same whatever the shard count.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvprobe.config import LoadSettings
from kvprobe.errors import KvprobeError
from kvprobe.load.client_load import ClientLoad, watching
from kvprobe.load.stats import request_row
from kvprobe.load.workload import Conversation, Shape, TextSource, conversation, request_body
from kvprobe.server.client import Client, Generation


@contextlib.contextmanager
def quiet_gc(young_threshold: int = 10_000) -> Iterator[None]:
    """While a case is measured: collect once, freeze what exists so no collection rescans it, and
    make young collections rarer. A full collection over a large heap is a pause of milliseconds that
    lands in some stream's TTFT or ITL (measured: it doubled the client's p99 timing error)."""
    gc.collect()
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], young_threshold), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def split(budget: int, agents: int, shards: int) -> list[int]:
    """A closed loop's request budget per shard, in proportion to each shard's agents."""
    owned = [len(range(k, agents, shards)) for k in range(shards)]
    out = [budget * n // agents for n in owned]
    # largest remainders first (ties: the shard with more agents, then the lower number)
    for k in sorted(range(shards), key=lambda k: (-(budget * owned[k] % agents), -owned[k], k))[:budget - sum(out)]:
        out[k] += 1
    return out


@dataclass
class CaseOutcome:
    rows: list[dict[str, Any]] = field(default_factory=list)
    t_start: float = 0.0
    dead: str | None = None  # the server stopped answering: the failing request's error and /health's

    @property
    def duration_s(self) -> float:
        """First request sent to last request finished."""
        if not self.rows:
            return 0.0
        return max(r["t0"] + (r["e2e"] or 0.0) for r in self.rows) - min(r["t0"] for r in self.rows)


class CaseRunner:
    def __init__(self, client: Client, settings: LoadSettings, shape: Shape, agents: int, nonce: str,
                 source: TextSource, overrides: dict[str, Any] | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None, shard: tuple[int, int] = (0, 1),
                 row_hook: Callable[[Generation, dict[str, Any]], None] | None = None):
        self.client = client
        self.settings = settings
        self.shape = shape
        self.agents = agents
        self.nonce = nonce
        self.source = source
        self.overrides = overrides or {}
        self.on_row = on_row
        self.row_hook = row_hook
        self.out = CaseOutcome()
        self._stop = asyncio.Event()
        self._claimed = 0
        self._health_lock = asyncio.Lock()
        self._deadline: float | None = None
        self._convs: dict[tuple[int, int], Conversation] = {}
        self.shard, self.shards = shard
        self.owned = [a for a in range(agents) if a % self.shards == self.shard]
        self._budget = settings.requests_per_case
        if self._budget is not None and settings.mode == "closed" and self.shards > 1:
            self._budget = split(self._budget, agents, self.shards)[self.shard]

    # -- one request ------------------------------------------------------------------------

    def _conv(self, agent: int, index: int) -> Conversation:
        key = (agent, index)
        if key not in self._convs:
            self._convs[key] = conversation(self.source, self.shape, self.nonce, agent, index)
        return self._convs[key]

    async def _send(self, agent: int, index: int, turn: int) -> None:
        body = request_body(self._conv(agent, index), turn, self.settings, self.shape, self.overrides)
        gen = await self.client.stream_chat(body)
        row = request_row(gen, self.out.t_start, self.client.name)
        row |= {"agent": agent, "conversation": index, "turn": turn}
        if self.row_hook is not None:
            self.row_hook(gen, row)
        if self._stop.is_set() and self.out.dead:
            return  # the server died meanwhile: this request belongs to the dead case, not a measurement
        self.out.rows.append(row)
        if self.on_row:
            self.on_row(row)
        if not gen.ok:
            await self._check_alive(gen)

    async def _check_alive(self, gen: Generation) -> None:
        if gen.status is not None and gen.status < 500:
            return  # the request's fault (400 too long, 404 model...), not the server's
        async with self._health_lock:
            if self.out.dead is not None:
                return
            try:
                await self.client.health()
            except KvprobeError as exc:
                self.out.dead = f"{gen.error}; then /health: {exc}"
                self._stop.set()

    def _claim(self) -> bool:
        """One more request allowed by the budget and the clock?"""
        if self._stop.is_set():
            return False
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return False
        budget = self._budget
        if budget is not None and self._claimed >= budget:
            return False
        self._claimed += 1
        return True

    # -- loops ------------------------------------------------------------------------------

    def _budgeted(self) -> bool:
        return self.settings.requests_per_case is not None or self.settings.duration_s is not None

    async def _agent(self, agent: int) -> None:
        index = 0
        while True:
            for turn in range(self.shape.turns):
                if not self._claim():
                    return
                await self._send(agent, index, turn)
            index += 1
            if not self._budgeted():
                return  # default: one conversation per agent

    def _open_sequence(self) -> Iterator[tuple[int, int, int]]:
        """Turn by turn across agents, conversation after conversation."""
        index = 0
        while True:
            for turn in range(self.shape.turns):
                for agent in range(self.agents):
                    yield agent, index, turn
            index += 1
            if not self._budgeted():
                return

    async def _open(self) -> None:
        assert self.settings.rate is not None
        # Arrival times from the case nonce: every server gets the same schedule.
        rng = np.random.default_rng(int(self.nonce, 16) ^ self.settings.seed)
        tasks: list[asyncio.Task[None]] = []
        due = self.out.t_start
        try:
            for k, (agent, index, turn) in enumerate(self._open_sequence()):
                if k:
                    due += float(rng.exponential(1.0 / self.settings.rate))
                delay = due - time.perf_counter()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                if not self._claim():
                    break
                if agent % self.shards == self.shard:
                    tasks.append(asyncio.create_task(self._send(agent, index, turn)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    def stop(self) -> None:
        """End the case now (another shard's server died); in-flight requests are abandoned."""
        self._stop.set()

    async def run(self, start_at: float | None = None, load: ClientLoad | None = None) -> CaseOutcome:
        """`start_at`: a time.perf_counter() value to start at, shared by every shard of a case (one
        host, one clock). `load` is watched from once the collector is quiet, right before the first
        request (the client's own load is measured over the requests, not the collection before them)."""
        with quiet_gc():
            if load is None:
                return await self._run(start_at)
            async with watching(load):
                return await self._run(start_at)

    async def run_measured(self, start_at: float | None = None) -> tuple[CaseOutcome, dict[str, Any]]:
        """The case and the client's own figures over it (kvprobe.load.client_load): loop lag, CPU,
        and each kernel-stamped read's lag from the stream pool."""
        pool = self.client.stream_pool
        load = ClientLoad(pool.stamps if pool is not None else "loop")
        if pool is not None:
            pool.lag = load.on_read
        try:
            outcome = await self.run(start_at, load)
        finally:
            if pool is not None:
                pool.lag = None
        return outcome, load.summary()

    async def _run(self, start_at: float | None = None) -> CaseOutcome:
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        pool = self.client.stream_pool
        if pool is not None:  # closed: one request per agent at a time; open: arrivals can pile up
            pool.allow(len(self.owned) * (1 if self.settings.mode == "closed" else 4))
        self.out.t_start = start_at if start_at is not None else time.perf_counter()
        if self.settings.duration_s is not None:
            self._deadline = self.out.t_start + self.settings.duration_s
        if self.settings.mode == "open":
            work = asyncio.create_task(self._open())
        else:
            work = asyncio.ensure_future(asyncio.gather(*(self._agent(a) for a in self.owned)))
        stopper = asyncio.create_task(self._stop.wait())
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the server died: abandon what is in flight
            work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        stopper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopper
        return self.out
