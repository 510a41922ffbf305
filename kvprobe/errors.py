"""Errors that end a command, each carrying the exit code the CLI returns for it, and the exit codes
themselves: this docstring is where the code documents them (users read docs/commands.md, "Exit codes").

Exit codes (the EXIT_* constants below):
    0    EXIT_OK           done: a candidate adopted, or nothing measured fails
    1    EXIT_BAR_FAILED   nothing adopted and a bar fails or is not shown to pass; verify: does not hold;
                           compare: a regression
    2    EXIT_CANNOT_RUN   cannot run: one line names the thing to fix (every KvprobeError by default)
    3    EXIT_INVALID      invalid comparison: the servers differ in more than the knob
    4    EXIT_BROKEN       a server is broken: healthy, but it failed the smoke or a probe
    5    EXIT_UNREADABLE   audit only: done, but something a server sent could not be read
    70   EXIT_INTERNAL     a bug in kvprobe (EX_SOFTWARE), never a measured outcome (kvprobe.cli.crash)
    130  EXIT_INTERRUPTED  Ctrl-C: the shell's 128 + SIGINT
The most serious wins: 2, then 3, 4, 1 (audit: 2, then 4, 5).

The exceptions, with the exit code each ends a command with:
    KvprobeError                 2  base class: the message is one line that names the thing to fix
    ├── ConfigError              2  servers.toml or a command-line value is wrong (one line per problem)
    │   └── NotModelled          2  a valid input the memory map has no byte model for
    ├── ServerError              2  a server answered with an error or not at all
    │   ├── Unreachable          2  no connection, DNS failure or a timeout before any answer
    │   ├── AuthError            2  401/403: the API key is missing or wrong
    │   └── Unreadable           2  a value a server sent that kvprobe cannot use
    ├── MetricsError             2  /metrics could not be parsed
    ├── SignatureError           1  verify: the signature does not hold
    ├── SchemaViolation          1  verify: a verdict that does not follow its own schema version
    ├── DiskError                2  a write the disk refused
    ├── CiOutputError            2  a CI output file (--junit, --summary) could not be written
    ├── TokenizerUnavailable     2  no way to count tokens
    └── PlacementError           2  a needle case cannot be built
A measured outcome (1, 3, 4) is not an exception: the verdict carries it (kvprobe.verdict.build).
"""

from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_BAR_FAILED = 1
EXIT_CANNOT_RUN = 2
EXIT_INVALID = 3
EXIT_BROKEN = 4
EXIT_UNREADABLE = 5  # audit: done, but something a server sent could not be read
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
EXIT_INTERNAL = 70  # a bug in kvprobe (EX_SOFTWARE), never a measured outcome
_SERIOUS_FIRST = (EXIT_CANNOT_RUN, EXIT_INVALID, EXIT_BROKEN, EXIT_BAR_FAILED, EXIT_OK)  # audit has its own order


def most_serious(*codes: int) -> int:
    """The exit code that wins among eval's: 2, then 3, 4, 1, 0."""
    return min(codes, key=_SERIOUS_FIRST.index)


class KvprobeError(Exception):
    """Base class: the message is one line that names the thing to fix."""

    exit_code = EXIT_CANNOT_RUN


class ConfigError(KvprobeError):
    """servers.toml (or a command-line value) is wrong; `problems` has one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class NotModelled(ConfigError):
    """A valid input kvprobe's memory map has no byte model for (a format or platform): a limit, not a
    mistake; a run leaves that prediction out and says why."""


class ServerError(KvprobeError):
    """A server answered with an error or not at all."""

    def __init__(self, server: str, message: str, *, status: int | None = None, path: str | None = None):
        self.server = server
        self.status = status
        self.path = path
        self.detail = message
        where = f" {path}" if path else ""
        code = f" HTTP {status}" if status else ""
        super().__init__(f"{server}:{code}{where}: {message}")


class Unreachable(ServerError):
    """No TCP connection, DNS failure or a timeout before any answer."""

    def __init__(self, server: str, message: str, *, path: str | None = None):
        super().__init__(server, message, path=path)
        self.args = (f"{server}: {message}",)

    def __str__(self) -> str:
        return self.args[0]


class AuthError(ServerError):
    """401/403: the API key is missing or wrong."""


class MetricsError(KvprobeError):
    """/metrics could not be parsed."""


class Unreadable(ServerError):
    """A value a server sent that kvprobe cannot use; the message names where it came from. A
    ServerError: met during a probe, a server sending garbage is a server failing."""

    def __init__(self, message: str, *, server: str = "", path: str | None = None):
        super().__init__(server, message, path=path)
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


class SignatureError(KvprobeError):
    """The signature does not hold: changed bytes, unknown signer, wrong namespace, bad file."""

    exit_code = 1


class DiskError(KvprobeError):
    """A write the disk refused; `path` is the file kvprobe was writing."""

    def __init__(self, path: str | Path, exc: OSError):
        self.path = Path(path)
        self.errno = exc.errno
        self.cause = exc.strerror or str(exc) or type(exc).__name__
        super().__init__(f"cannot write {self.path}: {self.cause}")


class SchemaViolation(KvprobeError):
    """A verdict that does not follow its own schema version: `kvprobe verify` does not hold (exit 1)."""

    exit_code = 1


class CiOutputError(KvprobeError):
    """A CI output file could not be written (exit 2, like any other write that fails)."""


class TokenizerUnavailable(KvprobeError):
    """No way to count tokens: no /tokenize anywhere and no usable tiktoken encoding."""


class PlacementError(KvprobeError):
    """A case cannot be built (the target is shorter than the needle, question and template)."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of a message: every run of whitespace (newlines too) one space, at most
    `limit` characters, the exception's type name when it has no text."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:limit]
