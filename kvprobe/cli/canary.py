"""kvprobe canary: a fast subset for a staging pipeline."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from kvprobe.cli._common import (
    JUNIT_HELP,
    SUMMARY_HELP,
    _fail,
    _run,
    _write_ci,
    err_console,
    out_console,
    servers_file_input,
    set_ci,
    set_view,
    view_options,
    warn_config,
)
from kvprobe.cli.crash import note_secrets
from kvprobe.config import load_config
from kvprobe.errors import (
    EXIT_CANNOT_RUN,
    ConfigError,
    KvprobeError,
)
from kvprobe.report.ci import CiOutputs
from kvprobe.run.store import RunDir


@click.command(name="canary")
@servers_file_input
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
@view_options
def canary_cmd(servers_file: Path, baseline: Path | None, allowed_signers: Path | None, out: Path | None,
               key: Path | None, junit: Path | None, summary: Path | None, budget: str | None,
               advisory_speed: bool = False, verbose: bool = False, quiet: bool = False) -> None:
    """A fast subset for a staging pipeline: smoke, capacity, short perplexity, a few needles, a short
    load case. Exit 0 pass, 1 a bar fails (or drift beyond a bar from --baseline), 2 cannot run,
    3 invalid, 4 broken."""
    from kvprobe.evaluate.canary import canary_config, canary_probes, compare_with_baseline, drift_table
    from kvprobe.run.budget import parse_budget

    started = time.monotonic()
    set_view(verbose, quiet)
    set_ci(CiOutputs.from_options(junit, summary))
    try:
        budget_s = parse_budget(budget) if budget else None
        config = canary_config(load_config(servers_file), budgeted=budget_s is not None)
        if advisory_speed:
            config = config.model_copy(update={"load": config.load.model_copy(update={"advisory": True})})
        note_secrets([server.api_key_env for server in config.servers])
        warn_config(config, servers_file)
        base = None
        if baseline is not None:
            from kvprobe.verdict.verify import verify_verdict

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
    verdict = outcome.verdict
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
