"""Load: at the concurrency the operator plans for, is the candidate as fast as the reference, at the
tail too?

Units are (server, shape, agents, repeat). They run one at a time (servers on one box share cores,
so two cases at once would measure each other), reference and candidates interleaved and their
order flipped every other case, so slow drift of the box hits every server alike. Each unit:
reset the prefix cache where the server allows it, sample /metrics during the case, append every
request to the events log, then a `load_case` event; a rerun into the same directory skips the
units that have one. A server that dies mid-case is marked broken and keeps its finished units.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

from kvprobe.config import Config, LoadSettings
from kvprobe.disk import json_digest, mkdir
from kvprobe.errors import ConfigError, DiskError, KvprobeError, Unreachable
from kvprobe.load import spec_decode
from kvprobe.load.generator import CaseOutcome, CaseRunner
from kvprobe.load.processes import START_DELAY_S, ShardJob, Workers, merge_client, processes_for, read_rows
from kvprobe.load.sampler import MetricsSampler
from kvprobe.load.settle import on_shared_cpus, quiet
from kvprobe.load.sizing import PILOT_BLOCKS, CasePlan, describe, pilot_figures
from kvprobe.load.sizing import plan as plan_cases
from kvprobe.load.stats import combine_repeats, summarize_run
from kvprobe.load.workload import (
    DEFAULT_CHARS_PER_TOKEN,
    Shape,
    TextSource,
    case_nonce,
    measure_chars_per_token,
    shapes_of,
)
from kvprobe.run.budget import RESERVE_S, BudgetCost, LoadPace, Speed
from kvprobe.run.context import EvalContext
from kvprobe.run.progress import LoggedProgress
from kvprobe.server.fit import tightest, written
from kvprobe.stats.client_limit import limited
from kvprobe.stats.sequential import of_settings, williams

# What the speed design declares before the run (recorded in load.json and the verdict's evidence).
DESIGN_FIELDS = ("endpoint", "latency_endpoint", "max_blocks", "look_every", "repeats", "budget_s", "advisory")

# Headroom for the chat template around the messages, in tokens.
TEMPLATE_TOKENS = 64
SLACK = 1.02
# What sizes a shape's prompts: an operator who wrote one of these (or [[load.shapes]]) chose the shape.
SHAPE_FIELDS = ("system_tokens", "turns", "tokens_per_turn", "max_output_tokens")
RESET_REFUSED = ("not offered: vLLM serves /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1; each case's "
                 "prompts start with a fresh nonce instead, so they are uncached anyway")


def settings_digest(load: LoadSettings) -> str:
    """What decides a unit's measurement; units recorded under another digest are not reused."""
    data = load.model_dump(mode="json")
    # how we look and when we stop, not what a unit measures
    for key in ("metrics_interval_s", "warmup", "settle_s", "processes", "advisory", "budget_s", "max_blocks",
                "look_every", "endpoint", "latency_endpoint"):
        data.pop(key, None)
    return json_digest(data, 12)


def shape_need(shape: Shape) -> int:
    """Tokens the shape's last turn needs: its prompt, the reply and the chat template."""
    # 2% slack: slices are sized by the densest tokenization measured, which other text may exceed
    return int(shape.max_prompt_tokens() * SLACK) + shape.max_output_tokens + TEMPLATE_TOKENS


def _misfits(ctx: EvalContext, shapes: list[Shape],
             servers: list[str]) -> tuple[tuple[str, int] | None, list[tuple[Shape, int]]]:
    """The tightest server (name, max_model_len), and each shape whose last turn is over its context,
    with the tokens it needs; no misfit when no server reports max_model_len."""
    tight = tightest({s: ctx.inventories[s].max_model_len for s in servers})
    if tight is None:
        return None, []
    return tight, [(shape, need) for shape in shapes if (need := shape_need(shape)) > tight[1]]


def _check_fits(ctx: EvalContext, shapes: list[Shape], servers: list[str]) -> None:
    tight, over = _misfits(ctx, shapes, servers)
    if tight is None or not over:
        return
    limit = tight[1]
    raise ConfigError([f"servers.toml: load: shape {shape.name!r}: the last turn needs about {need} tokens "
                       f"(system {shape.system_tokens} + {shape.turns} turns x {shape.tokens_per_turn} "
                       f"+ replies), over max_model_len {limit}: lower turns, tokens_per_turn or system_tokens"
                       for shape, need in over])


def cannot_run(ctx: EvalContext) -> str | None:
    """Why the load probe cannot run on these servers at kvprobe's default shape; None when it fits.
    A shape the operator sized ([[load.shapes]], or a SHAPE_FIELDS value in [load]) that does not fit
    raises ConfigError (exit 2) instead, as the probe itself would, but before any probe measures anything."""
    settings = ctx.config.load
    shapes, servers = shapes_of(settings), ctx.active()
    tight, over = _misfits(ctx, shapes, servers)
    if tight is None or not over:
        return None
    if settings.shapes or written(settings, *SHAPE_FIELDS):
        _check_fits(ctx, shapes, servers)  # raises: the operator's shape, theirs to fix
    (shape, need), = over  # kvprobe's default is one shape
    server, limit = tight
    room = int((limit - shape.max_output_tokens - TEMPLATE_TOKENS) / SLACK)
    hint = f" (a last turn of up to about {room:,} prompt tokens fits)" if room > 0 else ""
    return (f"its default shape needs about {need:,} tokens for the last turn (system {shape.system_tokens} + "
            f"{shape.turns} turns x {shape.tokens_per_turn} + replies), over max_model_len {limit} of server "
            f"{server!r}; set [load] system_tokens, turns and tokens_per_turn{hint} to measure it")


