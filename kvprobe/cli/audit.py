"""kvprobe audit: inventory and capacity of running servers."""

from __future__ import annotations

import asyncio
import sys

import click
import orjson
from rich.markup import escape

from kvprobe.cli._common import (
    _fail,
    err_console,
    out_console,
)
from kvprobe.client import Client
from kvprobe.config import Server
from kvprobe.crash import note_secrets
from kvprobe.errors import (
    EXIT_BROKEN,
    EXIT_CANNOT_RUN,
    EXIT_OK,
    EXIT_UNREADABLE,
)
from kvprobe.inventory import NOT_TAKEN, Inventory, take_inventories
from kvprobe.report.platform_text import platform_json
from kvprobe.report.terminal import audit_table


@click.command()
@click.argument("urls", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table")
@click.option("--api-key-env", default=None, help="environment variable holding the API key")
@click.option("--no-smoke", is_flag=True, help="skip the first-prefill smoke request")
@click.option("--smoke-fraction", default=0.5, show_default=True, help="smoke prompt, share of max_model_len")
def audit(urls: tuple[str, ...], as_json: bool, api_key_env: str | None, no_smoke: bool,
          smoke_fraction: float) -> None:
    """Inventory and capacity of one or many servers (probed concurrently).

    Warnings go to stderr, with --json too. Exit: 0 audited, 2 a server cannot be audited
    (unreachable, wrong key, answers kvprobe cannot read), 4 a server is broken (failed the smoke),
    5 audited, but some endpoints or values are unreadable (garbage /metrics, a capacity of inf: each
    is a warning line)."""
    problems = []
    for i, url in enumerate(urls):
        try:
            Server(name=f"s{i}", url=url)
        except ValueError as exc:
            problems.append(f"URL {url!r}: {str(exc).splitlines()[-1].strip()}")
    if problems:
        _fail(problems)
    note_secrets([api_key_env])
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
                "smoke": inv.smoke and inv.smoke.__dict__, **platform_json(inv.platform), "warnings": inv.warnings,
                "unreadable": inv.unreadable,
            })
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    else:
        out_console.print(audit_table(inventories))
    for inv in inventories:  # stderr, so --json's stdout stays one JSON document
        for warning in inv.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {escape(f'{inv.url}: {warning}')}", highlight=False,
                              soft_wrap=True)
    failed = [inv for inv in inventories if inv.status != "ok"]
    for inv in failed:
        err_console.print(f"[bold red]error:[/bold red] {escape(inv.error or inv.name)}", highlight=False,
                          soft_wrap=True)
    sys.exit(audit_exit_code(inventories))


def audit_exit_code(inventories: list[Inventory]) -> int:
    """The most serious first: a server not audited, then a broken one, then unreadable answers."""
    if any(inv.status in NOT_TAKEN for inv in inventories):
        return EXIT_CANNOT_RUN
    if any(inv.status != "ok" for inv in inventories):
        return EXIT_BROKEN
    return EXIT_UNREADABLE if any(inv.unreadable for inv in inventories) else EXIT_OK
