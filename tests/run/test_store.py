from __future__ import annotations

import gzip
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


def _packed(tmp_path: Path, lines: bytes) -> RunDir:
    """A run directory whose log is kept gzip'ed, as the recorded runs in tests/fixtures/runs are."""
    run = RunDir.create(tmp_path / "r")
    (run.path / "events.jsonl.gz").write_bytes(gzip.compress(lines))
    return run


def test_a_packed_events_log_is_read(tmp_path: Path) -> None:
    run = _packed(tmp_path, b'{"kind":"a","n":1}\n{"kind":"b","n":2}\n{"kind":"a","n":3,"tor')
    assert [e["n"] for e in run.events("a")] == [1]  # the torn tail is skipped, as in events.jsonl
    assert run.events_file() == run.path / "events.jsonl.gz"


def test_a_packed_log_cut_short_keeps_the_events_before_the_cut(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(b'{"kind":"a","n":%d}\n' % i for i in range(2000)))
    run = RunDir.create(tmp_path / "r")
    (run.path / "events.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    got = [e["n"] for e in run.events("a")]
    assert 0 < len(got) < 2000 and got == list(range(len(got)))


def test_the_live_log_wins_over_a_packed_one(tmp_path: Path) -> None:
    run = _packed(tmp_path, b'{"kind":"a","n":1}\n')
    (run.path / "events.jsonl").write_bytes(b'{"kind":"a","n":2}\n')
    assert [e["n"] for e in run.events("a")] == [2]


def test_a_packed_run_is_not_appended_to(tmp_path: Path) -> None:
    """An events.jsonl started beside the packed log would hide every packed event from the readers."""
    run = _packed(tmp_path, b'{"kind":"a","n":1}\n')
    with pytest.raises(ConfigError, match=r"events.jsonl.gz: this run's events are packed; unpack them \(gunzip "):
        run.event("a", n=2)
    assert not (run.path / "events.jsonl").exists()


def test_a_packed_log_that_is_not_gzip_is_one_line(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r")
    (run.path / "events.jsonl.gz").write_bytes(b'{"kind":"a"}\n')
    with pytest.raises(ConfigError, match=r"events.jsonl.gz: not a gzip file .*: unpack or replace it"):
        list(run.events())
