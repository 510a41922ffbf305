"""Real recorded runs (tests/fixtures/runs/, rules/2 verdicts) judged again under the current rules: every
probe summary is rebuilt from the run's own events log with the probes' own summarise functions, then the
verdict is built as `kvprobe eval` builds it. Nothing is measured again and nothing is invented."""

from __future__ import annotations

import gzip
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvprobe.config import parse_config
from kvprobe.run.store import RunDir
from kvprobe.verdict.evidence import broken_during_run

RUNS = Path(__file__).parent / "fixtures" / "runs"


def _config(meta: dict[str, Any]) -> Any:
    data = dict(meta["config"])
    data["server"] = [{**s, "headers": {}} for s in data["server"]]  # recorded as header names only
    return parse_config(data)


def _perplexity(ctx: Any) -> dict[str, Any] | None:
    from kvprobe.probes.perplexity import recorded_runs, summarise
    from kvprobe.quality.passages import PassagePlan

    plans = list(ctx.run.events("perplexity_plan"))
    if not plans:
        return None
    plan = plans[-1]
    rows, _ = recorded_runs(ctx, plan["key"])
    names = [s.name for s in ctx.config.servers if (s.name, 1) in rows]
    return summarise(ctx.reference, names, rows, [PassagePlan(**p) for p in plan["passages"]],
                     ctx.config.perplexity, ctx.config.bars.perplexity_delta_max, ctx.broken)


def _agreement(ctx: Any) -> dict[str, Any] | None:
    from kvprobe.probes.agreement import summarise_server
    from kvprobe.quality.divergence import Comparison

    docs: dict[str, dict[int, Comparison]] = defaultdict(dict)
    for e in ctx.run.events("agreement_doc"):
        docs[e["server"]][e["doc"]] = Comparison(e["kl"], [bool(x) for x in e["top1"]], e["diff"])
    if not docs:
        return None
    return {name: summarise_server([got[d] for d in sorted(got)]) | {"reference": ctx.reference,
                                                                      "self": name == ctx.reference}
            for name, got in docs.items()}


def _needle(ctx: Any) -> dict[str, Any] | None:
    from kvprobe.probes.needle import summarise

    plans = [e["plan"] for e in ctx.run.events("needle_case")]
    if not plans:
        return None
    return summarise(ctx, plans[-1], {})


def _tasks(ctx: Any) -> dict[str, Any] | None:
    from kvprobe.probes.tasks import recorded, summarise
    from kvprobe.quality.task_eval import TaskInfo

    plans = {e["task"]: e for e in ctx.run.events("tasks_plan")}
    if not plans:
        return None
    infos, rows = [], {}
    for task, e in plans.items():
        infos.append(TaskInfo(task, e["output_type"], e["metric"], True, e["documents"], e["digest"]))
        for name, got in recorded(ctx, e["key"]).items():
            rows[(name, task)] = got
    names = [s.name for s in ctx.config.servers]
    return summarise(ctx.reference, names, infos, rows, ctx.config.tasks, ctx.broken)


def rejudge(name: str, tmp: Path) -> tuple[RunDir, dict[str, Any]]:
    """A copy of recorded run `name` in tmp, its summaries rebuilt from its events, and its new verdict."""
    from kvprobe.verdict.build import build_verdict

    src, dst = RUNS / name, tmp / name
    shutil.copytree(src, dst)
    for path in dst.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    with gzip.open(dst / "events.jsonl.gz", "rb") as packed:
        (dst / "events.jsonl").write_bytes(packed.read())
    run = RunDir.open(dst)
    config = _config(run.read_json("run.json"))
    ctx = SimpleNamespace(run=run, config=config, reference=config.reference.name, broken=broken_during_run(run))
    for probe, build in (("perplexity", _perplexity), ("agreement", _agreement), ("needle", _needle),
                         ("tasks", _tasks)):
        summary = build(ctx)
        if summary is not None:
            run.write_json(f"{probe}.json", summary)
    return run, build_verdict(run)
