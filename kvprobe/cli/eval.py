"""kvprobe eval: measure servers.toml against its reference; write, sign and report the verdict."""

from __future__ import annotations

from pathlib import Path

import click

from kvprobe.cli._common import (
    JUNIT_HELP,
    PROBES_HELP,
    SUMMARY_HELP,
    _evaluate,
    servers_file_input,
    set_ci,
    set_view,
    view_options,
)
from kvprobe.report.ci import CiOutputs


@click.command(name="eval")
@servers_file_input
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="run directory (default runs/<UTC time>-<id>)")
@click.option("--resume", type=click.Path(path_type=Path), default=None,
              help="reopen this run directory and finish it: what it already measured is skipped")
@click.option("--probes", default=None, help=PROBES_HELP + "; with --resume, the run's own")
@click.option("--key", type=click.Path(path_type=Path), default=None,
              help="OpenSSH Ed25519 private key that signs the verdict (else $KVPROBE_SIGNING_KEY, else "
                   "kvprobe's own key in the config directory, created on first use)")
@click.option("--junit", type=click.Path(path_type=Path), default=None, help=JUNIT_HELP)
@click.option("--summary", type=click.Path(path_type=Path), default=None, help=SUMMARY_HELP)
@view_options
def eval_cmd(servers_file: Path, out: Path | None, resume: Path | None, probes: str | None, key: Path | None,
             junit: Path | None, summary: Path | None, verbose: bool = False, quiet: bool = False) -> None:
    """Measure every server in servers.toml against the reference; write, sign and report the verdict.

    Exit: 0 done (read the decisions), 1 no candidate adopted and one fails or does not pass a bar,
    2 cannot run, 3 invalid comparison, 4 a server is broken, 130 interrupted (resume it), 70 a bug
    in kvprobe (the traceback is in DIR/crash.txt)."""
    set_view(verbose, quiet)
    set_ci(CiOutputs.from_options(junit, summary))
    _evaluate(servers_file, out, probes, resume, key)
