"""Command line: parse, call, print. Exit codes: 0 ok, 1 a bar fails, 2 cannot run,
3 invalid comparison, 4 a server is broken."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
import orjson
from rich.console import Console

from kvprobe import __version__
from kvprobe.client import Client
from kvprobe.config import Server, load_config
from kvprobe.errors import EXIT_CANNOT_RUN, ConfigError, KvprobeError
from kvprobe.inventory import take_inventories
from kvprobe.report.terminal import audit_table, capacity_table
from kvprobe.store import RunDir

err_console = Console(stderr=True)
# Tables wider than 80 columns stay readable when stdout is a pipe or a CI log.
out_console = Console(width=None if sys.stdout.isatty() else 160)


def _fail(lines: list[str], code: int = EXIT_CANNOT_RUN) -> None:
    for line in lines:
        err_console.print(f"[bold red]error:[/bold red] {line}", highlight=False, soft_wrap=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvprobe")
def main() -> None:
    """Is a KV-cache setting worth deploying? Measure it against a gold reference."""


@main.command()
@click.argument("urls", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table")
@click.option("--api-key-env", default=None, help="environment variable holding the API key")
@click.option("--no-smoke", is_flag=True, help="skip the first-prefill smoke request")
@click.option("--smoke-fraction", default=0.5, show_default=True, help="smoke prompt, share of max_model_len")
def audit(urls: tuple[str, ...], as_json: bool, api_key_env: str | None, no_smoke: bool,
          smoke_fraction: float) -> None:
    """Inventory and capacity of one or many servers (probed concurrently)."""
    problems = []
    for i, url in enumerate(urls):
        try:
            Server(name=f"s{i}", url=url)
        except ValueError as exc:
            problems.append(f"URL {url!r}: {str(exc).splitlines()[-1].strip()}")
    if problems:
        _fail(problems)
    if api_key_env:
        import os

        if not os.environ.get(api_key_env):
            _fail([f"--api-key-env: environment variable {api_key_env} is not set"])

    async def go():
        clients = [Client(u, u, api_key=Server(name="x", url=u, api_key_env=api_key_env).api_key())
                   for u in urls]
        try:
            return await take_inventories(clients, smoke_fraction=smoke_fraction, run_smoke=not no_smoke)
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    with err_console.status(f"auditing {len(urls)} server(s)"):
        inventories = asyncio.run(go())
    if as_json:
        rows = []
        for inv in inventories:
            cap = inv.capacity
            rows.append({
                "url": inv.url, "status": inv.status, "error": inv.error, "version": inv.version,
                "model": inv.model, "model_root": inv.model_root, "max_model_len": inv.max_model_len,
                "cache_dtype": inv.cache_dtype, "kv_cache_tokens": cap.kv_cache_tokens if cap else None,
                "kv_cache_tokens_estimate": cap.estimate if cap else None,
                "max_concurrency": cap.max_concurrency if cap else None, "kv_usage": inv.kv_usage,
                "healthy": inv.healthy, "smoke_ok": inv.smoke.ok if inv.smoke else None,
                "smoke": inv.smoke and inv.smoke.__dict__, "warnings": inv.warnings,
            })
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    else:
        out_console.print(audit_table(inventories))
        for inv in inventories:
            for warning in inv.warnings:
                err_console.print(f"[yellow]warning:[/yellow] {inv.url}: {warning}", highlight=False)
    failed = [inv for inv in inventories if inv.status != "ok"]
    for inv in failed:
        err_console.print(f"[bold red]error:[/bold red] {inv.error}", highlight=False, soft_wrap=True)
    if failed:
        sys.exit(EXIT_CANNOT_RUN if any(i.status != "broken" for i in failed) else 4)


@main.command(name="eval")
@click.option("--servers", "servers_file", required=True, type=click.Path(path_type=Path),
              help="servers.toml")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="run directory (default runs/<time>-<id>)")
@click.option("--probes", default="capacity,perplexity,agreement,needle,load", show_default=True,
              help="comma-separated probes to run")
def eval_cmd(servers_file: Path, out: Path | None, probes: str) -> None:
    """Measure every server in servers.toml against the reference and write a run directory."""
    from kvprobe.evaluation import run_eval_sync

    try:
        config = load_config(servers_file)
        probe_list = [p.strip() for p in probes.split(",") if p.strip()]
        run = RunDir.create(out)
    except ConfigError as exc:
        _fail(exc.problems)
    err_console.print(f"run directory: [bold]{run.path}[/bold]")
    try:
        outcome = run_eval_sync(config, run, probe_list, err_console)
    except KvprobeError as exc:
        _fail([str(exc)], exc.exit_code)
    if "capacity" in outcome.ctx.results:
        cap = outcome.ctx.results["capacity"]
        out_console.print(capacity_table(cap))
        pin = cap["pin"]
        out_console.print("pin check: " + ("[green]valid[/green] (servers differ only in KV dtype)"
                                           if pin["valid"] else "[red]INVALID[/red]"))
    for line in outcome.messages:
        err_console.print(f"[bold red]error:[/bold red] {line}", highlight=False, soft_wrap=True)
    err_console.print(f"results in [bold]{run.path}[/bold]")
    sys.exit(outcome.exit_code)


@main.command(name="verify")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
              help="OpenSSH allowed_signers file (default: $KVPROBE_ALLOWED_SIGNERS, else the one beside "
                   "kvprobe's own key in the config directory)")
@click.option("--signer", default=None, help="require this principal from the allowed_signers file")
def verify_cmd(target: Path, allowed_signers: Path | None, signer: str | None) -> None:
    """Check a verdict's signature, then re-derive every decision from its numbers.

    TARGET is a run directory or its verdict.json. Exit 0 holds, 1 does not hold, 2 cannot check."""
    from kvprobe.verify import verify_verdict

    try:
        result = verify_verdict(target, allowed_signers, signer)
    except KvprobeError as exc:
        _fail(str(exc).splitlines(), exc.exit_code)
    v = result.verdict
    out_console.print(f"[green]signature ok[/green]: {result.path} signed by {result.signer.fingerprint} "
                      f"({', '.join(result.signer.principals)} in {result.allowed_source})", highlight=False)
    out_console.print("[green]decisions re-derived[/green] from the recorded numbers and bars: "
                      + ", ".join(f"{n} {d['decision']}" for n, d in v["decisions"].items())
                      + f"; recommendation {v['recommendation']['server']}", highlight=False)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/yellow] {note}", highlight=False)


if __name__ == "__main__":
    main()
