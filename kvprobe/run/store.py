"""The run directory: everything measured, on disk as it happens, so a crash loses nothing.

Layout of runs/<UTC time>-<id>/:
  run.json               config (no secrets), kvprobe version, start time, probes asked for
  events.jsonl           one JSON object per measurement, appended and fsync'ed as it happens
                         (events.jsonl.gz instead in a run packed for keeping: read, never appended to)
  inventory/<name>.json  per-server facts; inventory/<name>.metrics.txt the raw /metrics
  <probe>.json           each probe's summary, written when the probe finishes

Every write goes through kvprobe.disk: a disk that refuses one is a DiskError naming the file.
"""

from __future__ import annotations

import gzip
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from kvprobe.disk import append_line, write_atomic
from kvprobe.errors import ConfigError

EVENTS = "events.jsonl"
# A finished run kept as evidence may hold its log gzip'ed (tests/fixtures/runs): the same lines.
PACKED_EVENTS = "events.jsonl.gz"

_DUMP = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dumps(obj: Any) -> bytes:
    """Deterministic, readable JSON (sorted keys)."""
    return orjson.dumps(obj, option=_DUMP) + b"\n"


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def create(cls, out: str | Path | None = None, root: str | Path = "runs") -> RunDir:
        if out is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            out = Path(root) / f"{stamp}-{secrets.token_hex(3)}"
        path = Path(out)
        try:
            (path / "inventory").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError([f"--out {path}: cannot create the run directory: {exc.strerror}"]) from None
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        path = Path(path)
        if not (path / "run.json").is_file():
            raise ConfigError([f"{path}: not a kvprobe run directory (no run.json)"])
        return cls(path)

    # -- files ------------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_bytes(name, dumps(obj))

    def write_bytes(self, name: str, data: bytes) -> Path:
        return write_atomic(self.path / name, data)

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode())

    def read_json(self, name: str) -> Any:
        return orjson.loads((self.path / name).read_bytes())

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    # -- events -----------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one measurement to events.jsonl and flush it to disk before returning."""
        record = {"t": utc_now(), "kind": kind, **fields}
        self._append([record])
        return record

    def event_many(self, kind: str, records: list[dict[str, Any]]) -> None:
        """Append many events with one write and one fsync: all of them, or none on a refused write."""
        stamp = utc_now()
        self._append([{"t": stamp, "kind": kind, **r} for r in records])

    def _append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        if self.events_file() == self.path / PACKED_EVENTS:
            # A new events.jsonl beside the packed log would hide the packed events from every reader.
            raise ConfigError([f"{self.path / PACKED_EVENTS}: this run's events are packed; unpack them "
                               f"(gunzip {self.path / PACKED_EVENTS}) before adding to the run"])
        opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        data = b"".join(orjson.dumps(r, option=opts) + b"\n" for r in records)
        with self._lock:
            append_line(self.path / EVENTS, data)

    def events_file(self) -> Path | None:
        """The events log: events.jsonl (the live one) when there is one, else a packed events.jsonl.gz."""
        for name in (EVENTS, PACKED_EVENTS):
            if (path := self.path / name).is_file():
                return path
        return None

    def events(self, kind: str | None = None, **match: Any) -> Iterator[dict[str, Any]]:
        """Recorded events, oldest first; a torn line (a crash mid-write, a disk that filled up before
        the append was cut back) is skipped, and so is a packed log's cut-off end."""
        path = self.events_file()
        if path is None:
            return
        opener = gzip.open if path.name == PACKED_EVENTS else open
        try:
            with opener(path, "rb") as fh:
                for line in fh:
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if kind is not None and record.get("kind") != kind:
                        continue
                    if all(record.get(k) == v for k, v in match.items()):
                        yield record
        except EOFError:  # a packed log cut short: the events before the cut stand
            return
        except gzip.BadGzipFile as exc:
            raise ConfigError([f"{path}: not a gzip file ({exc}): unpack or replace it"]) from None
