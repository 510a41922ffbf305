"""kvprobe show: a run's summary, read-only (the run directory stays byte-identical)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvprobe.cli._common import _report, set_view, view_options
from kvprobe.cli.report import open_run, read_run, signer_options


@click.command(name="show")
@click.argument("run_dir", type=click.Path(path_type=Path))
@signer_options
@view_options
def show_cmd(run_dir: Path, allowed_signers: Path | None = None, signer: str | None = None,
             verbose: bool = False, quiet: bool = False) -> None:
    """Print a run's summary, finished or not, checked as `kvprobe report` checks it, and write nothing.

    A run still being measured can be watched this way: report.md, report.html and plots/ stay as they are.
    Exit as for `kvprobe report`: the verdict's own code, never 0 for a verdict that does not verify."""
    set_view(verbose, quiet)
    # No note_run: a bug's traceback goes to the user's cache directory, not into the run this leaves alone.
    run = open_run(run_dir)
    shown = read_run(run, allowed_signers, signer)
    _report(run, shown.verdict, shown.standing, write=False)
    sys.exit(shown.exit_code)
