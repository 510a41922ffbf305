"""The CLI's one top-level guard. A KvprobeError is its one line and exit code; Ctrl-C is 130; any
other exception is a bug, and a bug must not look like a result: it is written, with its traceback,
to a file (the open run directory's crash.txt, else the user's cache directory), the user gets one
line naming that file, and the exit is 70 (EX_SOFTWARE in sysexits.h), which no outcome uses.

The file is meant to be attached to a bug report, so no secret may be in it: exception messages can
quote request headers (lm-eval's aiohttp errors do), so every API key kvprobe was told about is
replaced, and so is any bearer token.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from kvprobe import __version__, settings
from kvprobe.disk import as_disk_error, is_disk_error, write_atomic
from kvprobe.errors import EXIT_CANNOT_RUN, EXIT_INTERNAL, EXIT_INTERRUPTED, DiskError, KvprobeError
from kvprobe.run.store import utc_now

REDACTED = "[redacted]"
RUN_DIR, SECRET_ENV = "kvprobe.run_dir", "kvprobe.secret_env"  # keys in the click context's meta
# Variables whose values are credentials by their name, whatever servers.toml says.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",;}]+")


def cache_dir() -> Path:
    return settings.cache_home() / "kvprobe"


def secrets(env_names: Iterable[str]) -> list[str]:
    """The values to keep out: the named variables' (api_key_env), and any variable that names a secret."""
    values = {v for v in settings.secret_variables(env_names, _SECRET_NAME).values() if len(v) >= 4}
    return sorted(values, key=len, reverse=True)  # longest first: a key containing another is replaced whole


def redact(text: str, values: Iterable[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return _BEARER.sub(rf"\1{REDACTED}", text)


def report_text(exc: BaseException, argv: list[str], values: list[str]) -> str:
    lines = [f"kvprobe {__version__} internal error at {utc_now()}",
             f"command: {' '.join(argv)}",
             f"python {platform.python_version()} on {platform.platform()}", "",
             *traceback.format_exception(exc)]
    return redact("\n".join(line.rstrip("\n") for line in lines) + "\n", values)


def write_crash(exc: BaseException, *, run_dir: Path | None, secret_env: Iterable[str] = (),
                argv: list[str] | None = None) -> Path | None:
    """Where the report went: DIR/crash.txt, else a new file in the cache directory; None when the
    disk took neither (the caller then shows the redacted report itself)."""
    text = report_text(exc, list(sys.argv if argv is None else argv), secrets(secret_env))
    stamp = utc_now().replace(":", "").replace("-", "")
    targets = [run_dir / "crash.txt"] if run_dir is not None else []
    targets.append(cache_dir() / "crashes" / f"crash-{stamp}-{os.getpid()}.txt")
    for target in targets:
        try:
            write_atomic(target, text.encode())
        except DiskError:
            continue
        return target
    return None


def _meta() -> dict[str, Any]:
    """The click context's meta: one dict shared by every command's context and the group's."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta if ctx is not None else {}


def note_run(path: Path) -> None:
    """A crash from here on is reported in this run directory."""
    _meta()[RUN_DIR] = path


def note_secrets(env_names: Iterable[str | None]) -> None:
    """These environment variables hold API keys: a crash report must not show their values."""
    _meta().setdefault(SECRET_ENV, set()).update(n for n in env_names if n)


class Guarded(click.Group):
    """A click group whose commands never end in a traceback on screen nor in an exit code that reads
    like a measured outcome."""

    console = Console(stderr=True)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors and --help are click's to print
        except KvprobeError as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:
                self.console.print(f"[bold red]error:[/bold red] {escape(line)}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            if not is_disk_error(exc):
                self._crashed(ctx, exc)
            # A full disk met by a library kvprobe calls (not through kvprobe.disk) is not a bug either.
            run_dir = ctx.meta.get(RUN_DIR)
            where = f"; what was measured is in {run_dir}" if run_dir else ""
            self.console.print(f"[bold red]error:[/bold red] {escape(f'{as_disk_error(exc)}{where}')}",
                               highlight=False, soft_wrap=True)
            sys.exit(EXIT_CANNOT_RUN)
        except KeyboardInterrupt:  # eval prints its own resume command first
            run_dir = ctx.meta.get(RUN_DIR)
            where = f": what was measured is in {run_dir}" if run_dir else ""
            self.console.print(f"[yellow]interrupted[/yellow]{escape(where)}", highlight=False, soft_wrap=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            self._crashed(ctx, exc)

    def _crashed(self, ctx: click.Context, exc: Exception) -> NoReturn:
        names = ctx.meta.get(SECRET_ENV, set())
        path = write_crash(exc, run_dir=ctx.meta.get(RUN_DIR), secret_env=names)
        where = f"the traceback is in {path}" if path else "no disk took the traceback, so here it is"
        self.console.print(f"[bold red]internal error[/bold red] (a bug in kvprobe, not a result): "
                           f"{escape(f'{type(exc).__name__}; {where}')}: please report it", highlight=False,
                           soft_wrap=True)
        if path is None:
            self.console.print(escape(report_text(exc, sys.argv, secrets(names))), highlight=False)
        sys.exit(EXIT_INTERNAL)
