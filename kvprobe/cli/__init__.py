"""Command line: parse, call, print. One module per command; this one assembles the group.

Exit codes: see kvprobe.errors (a bug is 70, its traceback in a file: kvprobe.cli.crash)."""

from __future__ import annotations

import click

from kvprobe import __version__
from kvprobe.cli import audit, canary, check, compare, demo, memmap, report, show, verify
from kvprobe.cli import eval as eval_
from kvprobe.cli._common import size_console
from kvprobe.cli.crash import Guarded


@click.group(cls=Guarded, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvprobe")
def main() -> None:
    """Is a KV-cache setting worth deploying? Measure it against a gold reference."""
    size_console()


for _command in (audit.audit, eval_.eval_cmd, demo.demo, memmap.memmap, report.report_cmd, canary.canary_cmd,
                 verify.verify_cmd, check.check_cmd, compare.compare_cmd, show.show_cmd):
    main.add_command(_command)

__all__ = ["main"]
