from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe.errors import ConfigError
from kvprobe.run.store import RunDir, dumps


def test_create_names_run_by_utc_time(tmp_path: Path) -> None:
    run = RunDir.create(root=tmp_path)
    assert run.path.parent == tmp_path and run.path.name[:8].isdigit() and (run.path / "inventory").is_dir()


def test_events_are_on_disk_as_soon_as_written_and_torn_lines_skipped(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r")
    run.event("needle_case", server="a", id=1, status="hit")
    assert b'"status":"hit"' in (run.path / "events.jsonl").read_bytes()  # no close/flush needed
    run.event("needle_case", server="b", id=1, status="miss")
    with open(run.path / "events.jsonl", "ab") as fh:
        fh.write(b'{"kind":"needle_case","server":"a","id":2,"sta')  # crash mid-write
    assert [e["server"] for e in run.events("needle_case")] == ["a", "b"]
    assert [e["id"] for e in run.events("needle_case", server="b")] == [1]


def test_json_is_deterministic_and_atomic(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r")
    run.write_json("x.json", {"b": 1, "a": [1.5, None]})
    assert (run.path / "x.json").read_bytes() == dumps({"a": [1.5, None], "b": 1})
    assert not list(run.path.glob(".*.tmp"))
    assert run.read_json("x.json") == {"a": [1.5, None], "b": 1}


def test_open_requires_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        RunDir.open(tmp_path)


def test_event_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r")
    run.event("a", n=1)
    with open(run.path / "events.jsonl", "ab") as fh:
        fh.write(b'{"kind":"a","n":2,"tor')  # crash mid-write
    run.event("a", n=3)  # the rerun appends
    assert [e["n"] for e in run.events("a")] == [1, 3]
