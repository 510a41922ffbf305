"""kvprobe compare: what changed between two verdicts of the same comparison (the nightly drift view)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from kvprobe.cli._common import _fail, print_lines
from kvprobe.errors import EXIT_BAR_FAILED, EXIT_CANNOT_RUN, EXIT_OK, ConfigError


@click.command(name="compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
              help="who may have signed the verdicts (default as for `kvprobe verify`)")
@click.option("--unsigned", is_flag=True,
              help="compare a verdict that does not verify (unsigned, untrusted or edited) as it is, and say so")
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON")
@click.option("-v", "--verbose", is_flag=True, help="list every check that moved, the guardrails too")
def compare_cmd(a: Path, b: Path, allowed_signers: Path | None, unsigned: bool, as_json: bool,
                verbose: bool) -> None:
    """Compare two runs (run directories or verdict.json files) of the same comparison: the conclusion first
    (regression or not, and why; a change of platform is named, since a difference then need not be the
    software's), then each candidate's decision, capacity and gating checks A -> B (the guardrails that moved as
    a count; --verbose lists them), and the paired change on the cases both measured. --json: one document,
    schema kvprobe.compare/1.

    Exit 0 no regression, 1 a regression (a decision worse in B, a candidate decided in A missing from B, or a
    check pass -> fail), 2 cannot compare (a verdict that does not verify without --unsigned, another reference
    or knob)."""
    from kvprobe.evaluate.compare import compare, describe, load_side

    try:
        sides = [load_side(label, target, allowed_signers, unsigned) for label, target in (("A", a), ("B", b))]
        result = compare(*sides)
    except ConfigError as exc:
        _fail(exc.problems, EXIT_CANNOT_RUN)
    code = EXIT_BAR_FAILED if result["regressions"] else EXIT_OK
    if as_json:
        sys.stdout.write(orjson.dumps({**result, "exit": code}, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_lines(describe(result, verbose))
    sys.exit(code)
