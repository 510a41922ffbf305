"""kvprobe report: re-render a run directory's reports."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from kvprobe.cli._common import (
    _fail,
    _report,
    err_console,
    set_view,
    view_options,
)
from kvprobe.cli.crash import note_run
from kvprobe.errors import (
    ConfigError,
    DiskError,
)
from kvprobe.run.store import RunDir


@click.command(name="report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@view_options
def report_cmd(run_dir: Path, verbose: bool = False, quiet: bool = False) -> None:
    """Re-render a run directory's report (terminal, report.md, report.html) from what is on disk.

    Uses DIR/verdict.json when there is one; else decides from the measurements (unsigned, nothing
    written but the reports)."""
    from kvprobe.verdict.build import build_verdict

    set_view(verbose, quiet)
    try:
        run = RunDir.open(run_dir)
    except ConfigError as exc:
        _fail(exc.problems)
    note_run(run.path)
    if run.has("verdict.json"):
        verdict = run.read_json("verdict.json")
    else:
        err_console.print("[yellow]note:[/yellow] no verdict.json (the run did not finish): deciding from what "
                          "is on disk, unsigned", highlight=False)
        verdict = build_verdict(run)
    try:
        _report(run, verdict)
    except DiskError as exc:
        _fail([f"{exc}: free space and run `{shlex.join(['kvprobe', 'report', str(run.path)])}` again"],
              exc.exit_code)