async def _load_setup(ctx: EvalContext, digest: str) -> tuple[float, str]:
    """Characters per token (measured on the reference's tokenizer) and the run's nonce: set once per
    run and recorded, so a resumed run builds the same prompts."""
    for event in ctx.run.events("load_setup", digest=digest):
        return float(event["chars_per_token"]), str(event["run_nonce"])
    ref = ctx.reference
    cpt = DEFAULT_CHARS_PER_TOKEN
    if ctx.inventories[ref].has_tokenize:
        cpt = await measure_chars_per_token(ctx.clients[ref])
    run_nonce = secrets.token_hex(4)
    ctx.run.event("load_setup", digest=digest, chars_per_token=cpt, run_nonce=run_nonce)
    return cpt, run_nonce


def _cases(shapes: list[Shape]) -> list[tuple[Shape, int]]:
    return [(shape, agents) for shape in shapes for agents in shape.agents]


def _order(servers: list[str], block: int) -> list[str]:
    """The servers' order in a block: a Williams design (every server in every position, and after every
    other, equally often), so position effects and drift hit every server alike. With three servers or
    more each Williams row runs twice, the second time reversed: every pair's order then flips block by
    block, balanced at every even block count (a look), where the 6-row cycle alone ran a candidate before
    the reference in 3 of the first 4 blocks."""
    rows = williams(len(servers))
    if len(servers) < 3:
        return [servers[i] for i in rows[block % len(rows)]]
    row = rows[(block // 2) % len(rows)]
    return [servers[i] for i in (row if block % 2 == 0 else reversed(row))]


def _rotated(cases: list[tuple[Shape, int]], block: int) -> list[tuple[Shape, int]]:
    k = block % len(cases)
    return cases[k:] + cases[:k]


@dataclass
class Spent:
    """What this session of the probe measured and which servers it warmed (a resumed run starts anew)."""

    measured_s: float = 0.0  # case time: first request sent to last finished, summed over the cases run
    warmed: set[str] = field(default_factory=set)


class _Writer:
    """Appends rows to the events log off the event loop: an fsync on the loop would stall every
    other stream's timestamps."""

    def __init__(self, ctx: EvalContext):
        self.ctx = ctx
        self.pending: list[asyncio.Future[Any]] = []

    def event(self, kind: str, **fields: Any) -> None:
        loop = asyncio.get_running_loop()
        self.pending.append(loop.run_in_executor(None, lambda: self.ctx.run.event(kind, **fields)))

    async def flush(self) -> None:
        pending, self.pending = self.pending, []
        # Every outcome retrieved (a full disk fails them all), the first failure raised.
        for outcome in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome


async def _reset_prefix_cache(ctx: EvalContext, name: str, notes: dict[str, str]) -> bool:
    """False when the server is gone (then it is marked broken)."""
    try:
        done = await ctx.clients[name].reset_prefix_cache()
    except Unreachable as exc:
        ctx.mark_broken(name, str(exc))
        return False
    except KvprobeError as exc:
        notes[name] = f"refused: {exc}"
        return True
    if not done and name not in notes:
        ctx.console.print(f"[yellow]note:[/yellow] {name}: prefix cache reset {RESET_REFUSED}", highlight=False)
    notes[name] = "reset before every case" if done else RESET_REFUSED
    return True


async def _warm_up(ctx: EvalContext, name: str, shape: Shape, digest: str, run_nonce: str, source: TextSource,
                   progress: LoggedProgress, task: Any, workers: Workers | None) -> None:
    """One unrecorded case at the shape's largest agent count (prompts of their own nonce, so the
    measured ones stay uncached): a cold server's first batches are several times slower."""
    agents = max(shape.agents)
    warm_shape = replace(shape, max_output_tokens=min(shape.max_output_tokens, 16))
    nonce = case_nonce(run_nonce, f"warmup/{shape.name}", agents, -1)
    progress.update(task, description=f"{name} · {shape.name} · warm-up ({agents} agents)")
    # through the workers when the case is sharded: the measured cases then reuse their connections
    outcome, _, _ = await _drive(ctx, workers, name, warm_shape, agents, nonce, source,
                                 {"unit": f"warmup-{secrets.token_hex(6)}"}, record=False)
    errors = sum(1 for r in outcome.rows if r["status"] != "ok")
    ctx.run.event("load_warmup", server=name, shape=shape.name, agents=agents, digest=digest,
                  seconds=round(outcome.duration_s, 3), requests=len(outcome.rows), errors=errors)
    dead = outcome.dead or not_serving(outcome.rows, "the warm-up")
    if dead:
        ctx.mark_broken(name, dead)


def not_serving(rows: list[dict[str, Any]], where: str) -> str | None:
    """Why a server that still answers /health is not serving a case (healthy is not serving), or None.

    Every request failed (a 500 on each, or each cut): its throughput would be 0, a block the speed checks
    cannot pair. Or it answered some with a server error, HTTP 5xx or a 5xx error event in a stream that began
    with 200 (vLLM's way when the engine fails mid-generation): the server's own fault, which the speed checks
    would only see as a few percent of lost throughput, so a candidate erring on 2% of its requests could pass
    a 5% bar. A 4xx (the request's fault), a timeout or a cut stream (possibly the client's) counts as lost
    throughput only, as long as something was served. None when nothing was sent."""
    if not rows:
        return None
    if not any(r["status"] == "ok" for r in rows):
        return (f"every one of its {len(rows)} load requests failed in {where} while /health answered "
                f"(the first: {_why(rows[0])})")
    faults = [r for r in rows if max(r.get("http_status") or 0, r.get("stream_error_code") or 0) >= 500]
    if faults:
        return (f"{len(faults)} of its {len(rows)} load requests in {where} got a server error while /health "
                f"answered (the first: {_why(faults[0])})")
    return None


def _why(row: dict[str, Any]) -> str:
    return row.get("error") or (f"HTTP {row['http_status']}" if row.get("http_status")
                                else "a stream cut before its end" if row["status"] == "incomplete"
                                else row["status"])


async def _drive(ctx: EvalContext, workers: Workers | None, name: str, shape: Shape, agents: int, nonce: str,
                 source: TextSource, ids: dict[str, Any], on_row: Any = None, tick: Any = None,
                 record: bool = True) -> tuple[CaseOutcome, dict[str, Any], int]:
    """One case, in this process (`on_row` per finished request) or sharded over the workers (`tick`
    per finished request; rows merged into the events log when `record`); with the client's figures
    and the process count."""
    settings = ctx.config.load
    shards = processes_for(settings, agents) if workers is not None else 1
    if workers is not None and shards > 1:
        outcome, client = await _sharded(ctx, workers, name, shape, agents, nonce, source, ids, shards,
                                         tick or (lambda _shard: None), record)
        return outcome, client, shards
    runner = CaseRunner(ctx.clients[name], settings, shape, agents, nonce, source,
                        settings.request_overrides.get(name), on_row)
    return *(await runner.run_measured()), 1


async def _sharded(ctx: EvalContext, workers: Workers, name: str, shape: Shape, agents: int, nonce: str,
                   source: TextSource, ids: dict[str, Any], shards: int, on_progress: Any,
                   record: bool) -> tuple[CaseOutcome, dict[str, Any]]:
    """The case over `shards` worker processes (kvprobe.load.processes): their rows merged into the
    events log in one append, each row with its process number (`record`: not for a warm-up)."""
    settings = ctx.config.load
    folder = mkdir(ctx.run.path / "load-shards")
    paths = [folder / f"{ids['unit']}-{k}.jsonl" for k in range(shards)]
    server = next(s for s in ctx.config.servers if s.name == name)
    start = time.perf_counter() + START_DELAY_S
    jobs = [ShardJob(server, ctx.clients[name].model, settings, shape, agents, nonce, source.cpt,
                     settings.request_overrides.get(name) or {}, k, shards, start, str(path))
            for k, path in enumerate(paths)]
    results = await workers.run(jobs, on_progress)
    for r in results:
        if r.disk_error:
            raise DiskError(paths[r.shard], OSError(0, r.disk_error))
    rows = [row | {"process": k} for k, path in enumerate(paths) for row in read_rows(path)]
    if record:
        ctx.run.event_many("load_request", [{**ids, **row} for row in rows])
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when empty: another case's files stay
    for problem in sorted({row["unreadable"] for row in rows if row.get("unreadable") and record}):
        ctx.warn(f"{problem}: output tokens counted from the stream")
    outcome = CaseOutcome(rows=rows, t_start=start, dead=next((r.dead for r in results if r.dead), None))
    return outcome, merge_client([r.client for r in results], [len(range(r.shard, agents, shards)) for r in results])


def _on_cpus(ctx: EvalContext) -> bool:
    return on_shared_cpus([inv.platform.device if inv.platform else None
                           for name, inv in ctx.inventories.items() if name in ctx.active()])


async def _run_unit(ctx: EvalContext, name: str, shape: Shape, agents: int, repeat: int, digest: str,
                    run_nonce: str, source: TextSource, notes: dict[str, str], progress: LoggedProgress,
                    task: Any, spent: Spent, workers: Workers | None = None) -> None:
    settings = ctx.config.load
    t0 = time.perf_counter()
    # The reset and the wait for every server to go quiet overlap: nothing is measured meanwhile.
    wait = (asyncio.sleep(settings.settle_s) if _on_cpus(ctx)
            else quiet([ctx.clients[n] for n in ctx.active()], settings.settle_s))
    reset, _ = await asyncio.gather(_reset_prefix_cache(ctx, name, notes), wait)
    if not reset:
        return
    nonce = case_nonce(run_nonce, shape.name, agents, repeat)
    unit = secrets.token_hex(6)
    ids = {"server": name, "shape": shape.name, "agents": agents, "repeat": repeat, "unit": unit, "digest": digest}
    writer = _Writer(ctx)
    done = {"n": 0}
    label = f"{name} · {shape.name} · {agents} agent{'s' if agents > 1 else ''} · block {repeat + 1}"

    def tick(_shard: int = 0) -> None:
        done["n"] += 1
        progress.update(task, description=f"{label} · {done['n']} req")

    def on_row(row: dict[str, Any]) -> None:
        writer.event("load_request", **ids, **row)
        if row.get("unreadable"):
            ctx.warn(f"{row['unreadable']}: output tokens counted from the stream")
        tick()

    progress.update(task, description=label)
    async with MetricsSampler(ctx.clients[name], settings.metrics_interval_s) as sampler:
        outcome, client, shards = await _drive(ctx, workers, name, shape, agents, nonce, source, ids, on_row, tick)
    await writer.flush()
    summary = summarize_run(outcome.rows, outcome.duration_s, settings.slo)
    metrics = sampler.summary()
    record = {**ids, **shape.describe(), "mode": settings.mode, "rate": settings.rate, "nonce": nonce,
              "prefix_cache": notes.get(name), "summary": summary, "metrics": metrics, "client": client,
              "processes": shards, "wall_s": round(time.perf_counter() - t0, 3)}
    where = f"block {repeat + 1} at {agents} agent{'s' if agents > 1 else ''}"
    dead = outcome.dead or not_serving(outcome.rows, where)
    if dead:
        ctx.run.event("load_aborted", **record, error=dead)
        ctx.mark_broken(name, dead)
        return
    ctx.run.event("load_case", **record)
    spent.measured_s += outcome.duration_s
    progress.update(task, advance=1, description=f"{label} · {summary['output_tokens_per_s']:,.0f} tok/s")


def _case_entry(shape_info: dict[str, Any], agents: int, events: list[dict[str, Any]],
                rows: list[dict[str, Any]], ctx: EvalContext) -> dict[str, Any]:
    runs = []
    bars = ctx.config.bars
    for e in sorted(events, key=lambda e: e["repeat"]):
        metrics = {k: v for k, v in e["metrics"].items() if k != "samples"}
        client = e.get("client") or {}
        why = limited(client, e["summary"], bars.p99_latency_rise_max, bars.throughput_drop_max) if client else None
        runs.append({"repeat": e["repeat"], **e["summary"], "kv_usage_max": metrics.get("kv_usage_max"),
                     "preemptions": int((metrics.get("deltas") or {}).get("preemptions", 0)), "metrics": metrics,
                     **spec_decode.flat(metrics.get("spec_decode")),
                     **client, "client_limited": why is not None, "client_limited_why": why})
    settings = ctx.config.load
    reasons = [r["client_limited_why"] for r in runs if r["client_limited_why"]]
    return {"agents": agents, **shape_info, "mode": settings.mode, "rate": settings.rate,
            **combine_repeats(runs, rows, settings.slo), "client_limited": bool(reasons),
            "client_limited_why": reasons[0] if reasons else None}


def build_summary(ctx: EvalContext, digest: str, servers: list[str]) -> dict[str, Any]:
    """load.json from the events log (so a resumed run summarises every finished unit)."""
    cases = list(ctx.run.events("load_case", digest=digest))
    units = {e["unit"] for e in cases}
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ctx.run.events("load_request", digest=digest):
        if row["unit"] in units:
            rows[row["unit"]].append(row)
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in cases:
        grouped[(e["server"], e["shape"], e["agents"])].append(e)
    shape_order = [s.name for s in shapes_of(ctx.config.load)]
    names = list(servers) + sorted({e["server"] for e in cases} - set(servers))
    out: dict[str, Any] = {"reference": ctx.reference, "servers": {},
                           "settings": ctx.config.load.model_dump(mode="json"), "digest": digest}
    for name in names:
        entries = []
        keys = sorted((k for k in grouped if k[0] == name),
                      key=lambda k: (shape_order.index(k[1]) if k[1] in shape_order else 99, k[2]))
        for key in keys:
            events = grouped[key]
            first = events[0]
            shape_info = {k: first[k] for k in ("shape", "turns", "system_tokens", "tokens_per_turn",
                                               "max_output_tokens")}
            case_rows = [r for e in events for r in rows[e["unit"]]]
            entries.append(_case_entry(shape_info, key[2], events, case_rows, ctx))
        prefix = next((e.get("prefix_cache") for e in reversed(cases) if e["server"] == name), None)
        out["servers"][name] = {"cases": entries, "broken": ctx.broken.get(name), "prefix_cache": prefix}
    out["design"] = {k: out["settings"].get(k) for k in DESIGN_FIELDS}
    out["design"]["plan"] = of_settings(ctx.config.load).as_dict()
    sizing = next((e["plan"] for e in ctx.run.events("load_plan", digest=digest)), None)
    if sizing is not None:
        out["sizing"] = sizing
    out["stops"] = {e["server"]: e["why"] for e in ctx.run.events("load_skip")}
    out["stops"] |= {e["server"]: e["why"] for e in ctx.run.events("load_stop", digest=digest)}
    walls = list(ctx.run.events("load_wall"))
    wall = sum(float(e["wall_s"]) for e in walls)
    out["duty_cycle"] = round(sum(float(e["measured_s"]) for e in walls) / wall, 4) if wall > 0 else None
    return out


async def run(ctx: EvalContext) -> dict[str, Any]:
    t_start = time.perf_counter()
    settings = ctx.config.load
    shapes = shapes_of(settings)
    servers = _not_rejected(ctx, ctx.active())
    digest = settings_digest(settings)
    if servers == [ctx.reference]:  # servers.toml always names a candidate: each broke or was rejected
        return _nothing_to_compare(ctx, digest)
    deadline = _blocks_deadline(ctx)
    _check_fits(ctx, shapes, servers)
    for name in settings.request_overrides:
        if name not in ctx.clients:
            ctx.console.print(f"[yellow]warning:[/yellow] load.request_overrides names {name!r}, "
                              f"which is not a server in servers.toml", highlight=False)
    chars_per_token, run_nonce = await _load_setup(ctx, digest)
    source = TextSource(chars_per_token)
    need = max((processes_for(settings, a) for _, a in _cases(shapes)), default=1)
    notes: dict[str, str] = {}
    spent = Spent()
    try:
        async with contextlib.AsyncExitStack() as stack:
            spawn = need > 1 and not _settled(ctx, digest, servers)  # none for a finished run
            workers = await stack.enter_async_context(Workers(need)) if spawn else None
            if workers is not None:
                ctx.console.print(f"load: {need} client worker processes (pids {', '.join(map(str, workers.pids))})",
                                  highlight=False)
            blocks = _Blocks(ctx, shapes, notes, servers, workers, deadline, spent)
            if _sized(ctx, servers, deadline):
                digest, run_nonce = await _pilot_then_plan(ctx, blocks, digest, run_nonce, source)
            await blocks.run(digest, run_nonce, source)
    finally:
        # kept on a Ctrl-C or a dead server too (a full disk keeps its own error): the duty cycle counts
        # every session's time
        with contextlib.suppress(KvprobeError, OSError):
            ctx.run.event("load_wall", wall_s=round(time.perf_counter() - t_start, 3),
                          measured_s=round(spent.measured_s, 3))
    summary = build_summary(ctx, digest, servers)
    ctx.run.write_json("load.json", summary)
    ctx.reporter.probe_done("load", summary, list(summary["servers"]))
    return summary


def _nothing_to_compare(ctx: EvalContext, digest: str) -> dict[str, Any]:
    """Every candidate broke or a quality bar already rejected it: the reference's speed alone would decide
    nothing, and on a slow box its blocks cost the operator minutes (a 2-core AVX2 EPYC's demo: about 80 s
    a block)."""
    ref = ctx.reference
    if not any(e["server"] == ref for e in ctx.run.events("load_skip")):
        why = "nothing to compare: every candidate broke or was already rejected"
        ctx.run.event("load_skip", server=ref, why=why)
        ctx.console.print(f"load: {ref} not measured, {why}", highlight=False)
    summary = build_summary(ctx, digest, [ref])
    ctx.run.write_json("load.json", summary)
    ctx.reporter.probe_done("load", summary, list(summary["servers"]))
    return summary


def _not_rejected(ctx: EvalContext, servers: list[str]) -> list[str]:
    """`servers` less the candidates a probe before this one already failed on a gating bar: the verdict rejects
    them whatever their speed, so the load budget goes to the candidates it can still decide (and a server
    whose KV format wrecks the model is not loaded further). Each one skipped is said and recorded."""
    skipped = {e["server"]: e["why"] for e in ctx.run.events("load_skip")}
    if ctx.judge is not None:
        cands = [s for s in servers if s != ctx.reference and s not in skipped]
        for probe, summary in ctx.results.items():
            if probe in ("load", "verdict") or not isinstance(summary, dict) or not cands:
                continue
            try:
                judged = ctx.judge(probe, summary, ctx.reference, cands, ctx.config.bars)
            except KeyError:  # not a probe the verdict reads
                continue
            for cand, checks in judged.items():
                failed = next((c for c in checks if c.get("outcome") == "fail" and c.get("gating", True)), None)
                if failed is not None and cand not in skipped:
                    why = f"already rejected by {probe}: {failed.get('metric') or failed['id']} fails"
                    skipped[cand] = why
                    ctx.run.event("load_skip", server=cand, why=why)
                    ctx.console.print(f"load: {cand} not measured, {why}", highlight=False)
    return [s for s in servers if s not in skipped]


def _standing(ctx: EvalContext, digest: str, servers: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each candidate's speed checks on the blocks recorded so far: the same checks the verdict runs,
    handed down as ctx.judge."""
    if ctx.judge is None:  # no early stop would silently run every candidate to the design's last block
        raise RuntimeError("load: the run context has no judge: the probe stops its blocks on the verdict's "
                           "speed checks, which the pipeline hands it (EvalContext.judge)")
    summary = build_summary(ctx, digest, servers)
    return ctx.judge("load", summary, ctx.reference, list(summary["servers"]), ctx.config.bars)


def _endpoints(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in checks if c["id"].startswith("load.endpoint.")]


def _is_settled(checks: list[dict[str, Any]]) -> bool:
    """A candidate needs no more blocks: an endpoint failed, or every endpoint passed or used the design."""
    primary = _endpoints(checks)
    if any(c["outcome"] == "fail" for c in primary):
        return True
    return bool(primary) and all(c.get("state") in ("decided", "spent") for c in primary)


def _settled(ctx: EvalContext, digest: str, servers: list[str]) -> bool:
    """Every candidate settled or stopped already (a rerun into a finished run measures nothing)."""
    stopped = {e["server"] for e in ctx.run.events("load_stop", digest=digest)}
    standing = _standing(ctx, digest, servers)
    return all(c in stopped or _is_settled(standing.get(c, [])) for c in servers if c != ctx.reference)


def _stop(ctx: EvalContext, digest: str, name: str, why: str, blocks: int) -> None:
    ctx.run.event("load_stop", digest=digest, server=name, why=why, blocks=blocks)


def _blocks_deadline(ctx: EvalContext) -> float | None:
    """When no further block starts: the canary's deadline less the verdict's reserve, or [load] budget_s
    from now, whichever comes first."""
    budget_s = ctx.config.load.budget_s
    return min((d for d in (ctx.deadline - RESERVE_S if ctx.deadline else None,
                            time.monotonic() + budget_s if budget_s else None) if d),
               default=None)


def _open_candidates(ctx: EvalContext, digest: str, servers: list[str], stopped: set[str],
                     standing: dict[str, list[dict[str, Any]]] | None = None) -> list[str]:
    """The candidates that need another block: not stopped, not broken, not settled on the blocks so far
    (`standing`: their speed checks on those blocks, when the caller has them)."""
    standing = _standing(ctx, digest, servers) if standing is None else standing
    open_ = []
    for cand in (s for s in servers if s != ctx.reference and s not in stopped):
        if cand not in ctx.active():
            continue  # broken: the verdict says so
        if not _is_settled(standing.get(cand, [])):
            open_.append(cand)
    return open_


def _stop_reason(block: int, n_max: int, spare: int, deadline: float | None, block_s: float) -> str | None:
    """Why no further block starts (the design's blocks are run, or one more would overrun the deadline)."""
    if block >= n_max + spare:
        return (f"{block} blocks run, {spare} beyond the design's {n_max} to replace client-limited ones"
                if spare else f"the design's {n_max} blocks run")
    if deadline is not None and time.monotonic() + block_s > deadline:
        return f"the load budget was spent after {block} blocks"
    return None


def _say_looks(standing: dict[str, list[dict[str, Any]]], candidates: list[str], said: set[tuple[str, str, int]],
               progress: LoggedProgress) -> None:
    """Where each of `candidates` (those open before the last block) stands at a planned look it reached, once,
    the look that settled it included. A look is reached at that many usable blocks, not blocks run: with
    client-limited blocks dropped, the standing said at the block count (rules/6's `7 blocks is not a planned
    look: no decision there` at block 8) was never one a decision could be made at."""
    for cand in candidates:
        for check in _endpoints(standing.get(cand, [])):
            look = (check.get("sequential") or {}).get("look") or {}
            key = (cand, check["id"], look.get("n"))
            if look.get("at_look") and key not in said:
                said.add(key)
                progress.console.print(f"  {cand} {check['text']}", highlight=False, soft_wrap=True)


async def _warm_up_first(ctx: EvalContext, order: list[str], block: int, shapes: list[Shape],
                         finished: set[tuple[str, str, int, int]], warmed: set[str],
                         warm: Callable[[str, Shape], Awaitable[None]]) -> None:
    """Before a server's first unit measured in this session, a warm-up on every shape through `warm`. A
    block whose units are all recorded already (a resumed run) measures nothing, so it neither warms the
    server nor counts as its warm-up: the first block with work left does."""
    for name in (n for n in order if n not in warmed and n in ctx.active()):
        if any((name, sh.name, a, block) not in finished for sh, a in _cases(shapes)):
            for shape in shapes:
                await warm(name, shape)
            warmed.add(name)


class _Blocks:
    """Paired blocks until every candidate's endpoint is settled: each block runs every case on the reference
    and each unsettled candidate in a balanced order; the decision is looked at after every block (it can
    only cross a boundary at a planned look). A resumed run walks the same blocks, skipping finished units.
    `run(..., upto=k)` stops after block k (the pilot); the next `run` goes on from there."""

    def __init__(self, ctx: EvalContext, shapes: list[Shape], notes: dict[str, str], servers: list[str],
                 workers: Workers | None, deadline: float | None, spent: Spent) -> None:
        self.ctx, self.shapes, self.notes, self.servers, self.workers = ctx, shapes, notes, servers, workers
        self.deadline, self.spent = deadline, spent
        self.block_s = 0.0

    async def run(self, digest: str, run_nonce: str, source: TextSource, upto: int | None = None) -> None:
        ctx, shapes, servers = self.ctx, self.shapes, self.servers
        settings = ctx.config.load
        design = of_settings(settings)
        ref, cases = ctx.reference, _cases(shapes)
        # Client-limited blocks are re-run, at most this many beyond n_max; a fixed design ([load] repeats)
        # runs exactly its blocks, as declared.
        spare = 0 if settings.repeats is not None else max(2, design.n_max // 4)
        finished = {(e["server"], e["shape"], e["agents"], e["repeat"])
                    for e in ctx.run.events("load_case", digest=digest)}
        stopped = {e["server"] for e in ctx.run.events("load_stop", digest=digest)}
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        block = 0
        said: set[tuple[str, str, int]] = set()
        was_open: list[str] = []
        with LoggedProgress(*columns, console=ctx.console, refresh_per_second=4, unit="cases") as progress:
            tasks = {name: progress.add_task(name, total=(upto or design.n_max) * len(cases)) for name in servers}
            while ref in ctx.active() and (upto is None or block < upto):
                standing = _standing(ctx, digest, servers)
                open_ = _open_candidates(ctx, digest, servers, stopped, standing)
                _say_looks(standing, [c for c in servers if c in was_open or c in open_], said, progress)
                was_open = open_
                if not open_:
                    break
                why = _stop_reason(block, design.n_max, spare, self.deadline, self.block_s)
                if why:
                    for cand in open_:
                        _stop(ctx, digest, cand, why, block)
                    progress.console.print(f"load: {why}; {', '.join(open_)} not settled", highlight=False)
                    break
                t0 = time.monotonic()
                order = _order([ref, *open_], block)
                if settings.warmup:
                    await _warm_up_first(ctx, order, block, shapes, finished, self.spent.warmed,
                                         lambda name, shape: _warm_up(ctx, name, shape, digest, run_nonce, source,
                                                                      progress, tasks[name], self.workers))
                ran = False
                for shape, agents in _rotated(cases, block):
                    for name in order:
                        if name not in ctx.active():
                            continue
                        if (name, shape.name, agents, block) in finished:
                            progress.update(tasks[name], advance=1)
                            continue
                        ran = True
                        await _run_unit(ctx, name, shape, agents, block, digest, run_nonce, source, self.notes,
                                        progress, tasks[name], self.spent, self.workers)
                if ran:  # a block a resumed run had finished says nothing of how long one takes
                    self.block_s = time.monotonic() - t0
                block += 1


def _sized(ctx: EvalContext, servers: list[str], deadline: float | None) -> bool:
    """Whether a pilot plans the blocks: a sequential design with a candidate to compare, and a time to fit
    (a budget or a canary's deadline). Without one the declared design runs as it is: a plan free of a
    time cost would buy power with ever longer cases."""
    settings = ctx.config.load
    if settings.repeats is not None or all(n == ctx.reference for n in servers):
        return False
    return deadline is not None


async def _pilot_then_plan(ctx: EvalContext, blocks: _Blocks, digest: str, run_nonce: str,
                           source: TextSource) -> tuple[str, str]:
    """Run the pilot blocks, choose the case length and design from them (recorded, so a resumed run keeps
    it), and apply it: the digest and nonce of the blocks the plan governs. The pilot runs the first blocks
    at the size the settings give; when the plan keeps that size they are its first blocks, when it
    lengthens the cases the governed blocks have a digest of their own and the pilot does not count
    (kvprobe.load.sizing)."""
    resize = _resizes(ctx.config.load)
    recorded = next(ctx.run.events("load_plan", pilot=digest), None)
    if recorded is None:
        await blocks.run(digest, run_nonce, source, upto=PILOT_BLOCKS)
        if ctx.reference not in ctx.active():
            return digest, run_nonce
        chosen = _plan(ctx, digest, blocks, resize)
        overrides: dict[str, Any] = {"max_blocks": chosen.max_blocks}
        if chosen.duration_s is not None:  # the case runs for its length, not to a request count
            overrides |= {"duration_s": chosen.duration_s, "requests_per_case": None}
        governed = settings_digest(ctx.config.load.model_copy(update=overrides))
        ctx.run.event("load_plan", pilot=digest, digest=governed, overrides=overrides, plan=chosen.as_dict())
        margin = -math.log1p(-ctx.config.bars.throughput_drop_max)
        for line in describe(chosen, margin, ctx.config.bars.throughput_drop_max):
            ctx.console.print(line, highlight=False, soft_wrap=True)
        recorded = {"overrides": overrides}
    ctx.config = ctx.config.model_copy(update={"load": ctx.config.load.model_copy(update=recorded["overrides"])})
    new = settings_digest(ctx.config.load)
    if new == digest:
        return digest, run_nonce
    _, nonce = await _load_setup(ctx, new)  # fresh nonces: the pilot's prompts are not re-sent
    return new, nonce


def _resizes(settings: LoadSettings) -> bool:
    """Whether the pilot may choose the case length: the operator did not size the cases."""
    return not written(settings, "duration_s", "requests_per_case")


def _plan(ctx: EvalContext, digest: str, blocks: _Blocks, resize: bool) -> CasePlan:
    settings = ctx.config.load
    pilot_cases = [e for e in ctx.run.events("load_case", digest=digest) if e["repeat"] < PILOT_BLOCKS]
    units = {e["unit"] for e in pilot_cases}
    turns = [r["e2e"] for r in ctx.run.events("load_request", digest=digest) if r["unit"] in units and r.get("e2e")]
    pilot = pilot_figures(pilot_cases, ctx.reference, [float(e.get("wall_s") or 0.0) for e in pilot_cases], turns)
    stopped = {e["server"] for e in ctx.run.events("load_stop", digest=digest)}
    servers = 1 + len(_open_candidates(ctx, digest, blocks.servers, stopped))
    cases = _cases(blocks.shapes)
    endpoint = settings.endpoint
    scope = len(cases) if endpoint == "sweep" else max(1, sum(1 for _, a in cases if a == endpoint))
    left = blocks.deadline - time.monotonic() if blocks.deadline is not None else None
    return plan_cases(pilot, servers=max(servers, 2), cases=len(cases), scope=scope,
                      margin=-math.log1p(-ctx.config.bars.throughput_drop_max), max_blocks=settings.max_blocks,
                      look_every=settings.look_every, budget_s=left, resize=resize)


def _sized_by_kvprobe(load: LoadSettings, **sizes: Any) -> LoadSettings:
    """`load` with sizes kvprobe chose, kept out of the operator's fields_set: the pilot may still size the
    cases by precision (an operator's own requests_per_case it leaves alone)."""
    return type(load).model_construct(load.model_fields_set, **{**dict(load), **sizes})


def budget_cost(config: Config, servers: int, speed: Speed, max_model_len: int) -> BudgetCost:
    """Requests per case over the blocks to the design's first look on every server, `agents` at a time;
    each request is `turns` turns that prefill the conversation so far and decode an answer. Fixed: each
    block's settle pause and the warm-up. --budget grows the requests per case up to [load]
    requests_per_case (8 when unset); the probe itself starts no block past the deadline."""
    load = config.load
    first_look = of_settings(load).looks[0]
    turn_tokens = load.system_tokens + load.tokens_per_turn * (load.turns + 1) / 2
    per_request = load.turns * (turn_tokens / speed.prompt_tokens_per_s
                                + load.max_output_tokens * speed.s_per_decoded_token)
    return BudgetCost(servers * first_look * per_request / min(load.agents), least=2,
                      most=load.requests_per_case or 8,
                      resize=lambda n: ({"load": _sized_by_kvprobe(load, requests_per_case=n)},
                                        {"requests per case": n, "blocks": f"up to {load.blocks}"}),
                      fixed_s=servers * (first_look * load.settle_s + (per_request if load.warmup else 0)))


def rough_seconds(config: Config, servers: int, pace: LoadPace) -> tuple[float, float]:
    """`kvprobe check`'s rough time, (to the design's first look, to its last), at one assumed pace: the
    whole declared design, where budget_cost prices the blocks to the first look for a --budget."""
    ld = config.load
    warmup, block = block_seconds(config, servers, pace)
    looks = of_settings(ld).looks  # the design declared now: rules/5's first look is at 8 blocks
    low, high = looks[0] * block, looks[-1] * block
    if ld.budget_s is not None:  # no block starts after the budget
        low, high = min(low, ld.budget_s + block), min(high, ld.budget_s + block)
    return warmup + low, warmup + high


def budget_blocks(config: Config, servers: int, pace: LoadPace) -> int | None:
    """The blocks [load] budget_s holds at one pace (None: no budget). The budget runs from the probe's
    start, warm-up included, and a block starts only when it would end inside it: what _stop_reason does
    with the last block's time."""
    budget = config.load.budget_s
    if budget is None:
        return None
    warmup, block = block_seconds(config, servers, pace)
    return max(0, int((budget - warmup) // block)) if block > 0 else None


def block_seconds(config: Config, servers: int, pace: LoadPace) -> tuple[float, float]:
    """(the warm-up's seconds, one block's) at one assumed pace, every case on `servers` servers and the
    pace's pause around each."""
    ld = config.load
    rate, decode = pace.prompt_tokens_per_s, pace.s_per_decoded_token
    pause = ld.settle_s if pace.pause_s is None else pace.pause_s

    def case(shape: Any, agents: int) -> float:
        if ld.duration_s:
            return ld.duration_s
        requests = ld.requests_per_case or agents * shape.turns
        if ld.mode == "open" and ld.rate:
            return requests / ld.rate
        # Within a conversation the history is in the prefix cache: a turn prefills its new block, the
        # last reply and its share of the system prompt. The agents' prefills share the server; their
        # decodes are batched.
        fresh = shape.tokens_per_turn + shape.max_output_tokens + shape.system_tokens / shape.turns
        return requests / agents * (agents * fresh / rate + shape.max_output_tokens * decode)

    shapes = shapes_of(ld)
    block = servers * sum(case(s, a) + pause for s in shapes for a in s.agents)
    warmup = servers * sum(case(s, min(s.agents)) for s in shapes) if ld.warmup else 0.0
    return warmup, block
