"""`kvprobe audit` as a fleet view, on replayed captures: the CPU trio (vLLM 0.32: a dev-mode AVX-512 server,
an fp8 one without /server_info, the same capture as an AVX2 host shows it) and the six H200 servers (vLLM
0.26: needle-llama and needle-hybrid). Rows grouped by model, what each differs in from its group, a table
that fits 80/100/120 columns without cutting a host:port or a number, the versioned JSON, and --watch."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import re
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from replay import MultiReplay, Replay, capture, dev_server_info, on_avx2
from replay_gpu import DENSE, HYBRID, PORTS, gpu_servers
from rich.console import Console

from kvprobe import cli
from kvprobe.cli import audit as audit_cli
from kvprobe.report.fleet import differences, fleet_table, host_port
from kvprobe.server.client import Client
from kvprobe.server.inventory import Inventory, take_inventories

CPU = {"http://127.0.0.1:8101": "auto, dev mode", "http://127.0.0.1:8102": "fp8", "http://10.0.0.7:8101": "avx2"}
GPU = {f"http://127.0.0.1:{PORTS[n]}": n for n in (*DENSE, *HYBRID)}


def cpu_servers() -> MultiReplay:
    dev, avx2 = Replay("auto-8101"), Replay("auto-8101")
    dev.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=dev_server_info("auto"))
    avx2.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=on_avx2(dev_server_info("auto")))
    return MultiReplay({"127.0.0.1:8101": dev, "127.0.0.1:8102": Replay("fp8-8102"), "10.0.0.7:8101": avx2})


def fleets() -> dict[str, tuple[MultiReplay, list[str]]]:
    return {"cpu": (cpu_servers(), list(CPU)), "gpu": (gpu_servers((*DENSE, *HYBRID)), list(GPU))}


async def _inventories(multi: MultiReplay, urls: list[str]) -> list[Inventory]:
    clients = [Client(u, u, transport=multi.transport(), backoff_s=0) for u in urls]
    try:
        return await take_inventories(clients, run_smoke=False)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def inventories(fleet: str) -> list[Inventory]:
    multi, urls = fleets()[fleet]
    return asyncio.run(_inventories(multi, urls))


def render(invs: list[Inventory], width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(fleet_table(invs, width))
    return out.getvalue()


@pytest.mark.parametrize("fleet", ["cpu", "gpu"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_table_fits_and_cuts_no_server_and_no_number(fleet: str, width: int) -> None:
    invs = inventories(fleet)
    text = render(invs, width)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    assert "…" not in text
    for inv in invs:
        (row,) = [line for line in lines if line.startswith(host_port(inv.url) + " ")]
        assert f"{inv.capacity.kv_cache_tokens:,}" in row.split()  # whole, never folded
        assert inv.cache_dtype in row.split()
    if width >= 100:  # what an operator compares hosts by is there from 100 columns on
        assert all(f"{inv.max_model_len:,}" in text and inv.version in text for inv in invs)
        assert ("EPYC 25/17 AVX-512" if fleet == "cpu" else "H200 CUDA 13.0") in text


def test_a_column_left_out_is_named() -> None:
    text = " ".join(render(inventories("gpu"), 80).split())
    assert "not shown at 80 columns: KV use, conc., platform, version (--json has every field" in text
    assert "state: all 6 healthy" in text  # a column of "ok" is one line instead


def test_rows_are_grouped_by_model_and_say_what_sets_each_apart() -> None:
    text = render(inventories("gpu"), 160)
    titles = [line.strip() for line in text.splitlines() if line.strip().endswith("servers")]
    assert titles == ["needle-llama: 3 servers", "needle-hybrid: 3 servers"]
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("127.0.0.1:")}
    assert list(rows) == [host_port(u) for u in GPU]  # each row under its model's title, in the order given
    assert "mamba_ssm_cache_dtype" in rows["127.0.0.1:8206"]  # hybrid-ssm16: its SSM state, not its KV dtype


def differs(fleet: str) -> dict[str, list[str]]:
    invs = inventories(fleet)
    out: dict[str, list[str]] = {}
    for model in dict.fromkeys(inv.model for inv in invs):
        group = [inv for inv in invs if inv.model == model]
        out |= {GPU.get(inv.url, CPU.get(inv.url)): d for inv, d in zip(group, differences(group), strict=True)}
    return out


def test_differs_on_the_cpu_captures() -> None:
    # auto, fp8, auto: only fp8 differs in its dtype; the two platforms that are exposed differ from each
    # other (AVX-512 vs AVX2), and the fp8 server's, not exposed, is unknown rather than a difference
    assert differs("cpu") == {"auto, dev mode": ["platform"], "fp8": ["cache_dtype", "kv_cache_tokens"],
                              "avx2": ["platform"]}


def test_differs_on_the_gpu_captures() -> None:
    assert differs("gpu") == {
        "auto": ["cache_dtype", "kv_cache_tokens"], "fp8": ["cache_dtype", "kv_cache_tokens"],
        "int8_per_token_head": ["cache_dtype", "kv_cache_tokens"],
        # the hybrids: auto, fp8, auto with a float16 SSM state; every capacity is its own
        "hybrid-auto": ["kv_cache_tokens"], "hybrid-fp8": ["cache_dtype", "kv_cache_tokens"],
        "hybrid-ssm16": ["kv_cache_tokens", "mamba_ssm_cache_dtype"]}


def test_a_fact_one_server_does_not_expose_is_not_a_difference() -> None:
    def inv(url: str, version: str | None, length: int | None) -> Inventory:
        return Inventory(name=url, url=url, version=version, max_model_len=length, model="m")

    group = [inv("http://a:1", "0.32.0", 8192), inv("http://b:1", None, 8192), inv("http://c:1", "0.31.0", 4096)]
    assert differences(group) == [["version"], [], ["max_model_len", "version"]]
    assert differences(group[:1]) == [[]]


@pytest.mark.parametrize(("url", "shown"), [
    ("http://127.0.0.1:8101", "127.0.0.1:8101"), ("http://127.0.0.1:8101/", "127.0.0.1:8101"),
    ("https://gw.example.com/vllm/a", "gw.example.com:443/vllm/a"), ("http://[::1]:8000", "[::1]:8000"),
])
def test_host_port_is_what_tells_servers_apart(url: str, shown: str) -> None:
    assert host_port(url) == shown


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> MultiReplay:
    multi = cpu_servers()
    monkeypatch.setattr(audit_cli, "Client", lambda name, url, **kw: Client(name, url, transport=multi.transport(),
                                                                     backoff_s=0, **kw))
    return multi


def test_json_is_one_versioned_document(replayed: MultiReplay) -> None:
    result = CliRunner().invoke(cli.main, ["audit", "--json", "--no-smoke", *CPU], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "kvprobe.audit/1" and doc["watch_seconds"] is None
    rows = {r["server"]: r for r in doc["servers"]}
    assert list(rows) == ["127.0.0.1:8101", "127.0.0.1:8102", "10.0.0.7:8101"]
    dev = rows["127.0.0.1:8101"]
    assert dev["differs_in"] == ["platform"] and dev["pressure"] is None
    assert dev["platform_short"] == "EPYC 25/17 AVX-512"
    assert dev["platform_text"] == "AMD EPYC (25/17) avx2 avx512_bf16 avx512_vnni avx512f"
    assert rows["10.0.0.7:8101"]["platform_short"] == "EPYC 25/1 AVX2"


@pytest.mark.parametrize("width", [80, 100])
def test_the_command_takes_its_width_from_columns(replayed: MultiReplay, width: int) -> None:
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(cli.main, ["audit", "--no-smoke", *CPU])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= width
    assert all(host_port(u) in result.stdout for u in CPU)


def _load(step: int) -> str:
    """The under-load capture at step `step` of a pool filling up: usage 95%, 5 waiting for capacity, one
    more preemption each sample."""
    text = capture("auto-8101", "metrics_under_load").decode()
    for pattern, value in ((r"^(vllm:kv_cache_usage_perc\{.*\}) .*$", 0.95),
                           (r'^(vllm:num_requests_waiting_by_reason\{.*reason="capacity"\}) .*$', 5),
                           (r"^(vllm:num_requests_waiting\{.*\}) .*$", 5),
                           (r"^(vllm:num_preemptions_total\{.*\}) .*$", step)):
        text = re.sub(pattern, rf"\g<1> {value}", text, flags=re.M)
    return text


def test_watch_says_kv_bound_from_the_servers_own_counters(replayed: MultiReplay,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    steps = itertools.count()
    replayed.servers["127.0.0.1:8101"].routes[("GET", "/metrics")] = lambda r: httpx.Response(
        200, text=_load(next(steps)))
    # a 0.2 s window of samples 0.02 s apart: the loop as it runs for 60 s, faster
    monkeypatch.setattr(audit_cli, "INTERVAL_S", 0.02)
    monkeypatch.setattr(audit_cli, "watch_seconds", lambda text: 0.2)
    result = CliRunner(env={"COLUMNS": "80"}).invoke(cli.main, ["audit", "--no-smoke", "--watch", "60s", *CPU],
                                                     catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    tables = [line for line in lines if not re.match(r"^[\d.:]+: ", line)]  # the sentences are one line each
    assert max(len(line) for line in tables) <= 80 and "…" not in result.stdout
    sentence = next(line for line in lines if line.startswith("127.0.0.1:8101: "))  # one line, grep-able
    assert sentence.startswith("127.0.0.1:8101: KV-bound: peak KV usage 95%, ")
    assert "5 requests waiting for capacity: the memory map needs the model's config.json" in sentence
    idle = next(line for line in lines if line.startswith("127.0.0.1:8102: "))
    assert idle.startswith("127.0.0.1:8102: not enough traffic in the window to tell")
    assert "KV pressure over 0 s" in result.stdout


def test_watch_in_json(replayed: MultiReplay, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_cli, "INTERVAL_S", 0.02)
    monkeypatch.setattr(audit_cli, "watch_seconds", lambda text: 0.1)
    result = CliRunner().invoke(cli.main, ["audit", "--json", "--no-smoke", "--watch", "1m", *CPU],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["watch_seconds"] == 0.1
    pressure = doc["servers"][0]["pressure"]
    assert pressure["verdict"] == "no_traffic" and pressure["samples"] >= 2
    assert pressure["two_x"]["reason"].endswith("/models/tiny-llama/config.json is not on this disk")


@pytest.mark.parametrize(("given", "said"), [("5s", "--watch '5s': at least 10s"),
                                             ("soon", "--watch 'soon': give a duration like 5m, 90s or 1h30m")])
def test_a_watch_it_cannot_use_is_one_line_and_exit_2(given: str, said: str) -> None:
    result = CliRunner().invoke(cli.main, ["audit", "--watch", given, "http://127.0.0.1:8101"])
    assert result.exit_code == 2 and f"error: {said}" in result.stderr


def test_max_num_seqs_caps_the_estimate_where_server_info_shows_it() -> None:
    dev, fp8, _ = inventories("cpu")
    assert audit_cli.max_num_seqs(dev) == 128  # the dev-mode capture's scheduler_config
    assert audit_cli.max_num_seqs(fp8) is None  # no /server_info
