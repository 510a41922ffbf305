"""Every byte kvprobe writes goes through here. A disk that refuses a write (full, over quota,
read-only, no permission) is then one DiskError naming the file and the cause, exit 2, whichever
writer met it: events, summaries, inventories, plots, reports, the verdict or its signature.

A refused write leaves nothing half-done behind: a whole file is written to a temporary name and
renamed (the temporary is removed when the write fails), and an events line is appended whole or
not at all (the file is cut back to where it was), so what the log already held stays readable and
`--resume` picks up from it once there is space.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from kvprobe.errors import DiskError

# The disk's own refusals, as opposed to a bug (a wrong path) or a server's failure: a full disk met
# by a library kvprobe calls (lm-eval, a tokenizer cache) is this class too.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def is_disk_error(exc: BaseException) -> bool:
    return isinstance(exc, DiskError) or (isinstance(exc, OSError) and exc.errno in DISK_ERRNOS)


def as_disk_error(exc: OSError) -> DiskError:
    """An OSError met outside this module (a library's write) as the one line."""
    return DiskError(exc.filename or "a file (the disk did not say which)", exc)


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Any OSError inside is a refused write of `path`."""
    try:
        yield
    except DiskError:
        raise
    except OSError as exc:
        raise DiskError(path, exc) from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | Path, data: bytes, mode: int = 0o644) -> Path:
    """`path` holds `data`, or is as it was: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()  # frees what the partial write took
            raise
    return path


def append_line(path: str | Path, line: bytes) -> None:
    """Append one line and fsync it; on a refused write the file is cut back to its old length, so
    it never ends in half a record. A last line torn by a crash (no newline) is never glued onto."""
    path = Path(path)
    with writing(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            try:
                _write_all(fd, line)
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                raise
        finally:
            os.close(fd)


def mkdir(path: str | Path) -> Path:
    path = Path(path)
    with writing(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


def json_digest(obj: Any, length: int, *, default: Callable[[Any], Any] | None = None) -> str:
    """The first `length` hex digits of the SHA-256 of `obj` as canonical JSON (orjson, sorted keys):
    the key settings, plans and documents are recorded under (the same value, the same key)."""
    return hashlib.sha256(orjson.dumps(obj, default=default, option=orjson.OPT_SORT_KEYS)).hexdigest()[:length]
