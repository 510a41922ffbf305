"""kvprobe verify: check a verdict's signature and re-derive its decisions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from kvprobe.cli._common import (
    err_console,
    out_console,
)
from kvprobe.errors import one_line

if TYPE_CHECKING:  # the verify stack loads when the command runs, not with every command
    from kvprobe.verdict.verify import Examined


@click.command(name="verify")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
              help="OpenSSH allowed_signers file (default: $KVPROBE_ALLOWED_SIGNERS, else the one beside "
                   "kvprobe's own key in the config directory)")
@click.option("--signer", default=None, help="require this principal from the allowed_signers file")
@click.option("--unsigned", is_flag=True,
              help="re-derive a verdict that is unsigned or whose signature does not hold, and say so: the "
                   "signature is reported, not required")
@click.option("--json", "as_json", is_flag=True,
              help="print the result as one JSON document, holding or not (errors also one line on stderr)")
def verify_cmd(target: Path, allowed_signers: Path | None, signer: str | None, unsigned: bool = False,
               as_json: bool = False) -> None:
    """Check a verdict's signature, then re-derive every decision from its numbers.

    TARGET is a run directory or its verdict.json. Exit 0 holds, 1 does not hold, 2 cannot check."""
    from kvprobe.verdict.verify import examine

    found = examine(target, allowed_signers, signer, unsigned)
    if as_json:
        import orjson

        click.echo(orjson.dumps(document(found), option=orjson.OPT_INDENT_2).decode())
    elif found.holds:
        _print_holds(found)
    for reason in found.reasons:
        err_console.print(f"[bold red]error:[/bold red] {escape(reason)}", highlight=False, soft_wrap=True)
    sys.exit(found.exit_code)


def _recorded(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """What the verdict says of itself (evidence only when it holds); None where it cannot be read."""
    decisions = (verdict or {}).get("decisions")
    return {"rules": (verdict or {}).get("rules"),
            "decisions": ({n: d.get("decision") if isinstance(d, dict) else None for n, d in decisions.items()}
                          if isinstance(decisions, dict) else None),
            "recommendation": (verdict or {}).get("recommendation"), "exit_code": (verdict or {}).get("exit_code")}


def document(found: Examined) -> dict[str, Any]:
    """The `kvprobe.verify/1` document, holding or not: `reasons` says why it does not hold."""
    problem, signer = found.signature_problem, found.signer
    signature = {"ok": signer is not None, "required": found.signature_required, "fingerprint": found.signed_by,
                 "principals": list(signer.principals) if signer else [], "allowed_signers": found.allowed_source,
                 "problem": None if problem is None else one_line(problem, limit=1000)}
    return {"schema": "kvprobe.verify/1", "path": str(found.path), "holds": found.holds, "reasons": found.reasons,
            "unsigned": not found.signature_required, "signature": signature, **_recorded(found.verdict),
            "notes": list(found.notes)}


def _print_holds(found: Examined) -> None:
    v = found.verdict or {}
    if found.signer is not None:
        out_console.print(f"[green]signature ok[/green]: {escape(str(found.path))} signed by "
                          f"{found.signer.fingerprint} ({escape(', '.join(found.signer.principals))} in "
                          f"{escape(str(found.allowed_source))})", highlight=False, soft_wrap=True)
    elif found.signature_problem is not None:  # --unsigned: why the signature does not hold, which did not count
        out_console.print(f"[yellow]signature not required (--unsigned)[/yellow]: "
                          f"{escape(one_line(found.signature_problem, limit=1000))}", highlight=False, soft_wrap=True)
    out_console.print("[green]decisions re-derived[/green] from the recorded numbers and bars: "
                      + ", ".join(f"{escape(n)} {d['decision']}" for n, d in v["decisions"].items())
                      + f"; recommendation {escape(str(v['recommendation']['server']))}", highlight=False)
    for note in found.notes:
        err_console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
