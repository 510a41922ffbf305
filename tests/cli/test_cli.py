"""`kvprobe audit` on replayed captures: one dev-mode server (with /server_info) and one without."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from replay import MultiReplay, Replay, capture, dev_server_info
from rich.console import Console

from kvprobe import cli
from kvprobe.cli import audit as audit_cli
from kvprobe.report.terminal import audit_table
from kvprobe.server.client import Client
from kvprobe.server.inventory import take_inventories

DEV, PLAIN = "http://127.0.0.1:8101", "http://127.0.0.1:8102"


def servers() -> MultiReplay:
    dev = Replay("auto-8101")
    dev.routes[("GET", "/server_info")] = lambda r: httpx.Response(200, json=dev_server_info("auto"))
    return MultiReplay({"127.0.0.1:8101": dev, "127.0.0.1:8102": Replay("fp8-8102")})


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    multi = servers()

    def client(name: str, url: str, **kw: Any) -> Client:
        return Client(name, url, transport=multi.transport(), backoff_s=0, **kw)

    monkeypatch.setattr(audit_cli, "Client", client)


def test_audit_json_has_a_platform_or_says_it_is_not_exposed(replayed: None) -> None:
    result = CliRunner().invoke(cli.main, ["audit", "--json", "--no-smoke", DEV, PLAIN], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "kvprobe.audit/1"
    dev, plain = doc["servers"]
    assert dev["platform"] == {"cpu_model": "AMD EPYC", "cpu_family": 25, "cpu_model_number": 17,
                               "isa": ["avx2", "avx512_bf16", "avx512_vnni", "avx512f"], "nvidia_gpu_models": None,
                               "nvidia_driver_version": None, "cuda_runtime_version": "13.0.88",
                               "cuda_compiled_version": None, "cuda_available": False, "cuda_archs": None}
    assert dev["platform_note"] is None
    assert plain["platform"] is None and plain["platform_note"] == "platform not exposed"


async def test_audit_table_shows_each_platform() -> None:
    multi = servers()
    clients = [Client(u, u, transport=multi.transport(), backoff_s=0) for u in (DEV, PLAIN)]
    inventories = await take_inventories(clients, run_smoke=False)
    for c in clients:
        await c.aclose()
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(audit_table(inventories, width=400))
    # host:port, not the URL: the scheme only takes width
    dev_line, plain_line = (next(line for line in out.getvalue().splitlines() if line.startswith(url[7:]))
                            for url in (DEV, PLAIN))
    assert "EPYC 25/17 AVX-512" in dev_line  # the full text (every ISA flag) is --json's platform_text
    assert "not exposed" in plain_line and "EPYC" not in plain_line


GARBAGE = "<html><body>Log in</body></html>\n"


@pytest.fixture
def garbled(monkeypatch: pytest.MonkeyPatch) -> Replay:
    """One replayed server (auto-8101) whose routes a test garbles."""
    replay = Replay("auto-8101")
    multi = MultiReplay({"127.0.0.1:8101": replay})
    monkeypatch.setattr(audit_cli, "Client", lambda name, url, **kw: Client(name, url, transport=multi.transport(),
                                                                     backoff_s=0, **kw))
    return replay


@pytest.mark.parametrize("as_json", [True, False])
def test_audit_of_garbage_metrics_warns_on_stderr_and_exits_5(garbled: Replay, as_json: bool) -> None:
    garbled.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text=GARBAGE)
    args = ["audit", "--no-smoke", DEV] + (["--json"] if as_json else [])
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 5, result.output
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: {DEV}: /metrics is not valid Prometheus text")
    if as_json:
        (row,) = json.loads(result.stdout)["servers"]  # stdout stays one JSON document
        assert row["unreadable"] == [warning.removeprefix(f"warning: {DEV}: ")] and row["kv_cache_tokens"] is None


def test_audit_of_an_infinite_capacity_names_the_label_and_exits_5(garbled: Replay) -> None:
    text = capture("auto-8101", "metrics_fresh").decode().replace('kv_cache_size_tokens="1048576"',
                                                                   'kv_cache_size_tokens="inf"')
    garbled.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text=text)
    result = CliRunner().invoke(cli.main, ["audit", "--json", DEV])
    assert result.exit_code == 5 and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith(("warning:", "error:"))] == [
        f"warning: {DEV}: /metrics vllm:cache_config_info kv_cache_size_tokens 'inf' is not a finite number: "
        "KV capacity unreadable"]


def test_audit_of_a_models_list_it_cannot_read_exits_2(garbled: Replay) -> None:
    garbled.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, json=[1, 2])
    result = CliRunner().invoke(cli.main, ["audit", DEV])
    assert result.exit_code == 2
    assert f"error: {DEV}: /v1/models is not a list of models with string ids" in result.stderr


def test_audit_help_documents_exit_5() -> None:
    result = CliRunner().invoke(cli.main, ["audit", "--help"])
    assert "5 audited, but some endpoints or values are unreadable" in " ".join(result.output.split())


def test_server_text_that_looks_like_markup_is_printed_as_text(garbled: Replay) -> None:
    """rich reads "[/x]" as a closing tag and raises on it: a server's words are text, not markup."""
    garbled.routes[("GET", "/version")] = lambda r: httpx.Response(200, json={"version": "0.32[/x]"})
    garbled.routes[("POST", "/v1/completions")] = lambda r: httpx.Response(
        500, json={"error": {"message": "engine died [/bold] in [red]prefill"}})
    result = CliRunner().invoke(cli.main, ["audit", DEV])
    assert result.exit_code == 4, result.output
    assert "0.32[/x]" in result.stdout
    assert "engine died [/bold] in [red]prefill" in result.stderr


def test_an_eval_that_cannot_start_still_writes_its_junit_once_and_nothing_leaks_to_the_next_command(
        tmp_path: Path) -> None:
    broken = tmp_path / "servers.toml"
    broken.write_text("[[servers]\n")  # a TOML syntax error: eval stops before any server is asked
    junit = tmp_path / "junit.xml"
    first = CliRunner().invoke(cli.main, ["eval", "--servers", str(broken), "--junit", str(junit)])
    assert first.exit_code == 2
    assert "servers.toml" in junit.read_text() and "failure" in junit.read_text()
    junit.unlink()
    # The same process, a command without --junit: the earlier command's CI outputs are gone with it.
    second = CliRunner().invoke(cli.main, ["eval", "--servers", str(broken)])
    assert second.exit_code == 2
    assert not junit.exists()
