"""Needle: does the candidate still find what the reference finds, at every length that fits?

One plan (cases from the seed, placed token-exactly with one tokenizer) goes unchanged to every
active server; servers run side by side, `concurrency` cases in flight on each. Every answer is an
event as it finishes; a rerun into the same directory skips (server, case) pairs already answered
(errors are asked again). Writes needle.json, needle/cases.json (the exact prompts) and heatmaps.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kvprobe.errors import ConfigError, ServerError, Unreadable
from kvprobe.needle.cases import check_templates, filler_words, make_cases
from kvprobe.needle.placement import Filler
from kvprobe.needle.plan import build_cases, cap_misfit, fingerprint, grid, prompt_room
from kvprobe.needle.scoring import score
from kvprobe.needle.summary import paired, server_summary
from kvprobe.needle.tokens import Encoder, ServerEncoder, load_tiktoken
from kvprobe.run.budget import BudgetCost
from kvprobe.run.context import EvalContext
from kvprobe.run.progress import LoggedProgress
from kvprobe.server.client import Generation
from kvprobe.server.fit import tightest, written
from kvprobe.server.untrusted import optional_count

if TYPE_CHECKING:
    from kvprobe.config import Config
    from kvprobe.run.budget import Speed

EVENT = "needle_case"
# Measured on the demo trio (needle-llama): a needle answer is ~60 decoded tokens.
NEEDLE_ANSWER_TOKENS = 64
CASES_FILE = "needle/cases.json"
# needle.json lists these per case (the identifying fields first, then what a reader needs to judge it).
CASE_FIELDS = ("id", "length_tokens", "depth_tokens", "server", "status", "found_in",
               "target_length", "target_depth", "template", "value", "approximate", "finish_reason",
               "completion_tokens", "error")


def _progress(ctx: EvalContext) -> LoggedProgress:
    return LoggedProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=ctx.console, transient=False, unit="needles")


def _encoders(ctx: EvalContext, names: list[str]) -> list[Encoder]:
    """Servers' own tokenizers, reference first; tiktoken only when none has /tokenize."""
    encoders: list[Encoder] = [ServerEncoder(ctx.clients[n]) for n in names if ctx.inventories[n].has_tokenize]
    return encoders or [load_tiktoken(ctx.config.needle.tiktoken_encoding)]


async def _plan(ctx: EvalContext, names: list[str]) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    settings = ctx.config.needle
    check_templates(settings.templates)
    room = prompt_room(settings, {n: ctx.inventories[n].max_model_len for n in names})
    encoders = _encoders(ctx, names)
    lengths, depths = grid(settings, room, encoders[0].approximate)
    model = ctx.inventories[names[0]].model_root
    plan_id = fingerprint(settings, lengths, depths, encoders[0].name, model)
    if ctx.run.has(CASES_FILE):
        saved = ctx.run.read_json(CASES_FILE)
        if saved.get("plan") == plan_id:
            return plan_id, saved["cases"], saved["meta"]
    specs = make_cases(settings, lengths, depths)
    filler = Filler(filler_words())
    cases, used = None, encoders[0]
    for used in encoders:
        try:
            with _progress(ctx) as bar:
                task = bar.add_task(f"needle: placing {len(specs)} cases with {used.name}", total=len(specs))
                cases = await build_cases(specs, used, filler, on_done=lambda t=task: bar.advance(t))
            break
        except ServerError as exc:
            if exc.status is not None and exc.status < 500:
                raise
            ctx.mark_broken(used.name, str(exc))  # its tokenizer died: try the next server's
    if cases is None:
        raise ServerError("needle", "every server with /tokenize failed while placing the needles")
    not_exact = [c["id"] for c in cases if not c["exact"]]
    if not_exact:
        ctx.console.print(f"[yellow]needle:[/yellow] {len(not_exact)} case(s) could not be placed at exactly "
                          f"their target length: {', '.join(not_exact)} (achieved lengths recorded)")
    meta = {"lengths": lengths, "depths": depths, "tokenizer": used.name, "approximate": used.approximate,
            "model": model, "room": room}
    ctx.run.write_json(CASES_FILE, {"plan": plan_id, "meta": meta, "cases": cases})
    return plan_id, cases, meta


def _record(ctx: EvalContext, server: str, plan_id: str, case: dict[str, Any], gen: Generation,
            max_tokens: int) -> dict[str, Any]:
    status, where = score(gen, case["value"])
    counts: dict[str, int | None] = {}
    for key, instead in (("prompt_tokens", "the planned prompt length is recorded instead"),
                         ("completion_tokens", "left out")):
        try:
            counts[key] = optional_count(gen.usage, key, f"{server}: usage")
        except Unreadable as exc:
            counts[key] = None
            ctx.warn(f"{exc}: {instead}")
    prompt_tokens = counts["prompt_tokens"]
    return ctx.run.event(
        EVENT, server=server, plan=plan_id, id=case["id"], status=status, found_in=where,
        # the server's own count of what it was sent, when it says; else the planned count
        length_tokens=prompt_tokens if prompt_tokens is not None else case["length_tokens"],
        approximate=case["approximate"],  # placed with an estimate, not a server tokenizer
        planned_length_tokens=case["length_tokens"], depth_tokens=case["depth_tokens"],
        target_length=case["target_length"], target_depth=case["target_depth"], template=case["template"],
        value=case["value"], finish_reason=gen.finish_reason, prompt_tokens=prompt_tokens,
        completion_tokens=counts["completion_tokens"], max_tokens=max_tokens, seconds=round(gen.e2e, 3),
        reasoning=gen.reasoning, content=gen.content, error=gen.error, http_status=gen.status,
    )


