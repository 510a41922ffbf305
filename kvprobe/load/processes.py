"""Past one core: a load case's agents sharded over worker processes on the client host.

One Python process reads about 256 streams within the timing targets (benchmarks/client_overhead.py:
p99 error under 0.5 ms at 256, kernel stamps); past that its event loop is the limit. So a case can
run as N shards, agent a in shard a % N (kvprobe.load.generator), one per worker process.

- Workers are spawned, not forked (the parent runs an event loop and threads), once per probe run,
  and reused for every case; each has its own event loop and one Client per server for its life, so
  keep-alive connections carry over from the warm-up to every case, as in one process (a connection
  opened inside a case puts its TCP handshake in that request's TTFT). Worker k always runs shard k.
- Every shard of a case starts at one time.perf_counter() value the parent picks: on Linux it is
  CLOCK_MONOTONIC, one clock for every process on the host, so the shards' rows share a time base
  and their kernel stamps are on it too (kvprobe.server.rxstamp).
- Each shard records its own rows, one JSON line each, in its own file in the run directory as they
  finish. The parent merges them into events.jsonl when the case ends and removes the files. A case
  that did not end leaves its files on disk (no load_case event: a rerun measures it again).
- A shard whose server dies sets a shared stop, so every shard ends the case at once.
- A worker dies with the parent (PR_SET_PDEATHSIG), and is stopped when the probe ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from kvprobe.config import LoadSettings, Server
from kvprobe.errors import KvprobeError
from kvprobe.load.workload import Shape

STREAMS_PER_PROCESS = 256
READY_TIMEOUT_S = 120.0
START_DELAY_S = 0.25  # sending a job and entering its case takes ~10 ms; the rest is margin


def processes_for(settings: LoadSettings, agents: int) -> int:
    """Shards for a case of `agents`: as configured, else one per 256 agents and at most one per core."""
    if settings.processes is not None:
        return max(1, min(settings.processes, agents))
    return max(1, min(os.cpu_count() or 1, math.ceil(agents / STREAMS_PER_PROCESS)))


@dataclass(frozen=True)
class ShardJob:
    """One shard of one case, as a worker process receives it (pickled)."""

    server: Server
    model: str | None
    settings: LoadSettings
    shape: Shape
    agents: int
    nonce: str
    chars_per_token: float
    overrides: dict[str, Any]
    shard: int
    shards: int
    start_at: float | None  # time.perf_counter() on this host; None: start at once (no shared clock)
    rows_path: str
    # Adds fields to a row from its Generation, in the worker (a module-level function: it is pickled).
    row_hook: Callable[[Any, dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class ShardResult:
    shard: int
    rows: int
    t_start: float
    dead: str | None
    client: dict[str, Any]
    pid: int
    disk_error: str | None = None


# -- the worker process -------------------------------------------------------------------------

def _die_with_parent() -> None:
    with contextlib.suppress(Exception):  # Linux only; elsewhere the daemon flag still applies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _serve(conn: Connection, progress: Any, stop: Any) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C and stops the workers
    import kvprobe.load.generator  # noqa: F401  (paid once, before the first case's start time)

    # One loop and one client per server for the worker's life: keep-alive connections carry over
    # from case to case (and from the warm-up), as the one-process path's do.
    loop = asyncio.new_event_loop()
    clients: dict[tuple[str, str], Any] = {}
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            try:
                conn.send(("ok", loop.run_until_complete(_shard(job, progress, stop, clients))))
            except BaseException as exc:  # a bug in a worker is the parent's error to report
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(_close(clients))
        loop.close()


def run_shard(job: ShardJob, progress: Any = None, stop: Any = None) -> ShardResult:
    """One shard in this process, on a loop and a client of its own (another engine's worker, e.g. a
    Ray task: examples/ray_load.py). `progress` gets the shard number per finished request."""
    async def once() -> ShardResult:
        clients: dict[tuple[str, str], Any] = {}
        try:
            return await _shard(job, progress if progress is not None else queue.Queue(),
                                stop if stop is not None else threading.Event(), clients)
        finally:
            await _close(clients)

    return asyncio.run(once())


async def _close(clients: dict[tuple[str, str], Any]) -> None:
    for client in clients.values():
        await client.aclose()


async def _shard(job: ShardJob, progress: Any, stop: Any, clients: dict[tuple[str, str], Any]) -> ShardResult:
    from kvprobe.load.generator import CaseRunner
    from kvprobe.load.workload import TextSource
    from kvprobe.server.client import Client

    s = job.server
    client = clients.get((s.name, s.url))
    if client is None:
        client = clients[(s.name, s.url)] = Client.for_server(s)
    client.model = job.model
    disk: list[str] = []
    fh = open(job.rows_path, "ab")  # noqa: SIM115  (closed below, after the case)
    runner: CaseRunner

    def on_row(row: dict[str, Any]) -> None:
        try:
            fh.write(orjson.dumps(row) + b"\n")
            fh.flush()
        except OSError as exc:
            disk.append(exc.strerror or str(exc))
            runner.stop()
        with contextlib.suppress(queue.Full):
            progress.put_nowait(job.shard)

    runner = CaseRunner(client, job.settings, job.shape, job.agents, job.nonce, TextSource(job.chars_per_token),
                        job.overrides, on_row, shard=(job.shard, job.shards), row_hook=job.row_hook)

    async def watch_stop() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.02)
        runner.stop()

    watcher = asyncio.create_task(watch_stop())
    try:
        outcome, figures = await runner.run_measured(job.start_at)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        with contextlib.suppress(OSError):
            fh.close()
    if outcome.dead:
        stop.set()
    return ShardResult(job.shard, len(outcome.rows), outcome.t_start, outcome.dead, figures, os.getpid(),
                       disk[0] if disk else None)


# -- the parent ---------------------------------------------------------------------------------

class Workers:
    """N worker processes, ready before the first case; `async with` stops them."""

    def __init__(self, processes: int):
        ctx = mp.get_context("spawn")
        self.progress = ctx.Queue(maxsize=100_000)
        self.stop = ctx.Event()
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for k in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, self.progress, self.stop), daemon=True,
                               name=f"kvprobe-load-{k}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self.pids: list[int] = []

    @property
    def size(self) -> int:
        return len(self._procs)

    async def __aenter__(self) -> Workers:
        loop = asyncio.get_running_loop()
        got = await asyncio.gather(*(loop.run_in_executor(None, self._recv, k, READY_TIMEOUT_S)
                                     for k in range(self.size)), return_exceptions=True)
        failed = [g for g in got if isinstance(g, BaseException)]
        if failed:
            self.close()
            raise failed[0]
        self.pids = [int(g[1]) for g in got]  # type: ignore[index]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _recv(self, k: int, timeout_s: float | None = None) -> tuple[str, Any]:
        conn, proc = self._conns[k], self._procs[k]
        try:
            while not conn.poll(1.0):
                if not proc.is_alive():
                    raise EOFError
                if timeout_s is not None:
                    timeout_s -= 1.0
                    if timeout_s <= 0:
                        raise KvprobeError(f"load: client worker process {k} did not start in {READY_TIMEOUT_S:.0f} s")
            return conn.recv()
        except (EOFError, OSError):
            raise self._died(k) from None

    def _died(self, k: int) -> KvprobeError:
        proc = self._procs[k]
        proc.join(2)
        code = proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return KvprobeError(f"load: client worker process {k} died ({how}); the case is not recorded and "
                            "reruns on --resume")

    def _send(self, job: ShardJob) -> None:
        try:
            self._conns[job.shard].send(job)
        except OSError:  # the worker died between cases: its end of the pipe is gone (BrokenPipeError)
            self.stop.set()
            raise self._died(job.shard) from None

    async def run(self, jobs: list[ShardJob], on_row: Callable[[int], None]) -> list[ShardResult]:
        """Shard k on worker k; `on_row(shard)` for each finished request, on the caller's loop."""
        self.stop.clear()
        loop = asyncio.get_running_loop()
        for job in jobs:
            self._send(job)
        waits = [loop.run_in_executor(None, self._recv, job.shard) for job in jobs]
        pump = asyncio.create_task(self._pump(on_row))
        try:
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # a worker died: the others end the case now rather than at its end
                self.stop.set()
            got = await asyncio.gather(*waits, return_exceptions=True)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            self._drain(on_row)
        results: list[ShardResult] = []
        for job, answer in zip(jobs, got, strict=True):
            if isinstance(answer, BaseException):
                self.stop.set()
                raise answer
            kind, value = answer
            if kind != "ok":
                raise KvprobeError(f"load: client worker process {job.shard} failed: {value}")
            results.append(value)
        return results

    async def _pump(self, on_row: Callable[[int], None]) -> None:
        while True:
            self._drain(on_row)
            await asyncio.sleep(0.1)

    def _drain(self, on_row: Callable[[int], None]) -> None:
        while True:
            try:
                on_row(self.progress.get_nowait())
            except queue.Empty:
                return

    def close(self) -> None:
        self.stop.set()  # a case still running (^C, an error) ends now rather than at its end
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self.progress.close()


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """A shard's rows; a line torn by a crash is skipped."""
    out = []
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
        for line in fh:
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
    return out


