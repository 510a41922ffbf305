"""Fuzz /metrics: real Prometheus captures, garbled, through parse_metrics, the snapshot's readers and
the inventory. Each either reads a sane value or refuses with one line; never a traceback."""

from __future__ import annotations

import asyncio
import math
import re

import httpx
from hypothesis import example, given
from hypothesis import strategies as st
from mutate import FIXTURES, WEIRD_TEXT, mutated_lines, one_line
from replay import Replay

from kvprobe.errors import MetricsError, Unreadable
from kvprobe.run.store import dumps
from kvprobe.server.client import Client
from kvprobe.server.inventory import Inventory, attention_block, smoke_length, take_inventory
from kvprobe.server.metrics import CACHE_CONFIG, MetricsSnapshot, counter_deltas, parse_metrics
from kvprobe.server.untrusted import MAX_TOKENS

CAPTURES = sorted([*FIXTURES.glob("*/metrics*.txt"), *FIXTURES.glob("*/metrics*.response.txt")])
SEEDS = [p.read_text() for p in CAPTURES]
assert len(SEEDS) >= 8, "the /metrics captures moved"

_LABEL = re.compile(r'(\w+)="([^"]*)"')


@st.composite
def garbled_cache_config(draw: st.DrawFn, text: str) -> str:
    """The labels kvprobe reads most live on one line among hundreds: garble that line's values."""
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith(CACHE_CONFIG + "{")]
    if not rows:
        return text
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.sampled_from(rows))
        labels = list(_LABEL.finditer(lines[i]))
        m = draw(st.sampled_from(labels))
        new = draw(st.one_of(st.sampled_from(WEIRD_TEXT), st.text(max_size=8)))
        new = new.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines[i] = lines[i][: m.start(2)] + new + lines[i][m.end(2):]
    return "\n".join(lines)


metrics_text = st.one_of(
    st.sampled_from(SEEDS).flatmap(mutated_lines),
    st.sampled_from(SEEDS).flatmap(garbled_cache_config),
    st.text(max_size=200),
    st.lists(st.sampled_from([*SEEDS[0].split("\n")[:80], *WEIRD_TEXT]), max_size=30).map("\n".join),
)


def _cache_config_with(label: str, value: str) -> str:
    """The auto capture with one cache_config_info label set to `value` (an @example seed)."""
    text = (FIXTURES / "auto-8101" / "metrics_fresh.response.txt").read_text()
    return re.sub(rf'(?<![\w]){label}="[^"]*"', f'{label}="{value}"', text, count=1)


def read_snapshot(snap: MetricsSnapshot) -> None:
    """Every reader of a snapshot kvprobe uses; the values it hands on are sane."""
    usage = snap.kv_usage
    assert usage is None or 0 <= usage <= 1
    for value in [*snap.counters().values(), *snap.gauges().values()]:
        assert isinstance(value, float) and math.isfinite(value) and value >= 0
    counter_deltas(snap, snap)
    for line in snap.unreadable:
        one_line(Unreadable(line), "/metrics")
    try:
        cap = snap.capacity()
    except Unreadable as exc:
        one_line(exc, CACHE_CONFIG)
        return
    if cap is not None:
        assert type(cap.kv_cache_tokens) is int and 1 <= cap.kv_cache_tokens <= MAX_TOKENS
        assert cap.max_concurrency is None or math.isfinite(cap.max_concurrency)
        dumps(cap.to_dict())


@given(metrics_text)
@example(_cache_config_with("kv_cache_size_tokens", "inf"))  # the issue's own trigger
@example(_cache_config_with("block_size", "1e400"))
def test_parse_metrics_reads_or_refuses(text: str) -> None:
    try:
        snap = parse_metrics(text)
    except MetricsError as exc:
        one_line(exc, "/metrics")
        return
    read_snapshot(snap)


async def _inventory(metrics: str) -> Inventory:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text=metrics)
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport(), backoff_s=0,
                      retries=1) as client:
        return await take_inventory(client, smoke_max_tokens=4)


@given(metrics_text)
@example(_cache_config_with("kv_cache_size_tokens", "inf"))
@example(_cache_config_with("block_size", "-5"))
@example(_cache_config_with("effective_attention_block_size", "-5"))
def test_inventory_reads_or_notes_garbled_metrics(text: str) -> None:
    """Through the real client: a garbled /metrics is a warning on the inventory, never a crash, and the
    inventory (written to the run directory) stays JSON."""
    inv = asyncio.run(_inventory(text))
    for line in inv.unreadable:
        one_line(Unreadable(line))
    dumps(inv.to_dict())
    block = attention_block(inv)
    assert block is None or (type(block) is int and block >= 1)
    smoke_length(inv.max_model_len or 4096, 0.5, 8, block)