async def _ask_server(ctx: EvalContext, name: str, plan_id: str, cases: list[dict[str, Any]],
                      bar: LoggedProgress, task: Any) -> None:
    settings = ctx.config.needle
    client = ctx.clients[name]
    gate = asyncio.Semaphore(settings.concurrency)
    hits = 0

    async def one(case: dict[str, Any]) -> None:
        nonlocal hits
        async with gate:
            if not ctx.measuring(name):
                return
            body = {"messages": [{"role": "user", "content": case["content"]}],
                    "max_tokens": settings.max_tokens, "temperature": 0}
            gen = await (client.stream_chat(body) if settings.stream else client.chat(body))
        record = _record(ctx, name, plan_id, case, gen, settings.max_tokens)
        if record["status"] == "error" and (gen.status is None or gen.status >= 500):
            ctx.mark_broken(name, gen.error or "request failed")
        hits += record["status"] == "hit"
        bar.update(task, advance=1, description=f"needle: {name} ({hits} hit)")

    await asyncio.gather(*(one(c) for c in cases))


def _latest(ctx: EvalContext, plan_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for event in ctx.run.events(EVENT, plan=plan_id):
        latest[(event["server"], event["id"])] = event
    return latest


def summarise(ctx: EvalContext, plan_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """needle.json from the events log (this session's answers and a resumed run's earlier ones)."""
    latest = _latest(ctx, plan_id)
    order = [s.name for s in ctx.config.servers]
    cases = sorted(latest.values(), key=lambda e: (order.index(e["server"]) if e["server"] in order else len(order),
                                                    e["id"]))
    by_server: dict[str, dict[str, dict[str, Any]]] = {}
    for case in cases:
        by_server.setdefault(case["server"], {})[case["id"]] = case
    ref = ctx.reference
    settings = ctx.config.needle
    out: dict[str, Any] = {
        "reference": ref,
        "servers": {name: server_summary(rows.values()) for name, rows in by_server.items()},
        "cases": [{k: c.get(k) for k in CASE_FIELDS} for c in cases],
        "paired": {name: paired(by_server[ref], rows) for name, rows in by_server.items()
                   if name != ref and ref in by_server},
        "plan": plan_id,
        "settings": {**settings.model_dump(mode="json"), **meta},
        "heatmaps": {},
    }
    return out


def draw_heatmaps(ctx: EvalContext, out: dict[str, Any]) -> None:
    """needle.json's "heatmaps" (title -> file): one per server by status, one per candidate against the
    reference, drawn by the run's reporter."""
    ref = out["reference"]
    for name in out["servers"]:
        path = ctx.reporter.draw("needle_status", (out["cases"], name),
                                 ctx.run.path / "needle" / f"heatmap-{name}.png")
        if path is not None:
            out["heatmaps"][name] = str(path.relative_to(ctx.run.path))
    for name in out["paired"]:
        path = ctx.reporter.draw("needle_paired", (out["cases"], ref, name),
                                 ctx.run.path / "needle" / f"paired-{name}.png")
        if path is not None:
            out["heatmaps"][f"{name} vs {ref}"] = str(path.relative_to(ctx.run.path))


def cannot_run(ctx: EvalContext) -> str | None:
    """Why the needle probe cannot run on these servers at kvprobe's default settings; None when it
    fits. A cap or lengths the operator wrote that do not fit raise ConfigError (exit 2) instead: the
    same prompt_room the probe plans with, asked before any probe measures anything."""
    settings = ctx.config.needle
    contexts = {n: ctx.inventories[n].max_model_len for n in ctx.active()}
    if tightest(contexts) is None and not settings.lengths:
        return ("no server reports its max_model_len (/v1/models), so the default lengths cannot be sized; "
                "set [needle] lengths to measure it")
    misfit = cap_misfit(settings, contexts)
    if misfit is not None and not written(settings, "max_tokens"):
        return misfit.reason()
    prompt_room(settings, contexts)
    return None


def budget_cost(config: Config, servers: int, speed: Speed, max_model_len: int) -> BudgetCost:
    """A needle prompt of the mean length that fits (min_length up to max_model_len less the answer cap)
    and its answer on every server, `concurrency` at a time; --budget grows the needles up to [needle]
    count, from two."""
    settings = config.needle
    length = (settings.min_length + max_model_len - settings.max_tokens) / 2
    answer_s = NEEDLE_ANSWER_TOKENS * speed.s_per_decoded_token
    return BudgetCost(servers * (length / speed.prompt_tokens_per_s + answer_s) / settings.concurrency, least=2,
                      most=settings.count,
                      resize=lambda n: ({"needle": settings.model_copy(update={"count": n})}, {"needles": n}))


async def run(ctx: EvalContext) -> dict[str, Any]:
    names = ctx.active()
    if ctx.reference not in names:
        raise ConfigError([f"needle: the reference {ctx.reference!r} is not serving: nothing to compare against"])
    plan_id, cases, meta = await _plan(ctx, names)
    names = ctx.active()  # placement may have found a server broken
    done = {key for key, e in _latest(ctx, plan_id).items() if e["status"] != "error"}
    with _progress(ctx) as bar:
        jobs = []
        for name in names:
            todo = [c for c in cases if (name, c["id"]) not in done]
            task = bar.add_task(f"needle: {name}", total=len(cases), completed=len(cases) - len(todo))
            jobs.append(_ask_server(ctx, name, plan_id, todo, bar, task))
        await asyncio.gather(*jobs)
    summary = summarise(ctx, plan_id, meta)
    draw_heatmaps(ctx, summary)
    ctx.run.write_json("needle.json", summary)
    ctx.reporter.probe_done("needle", summary, list(summary["servers"]))
    return summary

