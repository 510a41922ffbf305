"""The load paces (kvprobe.evaluate.power_plan FAST_LOAD, XEON_LOAD, SLOW_LOAD) against the recorded runs they
were fitted to and later runs of the same platform: the block time the rough model gives is the block time the
run took. Replayed from tests/fixtures/runs; nothing is measured."""

from __future__ import annotations

import gzip
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from recorded import RUNS

from kvprobe.config import load_config
from kvprobe.evaluate.plan import FAST_LOAD, SLOW, SLOW_LOAD
from kvprobe.evaluate.power_plan import XEON_LOAD
from kvprobe.probes.load import block_seconds
from kvprobe.run.budget import LoadPace, load_pace

ROOT = Path(__file__).parents[2]


def _recorded_block_s(run: str) -> tuple[int, float]:
    """(servers, seconds a block took): the span of the run's load cases over the cases in it, times the
    cases in a block (every agent count on every server)."""
    with gzip.open(RUNS / run / "events.jsonl.gz") as lines:
        cases = [e for e in map(orjson.loads, lines) if e["kind"] == "load_case"]
    servers = len({c["server"] for c in cases})
    per_block = servers * len({c["agents"] for c in cases})
    span = datetime.fromisoformat(cases[-1]["t"]).timestamp() - datetime.fromisoformat(cases[0]["t"]).timestamp()
    return servers, span / (len(cases) - 1) * per_block


@pytest.mark.parametrize(("run", "pace"), [("h100-pinned", FAST_LOAD), ("amd-avx2-demo", SLOW_LOAD),
                                          ("xeon-amx-rules6", XEON_LOAD), ("xeon-amx-demo", XEON_LOAD),
                                          ("h100-full-rules6", FAST_LOAD)])
def test_each_pace_gives_its_runs_block_time(run: str, pace: LoadPace) -> None:
    servers, took = _recorded_block_s(run)
    _, block = block_seconds(load_config(ROOT / "servers.toml"), servers, pace)
    assert block == pytest.approx(took, rel=0.1), (run, block, took)


def test_the_slow_pace_bounds_the_faster_cpu_and_the_long_prompt_rate_does_not_price_it() -> None:
    """The 2-core Xeon's demo ran its blocks in under the slow pace's time; the smoke's long-prompt rate (SLOW,
    what the load was costed at before) prices them more than twice over."""
    config = load_config(ROOT / "servers.toml")
    servers, took = _recorded_block_s("xeon-amx-demo")
    assert took < block_seconds(config, servers, SLOW_LOAD)[1]
    assert block_seconds(config, servers, load_pace(SLOW))[1] > 2 * took
