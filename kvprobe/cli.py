"""Command line: parse, call, print. Exit codes: 0 ok, 1 a bar fails, 2 cannot run,
3 invalid comparison, 4 a server is broken, 5 (audit) some of what a server sent is unreadable,
70 a bug in kvprobe (its traceback in a file, see kvprobe.crash), 130 interrupted."""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path

import click
import orjson
from rich.console import Console
from rich.markup import escape

from kvprobe import __version__
from kvprobe.client import Client
from kvprobe.config import Server, load_config
from kvprobe.crash import Guarded, note_run, note_secrets
from kvprobe.disk import DiskError
from kvprobe.errors import (
    EXIT_BROKEN,
    EXIT_CANNOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREADABLE,
    ConfigError,
    KvprobeError,
)
from kvprobe.inventory import NOT_TAKEN, Inventory, take_inventories
from kvprobe.report.ci import CiOutputs
from kvprobe.report.platform_text import platform_json
from kvprobe.report.terminal import audit_table, capacity_table
from kvprobe.store import RunDir

err_console = Console(stderr=True)
# Tables wider than 80 columns stay readable when stdout is a pipe or a CI log.
out_console = Console(width=None if sys.stdout.isatty() else 160)


# The CI files (--junit, --summary) of the command running, so a run that fails early still writes them.
_ci: CiOutputs | None = None


def _fail(lines: list[str], code: int = EXIT_CANNOT_RUN) -> None:
    global _ci
    for line in lines:
        err_console.print(f"[bold red]error:[/bold red] {escape(line)}", highlight=False, soft_wrap=True)
    if _ci is not None:
        ci, _ci = _ci, None  # once: a failure to write them must not loop back here
        try:
            ci.write(None, None, exit_code=code, notes=lines)
        except KvprobeError as exc:
            err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    sys.exit(code)


def _write_ci(run: RunDir, verdict: dict | None, code: int, notes: list[str] | None = None) -> None:
    global _ci
    if _ci is None:
        return
    from kvprobe.report.write import signature_info

    ci, _ci = _ci, None
    try:
        for path in ci.write(verdict, run.path, signature_info(run), code, notes):
            err_console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    except KvprobeError as exc:
        _fail([str(exc)])


JUNIT_HELP = "write the verdict as JUnit XML here (one testsuite per candidate, one testcase per bar)"
SUMMARY_HELP = "append a Markdown summary here (default: $GITHUB_STEP_SUMMARY when it is set)"


@click.group(cls=Guarded, context_settings={"help_option_names": ["-h", "--help"]})
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


PROBES_HELP = ("comma-separated probes: capacity,perplexity,agreement,needle,load (the default), tasks "
               "(lm-eval task accuracy; on by default when servers.toml has [tasks]) and the opt-in fill "
               "(serves each server's whole claimed KV pool)")


def _signing_key(key: Path | None):  # -> SigningKey
    from kvprobe.sign import default_allowed_signers, load_signing_key

    signing_key = load_signing_key(key)
    if signing_key.created:
        err_console.print(f"created a signing key at [bold]{signing_key.source}[/bold] (0600, "
                          f"{signing_key.fingerprint}); its public key is listed in {default_allowed_signers()}",
                          highlight=False, soft_wrap=True)
    return signing_key


def _open_run(out: Path | None, resume: Path | None, config, probes: str | None) -> tuple[RunDir, list[str]]:
    from kvprobe.evaluation import available_probes, check_resume

    if out is not None and resume is not None:
        raise ConfigError(["--out and --resume: give one (--resume reopens an existing run directory)"])
    if resume is not None:
        run = RunDir.open(resume)
        recorded = check_resume(config, run).get("probes") or available_probes(config)
        return run, [p.strip() for p in probes.split(",") if p.strip()] if probes else list(recorded)
    chosen = [p.strip() for p in probes.split(",") if p.strip()] if probes else available_probes(config)
    return RunDir.create(out), chosen


def _report(run: RunDir, verdict: dict) -> None:
    """Render report.md/report.html and print the decisions and where everything is."""
    from kvprobe.report.terminal import verdict_tables
    from kvprobe.report.write import render_reports

    rendered = render_reports(run, verdict)
    for table in verdict_tables(verdict):
        out_console.print(table)
    sig = rendered.signature
    rec = verdict["recommendation"]
    out_console.print(f"[bold]recommendation: {rec['server']}[/bold] — {rec['reason']}", highlight=False)
    for name, d in verdict["decisions"].items():
        out_console.print(f"  {name}: [bold]{d['decision']}[/bold]", highlight=False)
    signed = f"signed by {sig['fingerprint']}" if sig else "not signed"
    # soft_wrap: paths stay on one line, for copy and paste
    err_console.print(f"verdict: {run.path / 'verdict.json'} ({signed})", highlight=False, soft_wrap=True)
    err_console.print(f"report: [bold]{rendered.html}[/bold] and {rendered.markdown}", highlight=False,
                      soft_wrap=True)


