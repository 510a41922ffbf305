"""EvalContext: which server's next answer can still count, and when every candidate broke."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.run.context import EvalContext
from kvprobe.run.store import RunDir

CONFIG = parse_config({"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                                  {"name": "fp8", "url": "http://127.0.0.1:8102"},
                                  {"name": "int8", "url": "http://127.0.0.1:8103"}]})


def _context(tmp_path: Path, serving: tuple[str, ...] = ("auto", "fp8", "int8")) -> EvalContext:
    inventories = {s.name: SimpleNamespace(serving=s.name in serving) for s in CONFIG.servers}
    pin = SimpleNamespace(candidate_valid=lambda name: True)
    return EvalContext(CONFIG, RunDir.create(tmp_path / "run"), {}, inventories, pin,  # type: ignore[arg-type]
                       Console(file=io.StringIO()))


def test_every_candidate_broke_once_the_last_one_does(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    assert all(ctx.measuring(n) for n in ("auto", "fp8", "int8")) and not ctx.every_candidate_broke()
    ctx.mark_broken("fp8", "HTTP 500")
    assert ctx.measuring("auto") and ctx.measuring("int8") and not ctx.measuring("fp8")
    assert not ctx.every_candidate_broke()
    ctx.mark_broken("int8", "HTTP 500")
    # the reference finishes the probe it is in (its figures stand); the orchestrator runs no probe after it
    assert ctx.every_candidate_broke() and ctx.measuring("auto")


def test_the_reference_stopping_stops_every_candidate(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    ctx.mark_broken("auto", "HTTP 500")
    assert not any(ctx.measuring(n) for n in ("auto", "fp8", "int8")) and not ctx.every_candidate_broke()


def test_a_candidate_that_never_served_is_not_one_that_broke(tmp_path: Path) -> None:
    # settled before the probes, with its own word: the reference is still measured for the candidate left
    ctx = _context(tmp_path, serving=("auto", "fp8"))
    assert not ctx.every_candidate_broke()
    ctx.mark_broken("fp8", "HTTP 500")
    assert ctx.every_candidate_broke()
