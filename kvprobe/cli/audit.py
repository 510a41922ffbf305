"""kvprobe audit: a fleet view of running servers (inventory, capacity, what sets each apart from the rest of
its model group) and, with --watch, whether the KV cache is what limits each one."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
import orjson
from rich.console import Console
from rich.markup import escape

from kvprobe import settings
from kvprobe.cli._common import (
    _fail,
    err_console,
    out_console,
)
from kvprobe.cli.crash import note_secrets
from kvprobe.config import Server
from kvprobe.errors import (
    EXIT_BROKEN,
    EXIT_CANNOT_RUN,
    EXIT_OK,
    EXIT_UNREADABLE,
    ConfigError,
    KvprobeError,
    Unreadable,
)
from kvprobe.report.fleet import differences, fleet_table, group_by_model, host_port, pressure_table
from kvprobe.report.platform_text import platform_json, platform_short, platform_text
from kvprobe.report.wrap import wrap
from kvprobe.server.client import Client
from kvprobe.server.inventory import NOT_TAKEN, Inventory, take_inventories
from kvprobe.server.metrics import (
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    only_families,
    parse_metrics,
)
from kvprobe.server.pressure import INTERVAL_S, MIN_WINDOW_S, Diagnosis, Sample, diagnose, summarize, two_x_format
from kvprobe.server.untrusted import number

SCHEMA = "kvprobe.audit/1"
# What --watch reads: a few gauges and counters, not the histograms that are most of /metrics.
WATCHED = (KV_USAGE, RUNNING, WAITING, WAITING_BY_REASON, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, PROMPT_TOKENS,
           GENERATION_TOKENS)


@click.command()
@click.argument("urls", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True,
              help=f'print one JSON object {{"schema": "{SCHEMA}", "servers": [...]}} instead of tables')
@click.option("--watch", "watch_text", default=None, metavar="DURATION",
              help="also read each server's /metrics every ~2 s for this long (60s, 5m) and say whether the KV "
                   "cache is what limits it")
@click.option("--api-key-env", default=None, help="environment variable holding the API key")
@click.option("--no-smoke", is_flag=True, help="skip the first-prefill smoke request")
@click.option("--smoke-fraction", default=0.5, show_default=True, help="smoke prompt, share of max_model_len")
def audit(urls: tuple[str, ...], as_json: bool, watch_text: str | None, api_key_env: str | None, no_smoke: bool,
          smoke_fraction: float) -> None:
    """A fleet view of one or many servers (probed concurrently): one row per server, grouped by model, with
    what each differs in from the others of its model; --watch adds a KV-pressure diagnosis per server.

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
    window_s = None
    if watch_text is not None:
        try:
            window_s = watch_seconds(watch_text)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        _fail(problems)
    note_secrets([api_key_env])
    if api_key_env and not settings.api_key(api_key_env):
        _fail([f"--api-key-env: environment variable {api_key_env} is not set"])

    async def go() -> tuple[list[Inventory], dict[str, Diagnosis]]:
        clients = [Client(u, u, api_key=settings.api_key(api_key_env)) for u in urls]
        try:
            with err_console.status(f"auditing {len(urls)} server(s)"):
                inventories = await take_inventories(clients, smoke_fraction=smoke_fraction, run_smoke=not no_smoke)
            if window_s is None:
                return inventories, {}
            with err_console.status(f"watching /metrics of {len(urls)} server(s) for {window_s:.0f} s"):
                return inventories, await watch(clients, inventories, window_s)
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    inventories, diagnoses = asyncio.run(go())
    if as_json:
        click.echo(orjson.dumps(audit_json(inventories, diagnoses, window_s), option=orjson.OPT_INDENT_2).decode())
    else:
        # COLUMNS first: the terminal's width, else 120 for a pipe or a CI log (out_console's)
        width = settings.columns() or out_console.width
        console = Console(width=width)
        console.print(fleet_table(inventories, width))
        # The table's platform cell is short; each distinct platform in full under it: run-on beside
        # compiled-for (a GPU's architecture and driver, the CUDA torch was built for, the kernels' archs)
        for text, urls in platforms_in_full(inventories):
            for line in wrap(f"platform of {', '.join(urls)}: {text}", width, hang="  "):
                console.print(escape(line), highlight=False, soft_wrap=True)
        if window_s is not None:
            console.print()
            console.print(pressure_table(inventories, diagnoses, window_s))
            console.print()
            for inv in inventories:
                if (diag := diagnoses.get(inv.url)) is not None:
                    # one line each, as the warnings are: a log is grepped by server
                    console.print(f"{escape(host_port(inv.url))}: {escape(diag.sentence)}", highlight=False,
                                  soft_wrap=True)
    for inv in inventories:  # stderr, so --json's stdout stays one JSON document
        for warning in inv.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {escape(f'{inv.url}: {warning}')}", highlight=False,
                              soft_wrap=True)
    failed = [inv for inv in inventories if inv.status != "ok"]
    for inv in failed:
        err_console.print(f"[bold red]error:[/bold red] {escape(inv.error or inv.name)}", highlight=False,
                          soft_wrap=True)
    sys.exit(audit_exit_code(inventories))


