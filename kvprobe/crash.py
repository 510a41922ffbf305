"""A bug must not look like a result. An exception nothing expected is written, with its traceback,
to a file (the open run directory's crash.txt, else the user's cache directory); the user gets one
line naming that file, and the CLI exits 70 (EX_SOFTWARE in sysexits.h), which no outcome uses.

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

from kvprobe import __version__
from kvprobe.store import utc_now

REDACTED = "[redacted]"
# Variables whose values are credentials by their name, whatever servers.toml says.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",;}]+")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvprobe"


def secrets(env_names: Iterable[str]) -> list[str]:
    """The values to keep out: the named variables' (api_key_env), and any variable that names a secret."""
    names = set(env_names) | {n for n in os.environ if _SECRET_NAME.search(n)}
    values = {os.environ[n] for n in names if len(os.environ.get(n) or "") >= 4}
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
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        except OSError:
            continue
        return target
    return None
