"""Command line: parse, call, print. One module per command; this one assembles the group.

Exit codes: 0 ok, 1 a bar fails, 2 cannot run, 3 invalid comparison, 4 a server is broken, 5 (audit) some
of what a server sent is unreadable, 70 a bug in kvprobe (its traceback in a file, see kvprobe.cli.crash),
130 interrupted."""

from __future__ import annotations

import click

from kvprobe import __version__
from kvprobe.cli import audit, canary, check, compare, demo, memmap, report, verify
from kvprobe.cli import eval as eval_
from kvprobe.cli._common import size_console
from kvprobe.cli.crash import Guarded


@click.group(cls=Guarded, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvprobe")
def main() -> None:
    """Is a KV-cache setting worth deploying? Measure it against a gold reference."""
    size_console()


for _command in (audit.audit, eval_.eval_cmd, demo.demo, memmap.memmap, report.report_cmd, canary.canary_cmd,
                 verify.verify_cmd, check.check_cmd, compare.compare_cmd):
    main.add_command(_command)

__all__ = ["main"]