def finish_command(run: RunDir, servers_file: Path | None) -> str:
    """How to finish the run: the exact command, ready to paste."""
    if servers_file is None:  # a canary's settings are its own: `eval --resume` would refuse them
        return "run the canary again to finish"
    command = ["kvprobe", "eval", "--servers", str(servers_file)]
    if not run.has("run.json"):  # stopped before the run was recorded: nothing to resume
        return f"start it again with `{shlex.join([*command, '--out', str(run.path)])}`"
    return f"finish it with `{shlex.join([*command, '--resume', str(run.path)])}`"


def resume_hint(run: RunDir, servers_file: Path | None) -> str:
    """What to do after Ctrl-C."""
    return f"everything measured is in {run.path}; {finish_command(run, servers_file)}"


def _run(config, run: RunDir, probe_list: list[str], key: Path | None, resume: bool,
         left_out: list[dict[str, str]] | None = None, servers_file: Path | None = None,
         deadline: float | None = None):  # -> EvalOutcome
    from kvprobe.evaluation import run_eval_sync

    note_run(run.path)
    signing_key = _signing_key(key)
    err_console.print(f"run directory: [bold]{escape(str(run.path))}[/bold]" + (" (resumed)" if resume else ""),
                      soft_wrap=True)  # one line, for copy and paste
    try:
        outcome = run_eval_sync(config, run, probe_list, err_console, signing_key=signing_key, resume=resume,
                                left_out=left_out, deadline=deadline, advise=servers_file is not None)
        verdict = outcome.ctx.results.get("verdict")
        if verdict is not None:
            _report(run, verdict)
    except KeyboardInterrupt:
        # escaped: a path with [brackets] is text, not rich markup
        err_console.print("[yellow]interrupted:[/yellow] " + escape(resume_hint(run, servers_file)),
                          highlight=False, soft_wrap=True)
        sys.exit(EXIT_INTERRUPTED)
    except DiskError as exc:  # what was appended before is whole on disk: resuming repeats none of it
        _fail([f"{exc}: free space and {finish_command(run, servers_file)}"], exc.exit_code)
    except KvprobeError as exc:
        _fail([str(exc)], exc.exit_code)
    if verdict is None and "capacity" in outcome.ctx.results:
        out_console.print(capacity_table(outcome.ctx.results["capacity"]))
    for line in outcome.messages:
        err_console.print(f"[bold red]error:[/bold red] {escape(line)}", highlight=False, soft_wrap=True)
    return outcome


def _evaluate(config_path: Path, out: Path | None, probes: str | None, resume: Path | None = None,
              key: Path | None = None, left_out: list[dict[str, str]] | None = None) -> None:
    try:
        config = load_config(config_path)
        note_secrets([server.api_key_env for server in config.servers])
        run, probe_list = _open_run(out, resume, config, probes)
    except ConfigError as exc:
        _fail(exc.problems)
    try:
        outcome = _run(config, run, probe_list, key, resume is not None, left_out, config_path)
    except ConfigError as exc:
        _fail(exc.problems)
    _write_ci(run, outcome.ctx.results.get("verdict"), outcome.exit_code, outcome.messages)
    err_console.print(f"results in [bold]{run.path}[/bold]")
    sys.exit(outcome.exit_code)


@main.command(name="eval")
@click.option("--servers", "servers_file", required=True, type=click.Path(path_type=Path),
              help="servers.toml")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="run directory (default runs/<UTC time>-<id>)")
@click.option("--resume", type=click.Path(path_type=Path), default=None,
              help="reopen this run directory and finish it: what it already measured is skipped")
@click.option("--probes", default=None, help=PROBES_HELP + "; with --resume, the run's own")
@click.option("--key", type=click.Path(path_type=Path), default=None,
              help="OpenSSH Ed25519 private key that signs the verdict (else $KVPROBE_SIGNING_KEY, else "
                   "kvprobe's own key in the config directory, created on first use)")
