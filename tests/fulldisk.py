"""A disk that fills up on cue, for the files under one directory: every byte kvprobe writes goes
through os.write (kvprobe.disk), so the fake sits there and the rest of the process is untouched.

    disk = FullDisk(tmp_path / "run", at="plots/load.png")  # full from the first write into that file
    disk = FullDisk(tmp_path / "run", at="events.jsonl", after=30_000)  # ... once that file got 30 kB
    disk = FullDisk(tmp_path / "run", capacity=20_000)       # full after that many bytes in all
(a write that crosses the line is cut short, the next one gets ENOSPC)
    monkeypatch.setattr(os, "write", disk.write)
    ...
    disk.free()                                              # space again: every write goes through

`written` records each file that received bytes, so a test can tell that no writer went around the
seam (such a file would be on disk without being in it).
"""

from __future__ import annotations

import errno
import fnmatch
import os
from pathlib import Path

_real_write = os.write


class FullDisk:
    def __init__(self, root: Path, *, capacity: int | None = None, at: str | None = None, after: int = 0,
                 code: int = errno.ENOSPC):
        self.root = Path(root).resolve()
        self.capacity = capacity
        self.at = at
        self.after = after
        self.into_at = 0  # bytes the files matching `at` received
        self.code = code
        self.used = 0
        self.full = False
        self.refused: list[str] = []  # files a write was refused for, relative to root
        self.written: set[str] = set()

    def free(self) -> None:
        self.full, self.capacity, self.at = False, None, None

    def _name(self, fd: int) -> str | None:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return None
        if not path.is_relative_to(self.root):
            return None
        rel = path.relative_to(self.root)
        name = rel.name
        if name.startswith(".") and name.endswith(".tmp"):  # an atomic write's temporary: the file it becomes
            name = name[1:-4]
        return str(rel.with_name(name))

    def _refuse(self, name: str) -> OSError:
        self.full = True
        self.refused.append(name)
        return OSError(self.code, os.strerror(self.code))

    def write(self, fd: int, data: bytes | memoryview) -> int:
        name = self._name(fd)
        if name is None:
            return _real_write(fd, data)
        if self.full:
            raise self._refuse(name)
        room = None if self.capacity is None else self.capacity - self.used
        at = self.at is not None and fnmatch.fnmatch(name, self.at)
        if at:
            room = self.after - self.into_at if room is None else min(room, self.after - self.into_at)
        if room is not None:
            if room <= 0:
                raise self._refuse(name)
            data = memoryview(data)[:room]  # the disk takes what fits; the next write gets ENOSPC
        n = _real_write(fd, data)
        self.used += n
        self.into_at += n if at else 0
        self.written.add(name)
        return n
