"""`eval` on a server that sends garbled numbers: exit 2, one line naming the server and the field, and
every inventory (the other server's too) on disk. Replayed real captures with one value garbled."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from replay import SERVERS_TOML, MultiReplay, Replay, capture
from rich.console import Console

from kvprobe import cli
from kvprobe.config import parse_config
from kvprobe.evaluate import orchestrate as evaluation
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.store import RunDir

MAKE_CLIENTS = evaluation.make_clients  # the real one: tests give it their replay transport

CONFIG = {"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                     {"name": "fp8", "url": "http://127.0.0.1:8102"}]}


def garbled_metrics(value: str) -> httpx.Response:
    text = capture("fp8-8102", "metrics_fresh").decode()
    return httpx.Response(200, text=re.sub(r'kv_cache_size_tokens="\d+"', f'kv_cache_size_tokens="{value}"', text))


def garbled_models(value: Any) -> httpx.Response:
    models = json.loads(capture("fp8-8102", "models"))
    models["data"][0]["max_model_len"] = value
    return httpx.Response(200, json=models)


def string_usage(request: httpx.Request) -> httpx.Response:
    answer = json.loads(capture("fp8-8102", "completions_gen16"))
    answer["usage"]["prompt_tokens"] = "30"
    return httpx.Response(200, json=answer)


FAULTS = {
    "capacity inf": (("GET", "/metrics"), lambda r: garbled_metrics("inf"), "kv_cache_size_tokens 'inf'"),
    "capacity nan": (("GET", "/metrics"), lambda r: garbled_metrics("nan"), "kv_cache_size_tokens 'nan'"),
    "capacity -5": (("GET", "/metrics"), lambda r: garbled_metrics("-5"), "kv_cache_size_tokens '-5' is below 1"),
    "capacity 1e30": (("GET", "/metrics"), lambda r: garbled_metrics("1e30"), "'1e30' is absurdly large"),
    "capacity abc": (("GET", "/metrics"), lambda r: garbled_metrics("abc"), "'abc' is not a number"),
    "max_model_len x": (("GET", "/v1/models"), lambda r: garbled_models("x"), "max_model_len 'x' is not a number"),
    "max_model_len -1": (("GET", "/v1/models"), lambda r: garbled_models(-1), "max_model_len -1 is below 1"),
    "max_model_len 1e30": (("GET", "/v1/models"), lambda r: garbled_models(1e30), "max_model_len 1e+30 is absurdly"),
    "usage string": (("POST", "/v1/completions"), string_usage, "usage.prompt_tokens '30' is not a number"),
}


def fleet(fault: str) -> MultiReplay:
    route, handler, _ = FAULTS[fault]
    fp8 = Replay("fp8-8102")
    fp8.routes[route] = handler
    return MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": fp8})


@pytest.mark.parametrize("fault", FAULTS)
async def test_eval_stops_with_exit_2_one_line_and_both_inventories_on_disk(tmp_path, fault: str) -> None:
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(parse_config(CONFIG), run, ["capacity"], Console(quiet=True),
                             transport=fleet(fault).transport())
    assert outcome.exit_code == 2
    (line,) = outcome.messages
    assert line.startswith("fp8: ") and FAULTS[fault][2] in line
    assert run.read_json("inventory/auto.json")["capacity"]["kv_cache_tokens"] == 1_048_576  # the other's, kept
    assert line.removeprefix("fp8: ") in run.read_json("inventory/fp8.json")["unreadable"]
    assert not run.has("verdict.json")  # nothing was compared on a garbled number


@pytest.mark.parametrize("fault", ["capacity inf", "max_model_len x"])
def test_eval_command_prints_the_one_line_not_a_traceback(tmp_path, monkeypatch, fault: str) -> None:
    transport = fleet(fault).transport()
    monkeypatch.setattr(evaluation, "make_clients", lambda config, _=None: MAKE_CLIENTS(config, transport))
    servers = tmp_path / "servers.toml"
    servers.write_text(SERVERS_TOML)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.main, ["eval", "--servers", str(servers), "--out", str(out),
                                           "--probes", "capacity"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: fp8: ") and FAULTS[fault][2] in errors[0]
    assert (out / "inventory" / "auto.json").exists() and (out / "inventory" / "fp8.json").exists()
