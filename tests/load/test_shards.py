"""A case sharded over processes sends what the one-process case sends, once (kvprobe.load.generator
shards, on a replayed real vLLM stream), and the per-process figures merge to the worst process's."""

from __future__ import annotations

import pytest
from replay import Replay

from kvprobe.config import LoadSettings
from kvprobe.load.generator import CaseRunner, split
from kvprobe.load.processes import merge_client, processes_for
from kvprobe.load.workload import TextSource, shapes_of
from kvprobe.server.client import Client


async def _sent(settings: LoadSettings, agents: int, shard: tuple[int, int]) -> list[tuple[int, int, int]]:
    client = Client("auto", "http://127.0.0.1:8101", transport=Replay("auto-8101").transport())
    runner = CaseRunner(client, settings, shapes_of(settings)[0], agents, "abc123", TextSource(), shard=shard)
    outcome = await runner.run()
    await client.aclose()
    assert all(r["status"] == "ok" for r in outcome.rows)
    return sorted((r["agent"], r["conversation"], r["turn"]) for r in outcome.rows)


@pytest.mark.parametrize("extra", [{}, {"requests_per_case": 7}, {"mode": "open", "rate": 200.0},
                                   {"mode": "open", "rate": 200.0, "requests_per_case": 5}])
async def test_shards_send_the_whole_case_once(extra: dict) -> None:
    settings = LoadSettings(turns=2, system_tokens=16, tokens_per_turn=16, max_output_tokens=4, **extra)
    whole = await _sent(settings, 5, (0, 1))
    parts = [await _sent(settings, 5, (k, 2)) for k in range(2)]
    assert {a for a, _, _ in parts[0]} <= {0, 2, 4} and {a for a, _, _ in parts[1]} <= {1, 3}
    if settings.mode == "open" or settings.requests_per_case is None:
        assert sorted(parts[0] + parts[1]) == whole  # the open loop's schedule is the case's, whatever the shards
    else:
        assert [len(p) for p in parts] == split(7, 5, 2) == [4, 3]  # the budget split by agents
    assert len(parts[0]) + len(parts[1]) == len(whole)


def test_the_budget_split_follows_the_agents() -> None:
    assert split(10, 3, 2) == [7, 3] and split(7, 8, 3) == [3, 2, 2] and split(1, 2, 2) == [1, 0]
    assert all(sum(split(b, a, s)) == b for b in (1, 5, 2048) for a in (1, 3, 256) for s in (1, 2, 3))


def test_default_processes_one_per_256_agents_at_most_one_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert [processes_for(LoadSettings(), n) for n in (1, 16, 256, 257, 1000, 4096)] == [1, 1, 1, 2, 4, 4]
    assert processes_for(LoadSettings(processes=3), 2) == 2  # never more shards than agents
    assert processes_for(LoadSettings(processes=3), 64) == 3


def test_the_case_takes_the_worst_process_and_the_agents_mean_lag() -> None:
    calm = {"client_stamps": "kernel", "client_loop_lag_p99_s": 0.001, "client_loop_lag_mean_s": 0.0005,
            "client_read_lag_p99_s": 0.0004, "client_cpu_share": 0.3}
    busy = calm | {"client_loop_lag_p99_s": 0.02, "client_cpu_share": 0.95, "client_read_lag_p99_s": None}
    merged = merge_client([calm, busy])
    assert merged["client_loop_lag_p99_s"] == 0.02 and merged["client_cpu_share"] == 0.95
    assert merged["client_read_lag_p99_s"] == 0.0004 and merged["client_processes"] == 2
    assert merged["client_stamps"] == "kernel" and merged["client_by_process"] == [calm, busy]
    assert merge_client([calm, busy | {"client_stamps": "loop"}])["client_stamps"] == "loop"
    # The mean loop lag is what a closed loop's turns were late by on average: over the agents, each late by
    # its own process's lag, not the slowest process's, which over-corrected the throughput ratio
    # (kvprobe.stats.client_limit.lateness_move).
    late = calm | {"client_loop_lag_mean_s": 0.0035}
    assert merged["client_loop_lag_mean_s"] == 0.0005
    assert merge_client([calm, late])["client_loop_lag_mean_s"] == 0.002
    assert merge_client([calm, late], [3, 1])["client_loop_lag_mean_s"] == 0.00125  # 3 agents calm, 1 late
    assert merge_client([calm, late | {"client_loop_lag_mean_s": None}])["client_loop_lag_mean_s"] == 0.0005
    assert merge_client([calm | {"client_loop_lag_mean_s": None}])["client_loop_lag_mean_s"] is None
