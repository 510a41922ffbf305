"""What the commands share: the consoles, one-line failures (and the CI files they still write), and
running an evaluation into a run directory."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from kvprobe import settings
from kvprobe.cli.crash import note_run, note_secrets
from kvprobe.config import Config, load_config, shared_urls, unset_keys
from kvprobe.errors import (
    EXIT_CANNOT_RUN,
    EXIT_INTERRUPTED,
    ConfigError,
    DiskError,
    KvprobeError,
)
from kvprobe.probes import help_text
from kvprobe.report.ci import CiOutputs
from kvprobe.report.terminal import capacity_table
from kvprobe.run.store import RunDir

if TYPE_CHECKING:  # the signature and verify stack loads when a verdict is shown, not with every command
    from kvprobe.report.standing import Standing

err_console = Console(stderr=True)
# Tables wider than 80 columns stay readable when stdout is a pipe or a CI log.
out_console = Console(width=None if sys.stdout.isatty() or settings.columns_set() else 120)  # size_console()

# How much a command prints of its results: "summary" (default: a few lines per candidate), "verbose" (the
# full tables once, then the summary) or "quiet" (the decision lines only; the exit code says the rest).
VIEWS = ("summary", "verbose", "quiet")
view = "summary"


def view_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--verbose/-v` and `--quiet/-q` for a command that prints a verdict (it calls set_view with them)."""
    command = click.option("--quiet", "-q", is_flag=True,
                           help="print only the decision lines; the exit code says the rest")(command)
    return click.option("--verbose", "-v", is_flag=True, help="also print the full tables (each once)")(command)


def servers_file_input(command: Callable[..., Any]) -> Callable[..., Any]:
    """servers.toml as `--servers F` or as the first argument, on every command that reads it: `kvprobe eval F`
    and `kvprobe check --servers F` are what a user types after using the other. The command gets `servers_file`."""

    @functools.wraps(command)
    def given(*args: Any, servers_arg: Path | None = None, servers_opt: Path | None = None, **kwargs: Any) -> Any:
        if servers_arg is not None and servers_opt is not None and servers_arg != servers_opt:
            _fail([f"two servers files, {servers_arg} and --servers {servers_opt}: give one"])
        path = servers_opt if servers_opt is not None else servers_arg
        if path is None:
            _fail([f"no servers file: kvprobe {click.get_current_context().info_name} --servers servers.toml"])
        return command(*args, servers_file=path, **kwargs)

    given = click.argument("servers_arg", required=False, metavar="[SERVERS_FILE]",
                           type=click.Path(path_type=Path))(given)
    return click.option("--servers", "servers_opt", type=click.Path(path_type=Path), default=None,
                        help="servers.toml (or give it as the first argument)")(given)


def set_view(verbose: bool, quiet: bool) -> None:
    global view
    if verbose and quiet:
        _fail(["--verbose and --quiet: give one"])
    view = "verbose" if verbose else "quiet" if quiet else "summary"


def size_console() -> None:
    """COLUMNS, read when a command starts, not at import: an embedding caller may set it late (and a
    previous command in the same process may have set another)."""
    if (columns := settings.columns()) is not None:
        out_console.width = columns
    else:
        out_console.width = None if sys.stdout.isatty() else 120  # type: ignore[assignment]


def print_lines(lines: list[str]) -> None:
    """Plain lines on stdout in the terminal's width (COLUMNS): each wrapped between words, never inside a
    figure (kvprobe.report.wrap), its continuation indented under it; a word wider than the line (a path)
    stays whole, for copy and paste."""
    from kvprobe.report.wrap import wrap

    width = out_console.width
    for line in lines:
        indent = line[:len(line) - len(line.lstrip())]
        for part in wrap(line, width, indent, indent + "    "):
            out_console.print(part, highlight=False, markup=False, soft_wrap=True)


def run_console() -> Console:
    """What a run prints as it goes (progress, a line per probe): nothing with --quiet."""
    return Console(stderr=True, quiet=True) if view == "quiet" else err_console


# The CI files (--junit, --summary) of the command running live on its click context, so a run that
# fails early still writes them and nothing outlives the invocation (CliRunner runs many in one process).
_CI_KEY = "kvprobe.ci_outputs"


def set_ci(outputs: CiOutputs | None) -> None:
    click.get_current_context().meta[_CI_KEY] = outputs


