"""Worker processes (kvprobe.load.processes) against a real local streaming server (the benchmarks'
mock server, in its own process): two shards share a case on one clock, and a server that dies
mid-case ends every shard's case at once, reported dead, with what finished kept on disk."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvprobe.config import LoadSettings, Server
from kvprobe.errors import KvprobeError
from kvprobe.load.processes import START_DELAY_S, ShardJob, Workers, read_rows
from kvprobe.load.workload import shapes_of
from kvprobe.testbed.launcher import free_port, healthy

# timing-sensitive: scripts/test runs these alone, after the parallel unit tests
pytestmark = pytest.mark.serial

MOCK = Path(__file__).resolve().parents[2] / "benchmarks" / "mock_server.py"


@pytest.fixture
def paced_server() -> Iterator[tuple[str, subprocess.Popen]]:
    """First token 50 ms after the request, then one every 20 ms."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(MOCK), "--port", str(port), "--ttft", "0.05", "--itl", "0.02"])
    try:
        deadline = time.monotonic() + 20
        while not healthy(f"http://127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline, "mock server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(10)


def _jobs(url: str, tmp_path: Path, tokens: int, turns: int = 2) -> list[ShardJob]:
    settings = LoadSettings(agents=[4], turns=turns, system_tokens=8, tokens_per_turn=8, max_output_tokens=tokens,
                            processes=2)
    start = time.perf_counter() + START_DELAY_S
    return [ShardJob(Server(name="mock", url=url), "mock", settings, shapes_of(settings)[0], 4, "abcdef", 4.0, {}, k,
                     2, start, str(tmp_path / f"{k}.jsonl")) for k in range(2)]


async def test_two_shards_run_one_case_on_one_clock(paced_server, tmp_path: Path) -> None:
    url, _ = paced_server
    seen: list[int] = []
    async with Workers(2) as workers:
        assert len(set(workers.pids)) == 2
        jobs = _jobs(url, tmp_path, tokens=8)
        results = await workers.run(jobs, seen.append)
    assert [r.shard for r in results] == [0, 1] and all(r.dead is None and r.rows == 4 for r in results)
    assert all(r.t_start == jobs[0].start_at for r in results)  # the parent's start, on the host's clock
    assert sorted(seen) == [0] * 4 + [1] * 4  # one progress tick per finished request
    for k in range(2):
        rows = read_rows(tmp_path / f"{k}.jsonl")
        assert {r["agent"] for r in rows} == {k, k + 2} and all(r["status"] == "ok" for r in rows)
        assert all(0.04 < r["ttft"] < 0.5 for r in rows)  # the server's 50 ms, seen from each process
    assert all(r.client["client_stamps"] == "kernel" and r.client["client_cpu_share"] is not None for r in results)


async def test_a_server_dying_mid_case_ends_every_shard(paced_server, tmp_path: Path) -> None:
    url, proc = paced_server
    async with Workers(2) as workers:
        jobs = _jobs(url, tmp_path, tokens=400, turns=1)  # 8 s per request: the kill lands mid-stream
        task = asyncio.create_task(workers.run(jobs, lambda _shard: None))
        await asyncio.sleep(START_DELAY_S + 0.5)
        proc.kill()
        t_kill = time.perf_counter()
        results = await task
        took = time.perf_counter() - t_kill
    print(f"every shard ended {took:.2f} s after the kill")
    assert any(r.dead for r in results) and took < 3.0  # not the 7.5 s the requests had left
    dead = next(r.dead for r in results if r.dead)
    assert "/health" in dead
    rows = [r for k in range(2) for r in read_rows(tmp_path / f"{k}.jsonl")]
    assert rows and all(r["status"] != "ok" for r in rows)  # the cut streams, recorded as such


async def test_a_worker_dead_between_cases_is_the_same_one_error(paced_server, tmp_path: Path) -> None:
    """Killed after one case and before the next: the next job's send finds the pipe gone
    (BrokenPipeError), which is the worker's death, not a kvprobe bug."""
    url, _ = paced_server
    async with Workers(2) as workers:
        await workers.run(_jobs(url, tmp_path, tokens=4, turns=1), lambda _shard: None)
        victim = workers._procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        with pytest.raises(KvprobeError, match=r"client worker process 1 died \(killed by SIGKILL\).*--resume"):
            await workers.run(_jobs(url, tmp_path, tokens=4, turns=1), lambda _shard: None)
    assert not victim.is_alive() and not workers._procs[0].is_alive()  # none left behind
