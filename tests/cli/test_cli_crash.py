"""The top-level guard: a bug is exit 70, one line naming a file with its traceback, and no secret in
that file; KvprobeError keeps its code, Ctrl-C its 130, SystemExit passes through."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvprobe import cli
from kvprobe.cli import audit as audit_cli
from kvprobe.errors import MetricsError
from kvprobe.evaluate import orchestrate as evaluation

SERVERS_TOML = """
[[server]]
name = "auto"
url = "http://127.0.0.1:8101"
role = "reference"
api_key_env = "AUTO_KEY"

[[server]]
name = "fp8"
url = "http://127.0.0.1:8102"
"""
KEY = "sk-live-4f9a2c7e1b"


@pytest.fixture(autouse=True)
def _dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KVPROBE_SIGNING_KEY", raising=False)
    monkeypatch.setenv("AUTO_KEY", KEY)


def _eval(tmp_path, monkeypatch, exc: BaseException):
    def boom(config, run, *args, **kw):
        run.write_json("run.json", {})  # as run_eval does first
        raise exc

    monkeypatch.setattr(evaluation, "run_eval_sync", boom)
    servers = tmp_path / "servers.toml"
    servers.write_text(SERVERS_TOML)
    out = tmp_path / "run"
    return CliRunner().invoke(cli.main, ["eval", "--servers", str(servers), "--out", str(out)]), out


def test_a_bug_during_eval_is_exit_70_one_line_and_a_crash_file_in_the_run(tmp_path, monkeypatch) -> None:
    # the message quotes the key, as an HTTP library's error quoting request headers would
    result, out = _eval(tmp_path, monkeypatch, RuntimeError(f"boom: headers {{'Authorization': 'Bearer {KEY}'}}"))
    assert result.exit_code == 70
    crash = out / "crash.txt"
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("run directory:", "created a"))]
    assert lines == [f"internal error (a bug in kvprobe, not a result): RuntimeError; the traceback is in {crash}: "
                     "please report it"]
    text = crash.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom" in text
    assert "in boom" in text  # the frame that raised
    assert KEY not in text and "[redacted]" in text
    assert KEY not in result.output


def test_a_bug_outside_a_run_goes_to_the_cache_dir(tmp_path, monkeypatch) -> None:
    def boom(*args, **kw):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(audit_cli, "take_inventories", boom)
    result = CliRunner().invoke(cli.main, ["audit", "http://127.0.0.1:8101"])
    assert result.exit_code == 70
    (line,) = result.stderr.splitlines()
    (crash,) = (tmp_path / "cache" / "kvprobe" / "crashes").iterdir()
    assert line.endswith(f"ZeroDivisionError; the traceback is in {crash}: please report it")
    assert "ZeroDivisionError: division by zero" in crash.read_text()


def test_kvprobe_errors_keep_their_code_and_ctrl_c_keeps_130(tmp_path, monkeypatch) -> None:
    def metrics_error(*args, **kw):
        raise MetricsError("/metrics is not valid Prometheus text: x")

    monkeypatch.setattr(audit_cli, "take_inventories", metrics_error)
    result = CliRunner().invoke(cli.main, ["audit", "http://127.0.0.1:8101"])
    assert result.exit_code == 2 and result.stderr.strip() == "error: /metrics is not valid Prometheus text: x"

    result, _ = _eval(tmp_path, monkeypatch, KeyboardInterrupt())
    assert result.exit_code == 130 and "--resume" in result.stderr

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(audit_cli, "take_inventories", interrupted)
    result = CliRunner().invoke(cli.main, ["audit", "http://127.0.0.1:8101"])
    assert result.exit_code == 130 and result.stderr.strip() == "interrupted"


def test_system_exit_and_usage_errors_pass_through(tmp_path, monkeypatch) -> None:
    result, _ = _eval(tmp_path, monkeypatch, SystemExit(3))
    assert result.exit_code == 3
    result = CliRunner().invoke(cli.main, ["eval", "--probes"])
    assert result.exit_code == 2 and "Option '--probes' requires an argument" in result.output
    assert CliRunner().invoke(cli.main, ["audit", "--help"]).exit_code == 0
