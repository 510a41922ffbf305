"""Ctrl-C during `eval`: exit 130 and the exact command that finishes the run, ready to paste."""

from __future__ import annotations

import shlex

from click.testing import CliRunner
from replay import SERVERS_TOML

from kvprobe import cli
from kvprobe.evaluate import orchestrate as evaluation


def test_ctrl_c_prints_the_real_resume_command(tmp_path, monkeypatch) -> None:
    def interrupted(config, run, *args, **kw):
        run.write_json("run.json", {})  # as run_eval does first: the run is then resumable
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "run_eval_sync", interrupted)
    servers = tmp_path / "my servers [prod].toml"  # a space and brackets: quoted, not rich markup
    servers.write_text(SERVERS_TOML)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.main, ["eval", "--servers", str(servers), "--out", str(out)])
    assert result.exit_code == 130
    line = next(line for line in result.stderr.splitlines() if line.startswith("interrupted:"))
    command = line.split("`")[1]
    assert "FILE" not in command
    assert shlex.split(command) == ["kvprobe", "eval", "--servers", str(servers), "--resume", str(out)]
