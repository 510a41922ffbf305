"""A task that cannot run is one line and exit 2 before any server is asked anything: the servers in
this config are a transport that fails the test if it is called."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner
from replay import SERVERS_TOML

from kvprobe import cli
from kvprobe.evaluate import orchestrate as evaluation

SERVERS = """
[tasks]
names = ["kvprobe_qa", "no_such_task"]
""" + SERVERS_TOML


def test_an_unknown_task_stops_the_run_before_any_request(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    asked: list[str] = []

    def no_server(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        raise AssertionError("a server was asked before the tasks were checked")

    real = evaluation.make_clients
    monkeypatch.setattr(evaluation, "make_clients", lambda config, transport=None: real(
        config, httpx.MockTransport(no_server)))
    (tmp_path / "servers.toml").write_text(SERVERS)
    result = CliRunner().invoke(cli.main, ["eval", "--servers", str(tmp_path / "servers.toml"), "--out",
                                           str(tmp_path / "run")])
    assert result.exit_code == 2 and asked == []
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: tasks: 'no_such_task': no such lm-eval task in")
    # [tasks] in servers.toml put the probe on the default list: the run records it was asked for.
    assert "tasks" in (tmp_path / "run" / "run.json").read_text()