@click.option("--junit", type=click.Path(path_type=Path), default=None, help=JUNIT_HELP)
@click.option("--summary", type=click.Path(path_type=Path), default=None, help=SUMMARY_HELP)
def eval_cmd(servers_file: Path, out: Path | None, resume: Path | None, probes: str | None, key: Path | None,
             junit: Path | None, summary: Path | None) -> None:
    """Measure every server in servers.toml against the reference; write, sign and report the verdict.

    Exit: 0 done (read the decisions), 1 no candidate adopted and one fails or does not pass a bar,
    2 cannot run, 3 invalid comparison, 4 a server is broken, 130 interrupted (resume it), 70 a bug
    in kvprobe (the traceback is in DIR/crash.txt)."""
    global _ci
    _ci = CiOutputs.from_options(junit, summary)
    _evaluate(servers_file, out, probes, resume, key)


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="run directory")
@click.option("--probes", default=None, help=PROBES_HELP)
@click.option("--stop", is_flag=True, help="stop the demo servers afterwards")
@click.option("--key", type=click.Path(path_type=Path), default=None, help="signing key, as for eval")
@click.option("--hybrid", is_flag=True, help="the attention-light hybrid instead (needle-hybrid): KV dtype frees "
              "nothing, the Mamba SSM state dtype is the lever, and how it breaks with vLLM's defaults")
def demo(out: Path | None, probes: str | None, stop: bool, key: Path | None, hybrid: bool) -> None:
    """Start the demo trio this CPU can run (real local vLLM CPU servers serving needle-llama, only the
    KV dtype differs) and evaluate it. With AVX-512: auto, fp8, int8_per_token_head; on AVX2 only:
    auto and bfloat16 KV on float32 weights, and fp8, which the engine refuses to start there."""
    from kvprobe.demo import start_demo, write_servers_toml
    from kvprobe.servers import LaunchError, stop_all

    if hybrid:
        _demo_hybrid(out, probes, key)
        return

    err_console.print("starting the demo servers (first time: installs vLLM CPU, ~3 minutes)")
    try:
        bed, started, left_out = start_demo()
    except LaunchError as exc:
        _fail([str(exc)])
    err_console.print(f"testbed: {bed.isa}" + (" (forced by KVPROBE_VLLM_NO_AVX512=1)" if bed.forced else ""),
                      highlight=False)
    for sc, server in started:
        err_console.print(f"  {sc.name:>20} {server.url}  {sc.shows}" + (" (reused)" if server.reused else ""),
                          highlight=False)
    for row in left_out:
        # The reason already names the server and says it does not start.
        err_console.print(f"  [yellow]left out:[/yellow] {row['reason']}",
                          highlight=False, soft_wrap=True)
    try:
        _evaluate(write_servers_toml(started), out, probes, key=key, left_out=left_out)
    finally:
        if stop:
            stop_all()


def _demo_hybrid(out: Path | None, probes: str | None, key: Path | None) -> None:
    """One run directory per comparison, one after another; exits 0 once each has a signed verdict
    (its own exit code, which is the finding, is printed: a broken server is what the demo shows)."""
    from kvprobe.demo_hybrid import start_comparison, stop_unneeded, write_config
    from kvprobe.servers import LaunchError
    from kvprobe.servers.hybrid_bed import comparisons

    available = comparisons()
    chosen = list(available.values())
    if "kv" not in available:
        err_console.print("  [yellow]left out:[/yellow] fp8 KV next to auto (fp8 KV does not start on this CPU)",
                          highlight=False)
    results: list[tuple[str, str, int]] = []
    for i, c in enumerate(chosen):
        err_console.print(f"[bold]{c.key}[/bold]: {c.shows} (knob {c.knob})", highlight=False)
        try:
            start_comparison(c)
        except LaunchError as exc:
            _fail([str(exc)])
        path = write_config(c)
        try:
            config = load_config(path)
            run, probe_list = _open_run(out / c.key if out else None, None, config, probes)
            outcome = _run(config, run, probe_list, key, False, None, path)
        except ConfigError as exc:
            _fail(exc.problems)
        verdict = outcome.ctx.results.get("verdict") or {}
        decided = ", ".join(f"{n} {d['decision']}" for n, d in (verdict.get("decisions") or {}).items())
        results.append((c.key, decided, outcome.exit_code))
        stop_unneeded(c, chosen[i + 1] if i + 1 < len(chosen) else None)
    for name, decided, code in results:
        out_console.print(f"  {name}: {decided} (exit {code})", highlight=False)
    sys.exit(0 if all(decided for _, decided, _ in results) else 2)


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
@click.option("--platform", "platform_name", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="whose byte layout: the vLLM CPU build's, or CUDA's (per-token-head scales, nvfp4 packing)")
@click.option("--block-size", default=None, type=click.IntRange(min=1),
              help="vLLM --block-size (default: 128 on cpu, the CPU build's; 16 on cuda)")