def watch_seconds(text: str) -> float:
    from kvprobe.run.budget import parse_duration

    seconds = parse_duration(text, "--watch")
    if seconds < MIN_WINDOW_S:
        raise ConfigError([f"--watch {text!r}: at least {MIN_WINDOW_S:.0f}s (samples are {INTERVAL_S:.0f} s apart, "
                           "and a shorter window cannot tell a blip from a trend)"])
    return seconds


async def sample_metrics(client: Client, inv: Inventory, seconds: float, interval: float | None = None) -> list[Sample]:
    """/metrics every `interval` s (INTERVAL_S) for `seconds`, on a fixed schedule (a slow answer does not
    push the next one back). A sample that cannot be read is one warning on the inventory, once per kind,
    and is left out: a counter's increase is taken over the samples there are."""
    interval = interval or INTERVAL_S
    samples: list[Sample] = []
    start = time.monotonic()
    for k in range(int(seconds // interval) + 1):
        await asyncio.sleep(max(0.0, start + k * interval - time.monotonic()))
        try:
            snap = parse_metrics(only_families(await client.metrics_text(), WATCHED))
        except KvprobeError as exc:  # unreachable, a 5xx, not Prometheus text: the window goes on
            line = f"--watch: /metrics sample left out: {exc}"
            if line not in inv.warnings:
                inv.warnings.append(line)
            continue
        for line in snap.unreadable:
            if line not in inv.unreadable:
                inv.cannot_read(line)
        samples.append(Sample(time.monotonic(), snap))
    return samples


def max_num_seqs(inv: Inventory) -> int | None:
    """The scheduler's cap on running sequences, where /server_info (dev mode) shows it."""
    try:
        return number((inv.server_info or {}).get("vllm_config.scheduler_config.max_num_seqs"),
                      "/server_info max_num_seqs", integer=True, minimum=1, maximum=10**7)
    except Unreadable:
        return None


async def watch(clients: list[Client], inventories: list[Inventory], seconds: float) -> dict[str, Diagnosis]:
    """Every audited server watched at once over the same window; by URL, its diagnosis."""
    watched = [(c, inv) for c, inv in zip(clients, inventories, strict=True) if inv.status == "ok"]
    windows = await asyncio.gather(*(sample_metrics(c, inv, seconds) for c, inv in watched))
    return {inv.url: diagnose(summarize(samples), two_x_format(inv), max_num_seqs(inv))
            for (_, inv), samples in zip(watched, windows, strict=True)}


def platforms_in_full(inventories: list[Inventory]) -> list[tuple[str, list[str]]]:
    """Each distinct platform a server exposed, in full, with the servers on it (host:port), in audit order."""
    out: dict[str, list[str]] = {}
    for inv in inventories:
        if inv.platform is not None:
            out.setdefault(platform_text(inv.platform), []).append(host_port(inv.url))
    return list(out.items())


def audit_json(inventories: list[Inventory], diagnoses: dict[str, Diagnosis], window_s: float | None) -> dict[str, Any]:
    """The `kvprobe.audit/1` document: a consumer checks `schema` before reading `servers`."""
    differs = {id(inv): d for _, group in group_by_model(inventories)
               for inv, d in zip(group, differences(group), strict=True)}
    rows = []
    for inv in inventories:
        cap = inv.capacity
        diag = diagnoses.get(inv.url)
        rows.append({
            "url": inv.url, "server": host_port(inv.url), "status": inv.status, "error": inv.error,
            "version": inv.version, "model": inv.model, "model_root": inv.model_root,
            "max_model_len": inv.max_model_len, "cache_dtype": inv.cache_dtype,
            "kv_cache_tokens": cap.kv_cache_tokens if cap else None,
            "kv_cache_tokens_estimate": cap.estimate if cap else None,
            "max_concurrency": cap.max_concurrency if cap else None, "kv_usage": inv.kv_usage,
            "healthy": inv.healthy, "smoke_ok": inv.smoke.ok if inv.smoke else None,
            "smoke": inv.smoke and inv.smoke.__dict__, **platform_json(inv.platform),
            "platform_text": platform_text(inv.platform), "platform_short": platform_short(inv.platform),
            "differs_in": differs[id(inv)],
            "pressure": diag.to_dict() if diag else None,
            "warnings": inv.warnings, "unreadable": inv.unreadable,
        })
    return {"schema": SCHEMA, "watch_seconds": window_s, "servers": rows}


def audit_exit_code(inventories: list[Inventory]) -> int:
    """The most serious first: a server not audited, then a broken one, then unreadable answers."""
    if any(inv.status in NOT_TAKEN for inv in inventories):
        return EXIT_CANNOT_RUN
    if any(inv.status != "ok" for inv in inventories):
        return EXIT_BROKEN
    return EXIT_UNREADABLE if any(inv.unreadable for inv in inventories) else EXIT_OK
