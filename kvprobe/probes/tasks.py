"""Tasks: does the candidate still answer what the reference answers, on lm-eval tasks?

Each task in [tasks] names runs through lm-eval on every active server side by side, with identical
requests (kvprobe.quality.task_eval). Every document's score is an event as soon as its server's
run ends; a rerun into the same directory skips each (server, task) whose run is recorded with the
same settings and documents. tasks.json keeps every document's score and whether the cap cut it;
the checks (kvprobe.verdict.checks.answers) pair them with the reference's against `task_accuracy_drop_max`
and `truncation_rise_max`.

Events: tasks_plan (each task's kind, metric and documents), tasks_sample (one row per server,
task and document), tasks_run (a finished lm-eval run). Writes tasks.json.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kvprobe.corpus import TASKS_DIR
from kvprobe.disk import json_digest
from kvprobe.errors import ConfigError
from kvprobe.probes.perplexity import broken_or_raise, ordered_active, targets_for
from kvprobe.quality import lmeval
from kvprobe.quality.task_eval import SampleRow, TaskInfo, evaluate_task, load_task
from kvprobe.quality.task_stats import accuracy
from kvprobe.run.context import EvalContext
from kvprobe.run.progress import LoggedProgress
from kvprobe.server.fit import CapMisfit, cap_misfit, written


def settings_key(info: TaskInfo, limit: int | None, max_gen_toks: int, max_length: int) -> str:
    return json_digest({"task": info.name, "metric": info.metric, "documents": info.digest, "limit": limit,
                        "max_gen_toks": max_gen_toks, "max_length": max_length}, 12)


def recorded(ctx: EvalContext, key: str) -> dict[str, list[SampleRow]]:
    """The finished runs of one task under `key`: server -> its rows."""
    done = {e["server"] for e in ctx.run.events("tasks_run", key=key)}
    rows: dict[str, dict[int, SampleRow]] = {name: {} for name in done}
    for e in ctx.run.events("tasks_sample", key=key):
        if e["server"] in done:
            rows[e["server"]][e["doc"]] = SampleRow(e["doc"], e["score"], e["truncated"], e.get("finish_reason"),
                                                    e.get("answer") or "")
    return {name: [got[d] for d in sorted(got)] for name, got in rows.items()}


async def _targets(ctx: EvalContext, names: list[str], infos: list[TaskInfo], max_length: int) -> dict[str, Any]:
    """lm-eval settings per server. Loglikelihood tasks score token ids, so they need the server's
    tokenizer (as perplexity does); a chat task needs none."""
    settings = ctx.config.tasks
    if any(not i.chat for i in infos):
        return await targets_for(ctx, names, max_length, max(2, settings.num_concurrent), probe="tasks")
    servers = {s.name: s for s in ctx.config.servers}
    return {n: lmeval.Target(name=n, url=servers[n].url, model=ctx.inventories[n].model or ctx.clients[n].model or "",
                             max_length=max_length, tokenizer=lmeval.Tokenizer("remote"),
                             num_concurrent=settings.num_concurrent, timeout_s=servers[n].timeout_s,
                             api_key=servers[n].api_key(), headers=dict(servers[n].headers))
            for n in names}


def summarise(ref: str, names: list[str], infos: list[TaskInfo], rows: dict[tuple[str, str], list[SampleRow]],
              settings: Any, broken: dict[str, str]) -> dict[str, Any]:
    """tasks.json: per task and server its own score and, document by document, [doc, score, cut at
    the cap]: the checks (kvprobe.verdict.checks.answers) pair these with the reference's and judge."""
    tasks: dict[str, Any] = {}
    for info in infos:
        servers: dict[str, Any] = {}
        for name in names:
            own = rows.get((name, info.name))
            if own is None:
                servers[name] = {"error": broken.get(name, "not measured")}
                continue
            servers[name] = accuracy(own) | {"rows": [[r.doc, r.score, r.truncated] for r in own]}
        tasks[info.name] = {"output_type": info.output_type, "metric": info.metric,
                            "higher_is_better": info.higher_is_better, "documents": info.documents,
                            "servers": servers}
    return {"reference": ref, "max_gen_toks": settings.max_gen_toks, "limit": settings.limit, "tasks": tasks}