@click.option("--block-align", default=128, show_default=True, type=click.IntRange(min=1),
              help="hybrid alignment unit in tokens (128 measured on the CPU build)")
@click.option("--max-num-batched-tokens", default=2048, show_default=True, type=click.IntRange(min=1),
              help="sliding-window layers reserve blocks for this many in-flight tokens")
@click.option("--chart", type=click.Path(path_type=Path), default=None,
              help="write the 'where the bytes are' PNG here (none unless told)")
@click.option("--lever-chart", type=click.Path(path_type=Path), default=None,
              help="write the KV x SSM state dtype PNG of a hybrid here (with --chart: its name + -lever)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def memmap(config: Path, max_model_len: int | None, kv_dtypes: str, kv_memory: str, mamba_ssm_dtype: str,
           mamba_cache_dtype: str, mamba_cache_mode: str, platform_name: str, block_size: int | None, block_align: int,
           max_num_batched_tokens: int, chart: Path | None, lever_chart: Path | None, as_json: bool) -> None:
    """Where the KV bytes are, the most a KV dtype can free, and (for a hybrid) which knob moves capacity:
    KV dtype or Mamba SSM state dtype. Predicted from a config.json."""
    from kvprobe.memmap import Settings, build, lever
    from kvprobe.report.bytes_chart import bytes_chart
    from kvprobe.report.lever_chart import lever_chart as draw_lever
    from kvprobe.report.memmap_table import dtype_table, lever_table, summary_table

    try:
        settings = Settings(
            kv_memory_bytes=_parse_bytes(kv_memory), block_size=block_size or 0, block_align=block_align,
            platform=platform_name,
            mamba_cache_mode=None if mamba_cache_mode == "auto" else mamba_cache_mode,
            mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_dtype, max_num_batched_tokens=max_num_batched_tokens,
        )
        mm = build(config, [d.strip() for d in kv_dtypes.split(",") if d.strip()], max_model_len, settings)
        lv = lever(mm)
    except click.BadParameter as exc:
        _fail([f"--kv-memory: {exc.message}"])
    except ConfigError as exc:
        _fail(exc.problems)
    if as_json:
        click.echo(orjson.dumps({"platform": settings.platform, **mm.to_json(), "lever": lv.to_json()},
                                option=orjson.OPT_INDENT_2).decode())
    else:
        out_console.print(summary_table(mm))
        for dtype in mm.plans:
            out_console.print(dtype_table(mm, dtype))
        if lv.ssm_dtypes:
            out_console.print(lever_table(lv))
        for note in mm.model.notes:
            err_console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
        out_console.print(mm.conclusion(), highlight=False, soft_wrap=True)
        if lv.ssm_dtypes:
            out_console.print(f"[bold]lever:[/bold] {lv.sentence()}", highlight=False, soft_wrap=True)
    # Charts only where told: a command that prints a prediction does not litter the working directory.
    charts = []
    if chart is not None:
        charts.append(("--chart", chart, lambda p: bytes_chart(mm, p), "chart"))
    # A dense model's grid is one column: the bytes chart already shows everything it would.
    if lv.ssm_dtypes and (lever_chart is not None or chart is not None):
        where = lever_chart or chart.with_name(f"{chart.stem}-lever{chart.suffix or '.png'}")  # type: ignore[union-attr]
        charts.append(("--lever-chart", where, lambda p: draw_lever(lv, p), "lever chart"))
    for option, path, draw, label in charts:
        try:
            written = draw(path)
        except DiskError as exc:
            _fail([f"{option} {path}: cannot write the chart: {exc.cause}"])
        err_console.print(f"{label}: [bold]{written}[/bold]", highlight=False)