def _take_ci() -> CiOutputs | None:
    """The command's CI outputs, once: a failure to write them must not loop back here."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.pop(_CI_KEY, None)


def _fail(lines: list[str], code: int = EXIT_CANNOT_RUN) -> NoReturn:
    for line in lines:
        err_console.print(f"[bold red]error:[/bold red] {escape(line)}", highlight=False, soft_wrap=True)
    if (ci := _take_ci()) is not None:
        try:
            ci.write(None, None, exit_code=code, notes=lines)
        except KvprobeError as exc:
            err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    sys.exit(code)


def warn(lines: list[str]) -> None:
    for line in lines:
        err_console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)


def warn_config(config: Config, source: Path) -> None:
    """What eval and canary go on with but an operator should hear before the run: a key variable left
    unset, two servers at one URL (an A/A comparison, which `check` refuses)."""
    warn(unset_keys(config, str(source)) + shared_urls(config, str(source)))


def _write_ci(run: RunDir, verdict: dict | None, code: int, notes: list[str] | None = None) -> None:
    if (ci := _take_ci()) is None:
        return
    from kvprobe.report.standing import signature_info

    try:
        for path in ci.write(verdict, run.path, signature_info(run), code, notes):
            err_console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    except KvprobeError as exc:
        _fail([str(exc)])


JUNIT_HELP = "write the verdict as JUnit XML here (one testsuite per candidate, one testcase per bar)"
SUMMARY_HELP = "append a Markdown summary here (default: $GITHUB_STEP_SUMMARY when it is set)"


PROBES_HELP = help_text()


def _signing_key(key: Path | None):  # -> SigningKey
    from kvprobe.verdict.sign import default_allowed_signers, load_signing_key

    signing_key = load_signing_key(key)
    if signing_key.created:
        err_console.print(f"created a signing key at [bold]{signing_key.source}[/bold] (0600, "
                          f"{signing_key.fingerprint}); its public key is listed in {default_allowed_signers()}",
                          highlight=False, soft_wrap=True)
    return signing_key


def _open_run(out: Path | None, resume: Path | None, config, probes: str | None) -> tuple[RunDir, list[str]]:
    from kvprobe.evaluate.orchestrate import check_resume
    from kvprobe.probes import default_probes

    if out is not None and resume is not None:
        raise ConfigError(["--out and --resume: give one (--resume reopens an existing run directory)"])
    if resume is not None:
        run = RunDir.open(resume)
        recorded = check_resume(config, run).get("probes") or default_probes(config)
        return run, [p.strip() for p in probes.split(",") if p.strip()] if probes else list(recorded)
    chosen = [p.strip() for p in probes.split(",") if p.strip()] if probes else default_probes(config)
    return RunDir.create(out), chosen


def _report(run: RunDir, verdict: dict, standing: Standing, write: bool = True) -> None:
    """Render report.md/report.html (not with `write` off: `show` changes nothing) and print the answer (as `view`
    says), whether it can be trusted, and where everything is."""
    from kvprobe.report.standing import NOT_VERIFIED, SIGNED_HERE
    from kvprobe.report.summary import decision_lines, print_summary
    from kvprobe.report.terminal import verdict_tables
    from kvprobe.report.write import render_reports

    rendered = render_reports(run, verdict, standing) if write else None
    if view == "quiet":
        if standing.kind == NOT_VERIFIED:  # stdout keeps to the decision lines a script reads
            err_console.print(_standing_text(standing), highlight=False, soft_wrap=True)
        for line in decision_lines(verdict):
            out_console.print(line, highlight=False, markup=False)
        return
    if standing.kind != SIGNED_HERE:  # checked here (report, show): said first; eval names its signer at the end
        out_console.print(_standing_text(standing), highlight=False, soft_wrap=True)
    if view == "verbose":
        for table in verdict_tables(verdict):
            out_console.print(table)
    print_summary(out_console, verdict)
    # soft_wrap: paths stay on one line, for copy and paste
    if run.has("verdict.json"):
        err_console.print(f"verdict: {escape(str(run.path / 'verdict.json'))} ({escape(standing.short)})",
                          highlight=False, soft_wrap=True)
    if rendered is not None:
        err_console.print(f"report: [bold]{escape(str(rendered.html))}[/bold] and {escape(str(rendered.markdown))}",
                          highlight=False, soft_wrap=True)


def _standing_text(standing: Standing) -> str:
    from kvprobe.report.standing import NOT_VERIFIED, VERIFIED

    style = "bold red" if standing.kind == NOT_VERIFIED else "green" if standing.kind == VERIFIED else ""
    return f"[{style}]{escape(standing.line)}[/{style}]" if style else escape(standing.line)


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
    from kvprobe.evaluate.orchestrate import run_eval_sync
    from kvprobe.report.standing import this_run

    note_run(run.path)
    signing_key = _signing_key(key)
    err_console.print(f"run directory: [bold]{escape(str(run.path))}[/bold]" + (" (resumed)" if resume else ""),
                      soft_wrap=True)  # one line, for copy and paste
    try:
        outcome = run_eval_sync(config, run, probe_list, run_console(), signing_key=signing_key, resume=resume,
                                left_out=left_out, deadline=deadline, advise=servers_file is not None)
        verdict = outcome.verdict
        if verdict is not None:
            _report(run, verdict, this_run(run))
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
        warn_config(config, config_path)
        run, probe_list = _open_run(out, resume, config, probes)
    except ConfigError as exc:
        _fail(exc.problems)
    try:
        outcome = _run(config, run, probe_list, key, resume is not None, left_out, config_path)
    except ConfigError as exc:
        _fail(exc.problems)
    _write_ci(run, outcome.verdict, outcome.exit_code, outcome.messages)
    err_console.print(f"results in [bold]{run.path}[/bold]")
    sys.exit(outcome.exit_code)