def _cap_misfit(ctx: EvalContext, infos: list[TaskInfo], names: list[str]) -> CapMisfit | None:
    """The answer cap (max_gen_toks) leaves no room for a prompt on the tightest server. Only
    generate_until tasks generate; vLLM refuses a max_tokens over max_model_len outright."""
    if not any(i.chat for i in infos):
        return None
    contexts = {n: ctx.inventories[n].max_model_len for n in names}
    return cap_misfit("tasks", "max_gen_toks", ctx.config.tasks.max_gen_toks, contexts)


def cannot_run(ctx: EvalContext) -> str | None:
    """Why the tasks probe cannot run on these servers at kvprobe's default answer cap; None when it
    fits. A max_gen_toks the operator wrote that does not fit raises ConfigError (exit 2) instead."""
    misfit = _cap_misfit(ctx, preflight(ctx.config), ctx.active())
    if misfit is None:
        return None
    if written(ctx.config.tasks, "max_gen_toks"):
        raise ConfigError([misfit.error()])
    return misfit.reason()


async def run(ctx: EvalContext) -> dict[str, Any]:
    settings = ctx.config.tasks
    ref = ctx.reference
    names = ordered_active(ctx)
    if ref not in names:
        summary = {"reference": ref, "tasks": {}, "error": f"reference {ref} is not serving"}
        ctx.run.write_json("tasks.json", summary)
        return summary
    tasks_dir = folder(settings)
    infos = await asyncio.to_thread(preflight, ctx.config)
    if misfit := _cap_misfit(ctx, infos, names):  # the fit phase stops this first; a direct call too
        raise ConfigError([misfit.error()])
    max_length = min(ctx.inventories[n].max_model_len or 0 for n in names) or 0
    targets = await _targets(ctx, names, infos, max_length)
    keys = {i.name: settings_key(i, settings.limit, settings.max_gen_toks, max_length) for i in infos}
    rows: dict[tuple[str, str], list[SampleRow]] = {}
    for info in infos:
        key = keys[info.name]
        if not any(True for _ in ctx.run.events("tasks_plan", key=key)):
            ctx.run.event("tasks_plan", key=key, task=info.name, output_type=info.output_type, metric=info.metric,
                          documents=info.documents, digest=info.digest, max_gen_toks=settings.max_gen_toks)
        for name, got in recorded(ctx, key).items():
            if name in names:
                rows[(name, info.name)] = got

    progress = LoggedProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("answers"), TimeElapsedColumn(), console=ctx.console, transient=False,
                              unit="answers")

    async def server_job(name: str) -> None:
        for info in infos:
            label = f"tasks {info.name} {name}"
            if (name, info.name) in rows:
                progress.add_task(f"{label} [dim](recorded)[/dim]", total=info.documents, completed=info.documents)
                continue
            if not ctx.measuring(name) or name not in targets:
                return
            bar = progress.add_task(label, total=info.documents)
            try:
                got, seconds = await asyncio.to_thread(
                    evaluate_task, targets[name], info, settings.limit, settings.max_gen_toks, tasks_dir,
                    settings.registry, lambda bar=bar: progress.advance(bar))
            except Exception as exc:
                broken_or_raise(ctx, name, f"tasks {info.name}", exc)
                return
            progress.update(bar, completed=info.documents)
            key = keys[info.name]
            for row in got:
                ctx.run.event("tasks_sample", server=name, task=info.name, key=key, doc=row.doc, score=row.score,
                              truncated=row.truncated, finish_reason=row.finish_reason, answer=row.answer)
            own = accuracy(got)
            ctx.run.event("tasks_run", server=name, task=info.name, key=key, seconds=seconds, **own)
            rows[(name, info.name)] = got

    with lmeval.quiet(), progress:
        await asyncio.gather(*(server_job(n) for n in names))

    summary = summarise(ref, names, infos, rows, settings, ctx.broken)
    summary["tasks_dir"] = str(tasks_dir)
    ctx.run.write_json("tasks.json", summary)
    ctx.reporter.probe_done("tasks", summary, names)
    return summary


def preflight(config: Any) -> list[TaskInfo]:
    """Each task loads, with local data and a metric kvprobe can pair: one line and exit 2 otherwise,
    before any server is asked anything."""
    settings = config.tasks
    return [load_task(t, folder(settings), settings.registry, settings.metric.get(t), settings.limit)
            for t in settings.names]


def folder(settings: Any) -> Path:
    """The task folder: the operator's include_path, else the shipped tasks/."""
    return Path(settings.include_path) if settings.include_path else TASKS_DIR
