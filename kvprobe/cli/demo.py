"""kvprobe demo: start the testbed this CPU can run and evaluate it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvprobe.cli._common import (
    PROBES_HELP,
    _evaluate,
    _fail,
    _open_run,
    _run,
    err_console,
    out_console,
    set_view,
    view_options,
)
from kvprobe.config import load_config
from kvprobe.errors import (
    ConfigError,
)


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="run directory")
@click.option("--probes", default=None, help=PROBES_HELP)
@click.option("--stop", is_flag=True, help="stop the demo servers afterwards")
@click.option("--key", type=click.Path(path_type=Path), default=None, help="signing key, as for eval")
@click.option("--hybrid", is_flag=True, help="the attention-light hybrid instead (needle-hybrid): KV dtype frees "
              "nothing, the Mamba SSM state dtype is the lever, and how it breaks with vLLM's defaults")
@view_options
def demo(out: Path | None, probes: str | None, stop: bool, key: Path | None, hybrid: bool,
         verbose: bool = False, quiet: bool = False) -> None:
    """Start the demo trio this CPU can run (real local vLLM CPU servers serving needle-llama, only the
    KV dtype differs) and evaluate it. With AVX-512: auto, fp8, int8_per_token_head; on AVX2 only:
    auto and bfloat16 KV on float32 weights, and fp8, which the engine refuses to start there."""
    from kvprobe.testbed import LaunchError, stop_all
    from kvprobe.testbed.demo import CAPACITY_ONLY_TOKENS, start_demo, write_servers_toml
    from kvprobe.testbed.launcher import require_checkout

    set_view(verbose, quiet)
    try:
        require_checkout()
    except LaunchError as exc:
        _fail([str(exc)])
    if hybrid:
        _demo_hybrid(out, probes, key)
        return

    err_console.print("starting the demo servers (first time: installs vLLM CPU, ~3 minutes)")
    try:
        only_capacity = probes is not None and {p.strip() for p in probes.split(",") if p.strip()} <= {"capacity"}
        bed, started, left_out = start_demo(CAPACITY_ONLY_TOKENS) if only_capacity else start_demo()
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
        _say_which_died(started)
        if stop:
            stop_all()


def _say_which_died(started: list) -> None:
    """The verdict can only quote the HTTP error ("See stack trace (above)"); the demo started the servers, so
    it can say what their own logs say."""
    from kvprobe.testbed.launcher import died_of

    for sc, server in started:
        if not server.alive():
            err_console.print(f"  {sc.name}: its vLLM server ({server.spec.knobs}) stopped during the run: "
                              f"{died_of(server.log)}; log: {server.log}", highlight=False, soft_wrap=True)


def _demo_hybrid(out: Path | None, probes: str | None, key: Path | None) -> None:
    """One run directory per comparison, one after another; exits 0 once each has a signed verdict
    (its own exit code, which is the finding, is printed: a broken server is what the demo shows)."""
    from kvprobe.testbed import LaunchError
    from kvprobe.testbed.demo_hybrid import start_comparison, stop_unneeded, write_config
    from kvprobe.testbed.hybrid import comparisons

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
        verdict = outcome.verdict or {}
        decided = ", ".join(f"{n} {d['decision']}" for n, d in (verdict.get("decisions") or {}).items())
        results.append((c.key, decided, outcome.exit_code))
        stop_unneeded(c, chosen[i + 1] if i + 1 < len(chosen) else None)
    for name, decided, code in results:
        out_console.print(f"  {name}: {decided} (exit {code})", highlight=False)
    sys.exit(0 if all(decided for _, decided, _ in results) else 2)
