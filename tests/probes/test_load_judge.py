"""The load probe stops on the judge the pipeline hands it (EvalContext.judge), never on an import of
the verdict: the orchestrator hands it the verdict's own checks, and a context without one fails the
probe before it sends a measured request."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from replay import MultiReplay, Replay
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.evaluate import orchestrate
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.context import EvalContext
from kvprobe.run.store import RunDir
from kvprobe.verdict.checks import live_checks

LOAD = {"agents": [1], "turns": 1, "repeats": 1, "system_tokens": 64, "tokens_per_turn": 32,
        "metrics_interval_s": 0.05, "warmup": False, "settle_s": 0}
CONFIG = parse_config({"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                                  {"name": "fp8", "url": "http://127.0.0.1:8102"}], "load": LOAD})


def _trio() -> tuple[MultiReplay, list[Replay]]:
    servers = [Replay("auto-8101"), Replay("fp8-8102")]
    return MultiReplay({"127.0.0.1:8101": servers[0], "127.0.0.1:8102": servers[1]}), servers


async def test_the_pipeline_hands_the_load_probe_the_verdicts_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    multi, _ = _trio()
    outcome = await run_eval(CONFIG, RunDir.create(tmp_path / "run"), ["load"], Console(file=io.StringIO()),
                             transport=multi.transport())
    assert outcome.ctx.judge is live_checks and outcome.ctx.run.has("load.json")

    asked: list[tuple[str, tuple[str, ...]]] = []

    def spy(probe: str, summary: dict[str, Any], reference: str, candidates: list[str],
            bars: Any) -> dict[str, list[dict[str, Any]]]:
        asked.append((probe, tuple(candidates)))
        return live_checks(probe, summary, reference, candidates, bars)

    monkeypatch.setattr(orchestrate, "live_checks", spy)
    await run_eval(CONFIG, RunDir.create(tmp_path / "spied"), ["load"], Console(file=io.StringIO()),
                   transport=multi.transport())
    assert asked and set(asked) == {("load", ("auto", "fp8"))}


async def test_a_context_without_a_judge_fails_the_load_probe_before_any_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    multi, servers = _trio()
    def unjudged(*args: Any, **kw: Any) -> EvalContext:
        return EvalContext(*args, **{**kw, "judge": None})

    monkeypatch.setattr(orchestrate, "EvalContext", unjudged)
    run = RunDir.create(tmp_path / "run")
    with pytest.raises(RuntimeError, match="the run context has no judge"):
        await run_eval(CONFIG, run, ["load"], Console(file=io.StringIO()), transport=multi.transport())
    assert not list(run.events("load_case"))
    assert not any(call == ("POST", "/v1/chat/completions") for s in servers for call in s.calls)
