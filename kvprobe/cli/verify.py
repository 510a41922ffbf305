"""kvprobe verify: check a verdict's signature and re-derive its decisions."""

from __future__ import annotations

from pathlib import Path

import click

from kvprobe.cli._common import (
    _fail,
    err_console,
    out_console,
)
from kvprobe.errors import (
    KvprobeError,
)


@click.command(name="verify")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
              help="OpenSSH allowed_signers file (default: $KVPROBE_ALLOWED_SIGNERS, else the one beside "
                   "kvprobe's own key in the config directory)")
@click.option("--signer", default=None, help="require this principal from the allowed_signers file")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON (errors stay one line on stderr)")
def verify_cmd(target: Path, allowed_signers: Path | None, signer: str | None, as_json: bool = False) -> None:
    """Check a verdict's signature, then re-derive every decision from its numbers.

    TARGET is a run directory or its verdict.json. Exit 0 holds, 1 does not hold, 2 cannot check."""
    from kvprobe.verdict.verify import verify_verdict

    try:
        result = verify_verdict(target, allowed_signers, signer)
    except KvprobeError as exc:
        _fail(str(exc).splitlines(), exc.exit_code)
    v = result.verdict
    if as_json:
        import orjson

        click.echo(orjson.dumps({
            "schema": "kvprobe.verify/1", "path": str(result.path), "holds": True,
            "signature": {"ok": True, "fingerprint": result.signer.fingerprint,
                          "principals": list(result.signer.principals), "allowed_signers": str(result.allowed_source)},
            "rules": v.get("rules"), "decisions": {n: d["decision"] for n, d in v["decisions"].items()},
            "recommendation": v["recommendation"], "exit_code": v.get("exit_code"), "notes": list(result.notes),
        }, option=orjson.OPT_INDENT_2).decode())
        return
    out_console.print(f"[green]signature ok[/green]: {result.path} signed by {result.signer.fingerprint} "
                      f"({', '.join(result.signer.principals)} in {result.allowed_source})", highlight=False)
    out_console.print("[green]decisions re-derived[/green] from the recorded numbers and bars: "
                      + ", ".join(f"{n} {d['decision']}" for n, d in v["decisions"].items())
                      + f"; recommendation {v['recommendation']['server']}", highlight=False)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
