"""kvprobe report: a run directory's verdict, checked as `verify` checks it, then re-rendered (terminal,
report.md, report.html, plots/). `kvprobe show` (kvprobe.cli.show) reads it the same way and writes nothing."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvprobe.cli._common import (
    _fail,
    _report,
    set_view,
    view_options,
)
from kvprobe.cli.crash import note_run
from kvprobe.errors import (
    EXIT_BAR_FAILED,
    EXIT_OK,
    ConfigError,
    DiskError,
    SchemaViolation,
    most_serious,
)
from kvprobe.run.store import RunDir

if TYPE_CHECKING:  # the verify stack loads when a verdict is read, not with every command
    from kvprobe.report.standing import Standing


def signer_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--allowed-signers` and `--signer`, as `kvprobe verify` takes them."""
    command = click.option("--signer", default=None,
                           help="require this principal from the allowed_signers file")(command)
    return click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
                        help="who may have signed the verdict (default as for `kvprobe verify`)")(command)


@dataclass
class Shown:
    """A run's verdict as report and show present it."""

    verdict: dict[str, Any]
    standing: Standing
    exit_code: int


def open_run(run_dir: Path) -> RunDir:
    try:
        return RunDir.open(run_dir)
    except ConfigError as exc:
        _fail(exc.problems)


def read_run(run: RunDir, allowed_signers: Path | None, signer: str | None) -> Shown:
    """The run's verdict, checked as `verify` checks it; a run that did not finish is decided from what is on
    disk (in memory: nothing is written), unsigned. Exit: the verdict's own code (eval's), and a verdict that
    does not verify is never 0 (verify's 1, or 2 when it cannot be checked): the most serious wins."""
    from kvprobe.report.standing import checked, unfinished
    from kvprobe.verdict.build import build_verdict
    from kvprobe.verdict.verify import examine

    if not run.has("verdict.json"):
        verdict = build_verdict(run)
        return Shown(verdict, unfinished(), most_serious(verdict["exit_code"], EXIT_BAR_FAILED))
    found = examine(run.path, allowed_signers, signer)
    standing = checked(run, found)
    if found.verdict is None or any(isinstance(p, SchemaViolation) for p in found.problems):
        # Not JSON, or off its schema: the reports would read fields that may not be there.
        _fail([f"{standing.line}: nothing to show; move verdict.json aside and `kvprobe report` decides from "
               "the measurements (unsigned)"], found.exit_code)
    return Shown(found.verdict, standing,
                 most_serious(found.verdict.get("exit_code", EXIT_OK), found.exit_code))


@click.command(name="report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@signer_options
@view_options
def report_cmd(run_dir: Path, allowed_signers: Path | None = None, signer: str | None = None,
               verbose: bool = False, quiet: bool = False) -> None:
    """Check a run directory's verdict as `kvprobe verify` does, then re-render its report (terminal, report.md,
    report.html) from what is on disk; each says first "signature verified" or "NOT verified: <why>".

    Uses DIR/verdict.json when there is one; else decides from the measurements (unsigned, nothing written
    but the reports); `kvprobe show DIR` prints the same and writes nothing. Exit: the verdict's own code, as
    eval's; a verdict that does not verify (unsigned, edited, an untrusted signer, a run that did not finish)
    is never 0: 1, or 2 when it cannot be checked; the most serious wins."""
    set_view(verbose, quiet)
    run = open_run(run_dir)
    note_run(run.path)
    shown = read_run(run, allowed_signers, signer)
    try:
        _report(run, shown.verdict, shown.standing)
    except DiskError as exc:
        _fail([f"{exc}: free space and run `{shlex.join(['kvprobe', 'report', str(run.path)])}` again"],
              exc.exit_code)
    sys.exit(shown.exit_code)