def merge_client(summaries: list[dict[str, Any]], agents: list[int] | None = None) -> dict[str, Any]:
    """The case's client figures over its processes (`agents`: how many agents each drove; None: alike).
    The p99s and the CPU share are the worst process's, since any one of them running late moves the case's
    p99s (kvprobe.stats.client_limit.limited reads these keys). The mean loop lag is the mean over the
    agents: a turn is late by its own process's lag, so the case's offered load is lighter by the agents'
    mean lateness, which is what the throughput rules read (lateness_move, paired_lateness); the worst
    process's would over-correct a case whose other processes kept time."""
    def worst(key: str) -> float | None:
        values = [s[key] for s in summaries if isinstance(s.get(key), int | float)]
        return max(values) if values else None

    weights = agents or [1] * len(summaries)
    lags = [(s["client_loop_lag_mean_s"], w) for s, w in zip(summaries, weights, strict=True)
            if isinstance(s.get("client_loop_lag_mean_s"), int | float) and w > 0]
    mean = sum(lag * w for lag, w in lags) / sum(w for _, w in lags) if lags else None
    stamps = {s.get("client_stamps") for s in summaries}
    return {"client_stamps": "kernel" if stamps == {"kernel"} else "loop",
            **{k: worst(k) for k in ("client_loop_lag_p99_s", "client_read_lag_p99_s", "client_cpu_share")},
            "client_loop_lag_mean_s": mean,
            "client_processes": len(summaries), "client_by_process": summaries}
