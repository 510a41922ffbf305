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


PROBES_HELP = "comma-separated probes: capacity,perplexity,agreement,needle,load (default: all)"


def _evaluate(config_path: Path, out: Path | None, probes: str | None) -> None:
    from kvprobe.evaluation import available_probes, run_eval_sync

    try:
        config = load_config(config_path)
        probe_list = [p.strip() for p in probes.split(",") if p.strip()] if probes else available_probes()
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


@main.command(name="eval")
@click.option("--servers", "servers_file", required=True, type=click.Path(path_type=Path),
              help="servers.toml")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="run directory (default runs/<UTC time>-<id>)")
@click.option("--probes", default=None, help=PROBES_HELP)
def eval_cmd(servers_file: Path, out: Path | None, probes: str | None) -> None:
    """Measure every server in servers.toml against the reference and write a run directory."""
    _evaluate(servers_file, out, probes)


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="run directory")
@click.option("--probes", default=None, help=PROBES_HELP)
@click.option("--stop", is_flag=True, help="stop the demo servers afterwards")
def demo(out: Path | None, probes: str | None, stop: bool) -> None:
    """Start three real local vLLM CPU servers (needle-llama; auto, fp8, int8_per_token_head) and
    evaluate them with the repository's servers.toml."""
    from kvprobe.servers import LaunchError, demo_specs, start_many, stop_all
    from kvprobe.servers.launcher import PROJECT_ROOT

    err_console.print("starting the demo servers (first time: installs vLLM CPU, ~3 minutes)")
    try:
        servers = start_many(demo_specs())
    except LaunchError as exc:
        _fail([str(exc)])
    for server in servers:
        err_console.print(f"  {server.spec.kv_cache_dtype:>20} {server.url}" + (" (reused)" if server.reused else ""))
    try:
        _evaluate(PROJECT_ROOT / "servers.toml", out, probes)
    finally:
        if stop:
            stop_all()


def _parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '8GB' -> bytes."""
    units = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
             "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
    raw = text.strip().lower().replace("_", "").replace(",", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):].strip()
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{text!r} is not a size like 1073741824, 1GiB or 512MiB") from None
    if value < 1:
        raise click.BadParameter(f"{text!r} must be positive")
    return int(value)


@main.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="tokens per request (default: the config's max_position_embeddings)")
@click.option("--kv-dtype", "kv_dtypes", default="auto,fp8", show_default=True,
              help="comma-separated --kv-cache-dtype values; the first is the reference")
@click.option("--kv-memory", default="1GiB", show_default=True, help="KV cache memory (bytes, or 1GiB, 512MiB)")
@click.option("--mamba-ssm-dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
              help="SSM state dtype (auto: the model's default, float32 for NemotronH)")
@click.option("--mamba-cache-dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "float32", "float16", "bfloat16"]), help="conv state dtype")
@click.option("--mamba-cache-mode", default="auto", show_default=True, type=click.Choice(["auto", "align", "none"]),
              help="align: prefix caching on; none: off; auto: vLLM's default (align for hybrids)")
@click.option("--block-size", default=128, show_default=True, type=click.IntRange(min=1),
              help="vLLM --block-size (the CPU build's default is 128)")
@click.option("--block-align", default=128, show_default=True, type=click.IntRange(min=1),
              help="hybrid alignment unit in tokens (128 measured on the CPU build)")
@click.option("--max-num-batched-tokens", default=2048, show_default=True, type=click.IntRange(min=1),
              help="sliding-window layers reserve blocks for this many in-flight tokens")
@click.option("--chart", type=click.Path(path_type=Path), default=None,
              help="where to write the 'where the bytes are' PNG (default memmap.png; with --json only if given)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def memmap(config: Path, max_model_len: int | None, kv_dtypes: str, kv_memory: str, mamba_ssm_dtype: str,
           mamba_cache_dtype: str, mamba_cache_mode: str, block_size: int, block_align: int,
           max_num_batched_tokens: int, chart: Path | None, as_json: bool) -> None:
    """Where the KV bytes are, and the most a KV dtype can free, predicted from a config.json."""
    from kvprobe.memmap import Settings, build
    from kvprobe.report.bytes_chart import bytes_chart
    from kvprobe.report.memmap_table import dtype_table, summary_table

    try:
        settings = Settings(
            kv_memory_bytes=_parse_bytes(kv_memory), block_size=block_size, block_align=block_align,
            mamba_cache_mode=None if mamba_cache_mode == "auto" else mamba_cache_mode,
            mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_dtype, max_num_batched_tokens=max_num_batched_tokens,
        )
        mm = build(config, [d.strip() for d in kv_dtypes.split(",") if d.strip()], max_model_len, settings)
    except click.BadParameter as exc:
        _fail([f"--kv-memory: {exc.message}"])
    except ConfigError as exc:
        _fail(exc.problems)
    if as_json:
        click.echo(orjson.dumps(mm.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        out_console.print(summary_table(mm))
        for dtype in mm.plans:
            out_console.print(dtype_table(mm, dtype))
        for note in mm.model.notes:
            err_console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
        out_console.print(mm.conclusion(), highlight=False, soft_wrap=True)
    if chart is not None or not as_json:
        try:
            written = bytes_chart(mm, chart or Path("memmap.png"))
        except OSError as exc:
            _fail([f"--chart {chart or 'memmap.png'}: cannot write the chart: {exc.strerror}"])
        err_console.print(f"chart: [bold]{written}[/bold]", highlight=False)


if __name__ == "__main__":
    main()