@main.command(name="report")
@click.argument("run_dir", type=click.Path(path_type=Path))
def report_cmd(run_dir: Path) -> None:
    """Re-render a run directory's report (terminal, report.md, report.html) from what is on disk.

    Uses DIR/verdict.json when there is one; else decides from the measurements (unsigned, nothing
    written but the reports)."""
    from kvprobe.verdict import build_verdict

    try:
        run = RunDir.open(run_dir)
    except ConfigError as exc:
        _fail(exc.problems)
    note_run(run.path)
    if run.has("verdict.json"):
        verdict = run.read_json("verdict.json")
    else:
        err_console.print("[yellow]note:[/yellow] no verdict.json (the run did not finish): deciding from what "
                          "is on disk, unsigned", highlight=False)
        verdict = build_verdict(run)
    try:
        _report(run, verdict)
    except DiskError as exc:
        _fail([f"{exc}: free space and run `{shlex.join(['kvprobe', 'report', str(run.path)])}` again"],
              exc.exit_code)


@main.command(name="canary")
@click.option("--servers", "servers_file", required=True, type=click.Path(path_type=Path), help="servers.toml")
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="an earlier verdict (or its run directory): verified, then compared for drift")
@click.option("--allowed-signers", type=click.Path(path_type=Path), default=None,
              help="who may have signed the baseline (default as for `kvprobe verify`)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="run directory (default runs/<time>-<id>)")
@click.option("--key", type=click.Path(path_type=Path), default=None, help="signing key, as for eval")
@click.option("--junit", type=click.Path(path_type=Path), default=None, help=JUNIT_HELP)
@click.option("--summary", type=click.Path(path_type=Path), default=None, help=SUMMARY_HELP)
@click.option("--budget", default=None, help="finish within this time (5m, 90s, 1h30m): the subset is sized "
              "from the first-prefill smoke's speed, and what does not fit is not measured (and said)")
@click.option("--advisory-speed", is_flag=True, help="report speed but never let it change a decision or the "
              "exit code (a staging box too noisy or too shared to gate on)")
def canary_cmd(servers_file: Path, baseline: Path | None, allowed_signers: Path | None, out: Path | None,
               key: Path | None, junit: Path | None, summary: Path | None, budget: str | None,
               advisory_speed: bool = False) -> None:
    """A fast subset for a staging pipeline: smoke, capacity, short perplexity, a few needles, a short
    load case. Exit 0 pass, 1 a bar fails (or drift beyond a bar from --baseline), 2 cannot run,
    3 invalid, 4 broken."""
    from kvprobe.budget import parse_budget
    from kvprobe.canary import canary_config, canary_probes, compare_with_baseline, drift_table

    started = time.monotonic()
    global _ci
    _ci = CiOutputs.from_options(junit, summary)
    try:
        budget_s = parse_budget(budget) if budget else None
        config = canary_config(load_config(servers_file), budgeted=budget_s is not None)
        if advisory_speed:
            config = config.model_copy(update={"load": config.load.model_copy(update={"advisory": True})})
        note_secrets([server.api_key_env for server in config.servers])
        base = None
        if baseline is not None:
            from kvprobe.verify import verify_verdict

            base = verify_verdict(baseline, allowed_signers)
            err_console.print(f"baseline {base.path}: signature ok ({base.signer.fingerprint}), decisions "
                              "re-derived", highlight=False)
        run = RunDir.create(out)
    except KvprobeError as exc:
        lines = exc.problems if isinstance(exc, ConfigError) else [f"--baseline: {exc}"]
        _fail(lines, EXIT_CANNOT_RUN)
    try:
        # The whole command keeps the budget: the deadline counts from its start, and the reports
        # rendered after the verdict come out of the plan's reserve.
        deadline = started + budget_s if budget_s else None
        outcome = _run(config, run, canary_probes(), key, False, deadline=deadline)
    except ConfigError as exc:
        _fail(exc.problems)
    code = outcome.exit_code
    verdict = outcome.ctx.results.get("verdict")
    if base is not None and verdict is not None:
        drift = compare_with_baseline(base.verdict, verdict, str(base.path))
        run.write_json("canary.json", drift)
        out_console.print(drift_table(drift))
        if drift["fails"] and code == 0:
            code = 1
            err_console.print("[bold red]drift:[/bold red] " + "; ".join(drift["fails"]), highlight=False)
    notes = [f"drift from the baseline: {line}" for line in (drift["fails"] if base and verdict else [])]
    _write_ci(run, verdict, code, outcome.messages + notes)
    wall = time.monotonic() - started
    err_console.print(f"canary wall time {wall:.0f} s" + (f" (budget {budget_s:.0f} s)" if budget_s else ""),
                      highlight=False)
    err_console.print(f"results in [bold]{run.path}[/bold]")
    sys.exit(code)


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
