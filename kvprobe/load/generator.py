"""Run one load case on one server: N agents, closed loop (each agent sends its next turn when the last
finished) or open loop (Poisson arrivals at a fixed rate); every finished request becomes a row.

A failed request with a 5xx or no answer triggers one /health check; if the server does not answer
it, the case stops at once (in-flight requests are abandoned) and reports the server dead with the
request's error, so the caller can mark it broken and keep what finished.
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

from kvprobe.client import Client, Generation
from kvprobe.config import LoadSettings
from kvprobe.errors import KvprobeError
from kvprobe.load.stats import request_row
from kvprobe.load.workload import Conversation, Shape, TextSource, conversation, request_body


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
                 on_row: Callable[[dict[str, Any]], None] | None = None):
        self.client = client
        self.settings = settings
        self.shape = shape
        self.agents = agents
        self.nonce = nonce
        self.source = source
        self.overrides = overrides or {}
        self.on_row = on_row
        self.out = CaseOutcome()
        self._stop = asyncio.Event()
        self._claimed = 0
        self._health_lock = asyncio.Lock()
        self._deadline: float | None = None
        self._convs: dict[tuple[int, int], Conversation] = {}

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
        budget = self.settings.requests_per_case
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
                tasks.append(asyncio.create_task(self._send(agent, index, turn)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def run(self) -> CaseOutcome:
        with quiet_gc():
            return await self._run()

    async def _run(self) -> CaseOutcome:
        self.out.t_start = time.perf_counter()
        if self.settings.duration_s is not None:
            self._deadline = self.out.t_start + self.settings.duration_s
        if self.settings.mode == "open":
            work = asyncio.create_task(self._open())
        else:
            work = asyncio.ensure_future(asyncio.gather(*(self._agent(a) for a in range(self.agents))))
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
