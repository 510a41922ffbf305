"""Perplexity: is a candidate's quality loss on the same passages under the bar fixed before the run?

Every active server scores the task's passages through lm-eval (kvprobe.quality.lmeval), side by side, one
thread per server, with identical settings. The reference runs `reference_repeats` times: its
run-to-run delta is the noise floor. The probe records every passage's loglikelihood on every
server; the check (kvprobe.verdict.checks.quality) judges the relative perplexity rise (unit: bytes by
default) with a t interval over passages against `perplexity_delta_max`.

Events: perplexity_plan (passages, tokens, windows, chunk crossing), perplexity_doc (one row per
server, repeat and document), perplexity_run (a finished lm-eval run). A rerun into the same
directory skips every (server, repeat) whose perplexity_run is recorded with the same settings.
"""

from __future__ import annotations

import asyncio
import json
import json.decoder
import traceback
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kvprobe.disk import is_disk_error, json_digest
from kvprobe.errors import ServerError, one_line
from kvprobe.quality.own_data import task_source
from kvprobe.quality.passages import PassagePlan, plan_passage
from kvprobe.quality.perplexity_stats import UNIT_FIELD, DocRow, perplexities
from kvprobe.run.budget import BudgetCost
from kvprobe.run.progress import LoggedProgress

if TYPE_CHECKING:
    from kvprobe.config import Config
    from kvprobe.quality.lmeval import Target
    from kvprobe.run.budget import Speed
    from kvprobe.run.context import EvalContext

# Measured on the demo trio (needle-llama): a shipped perplexity passage is ~2,700 tokens.
PASSAGE_TOKENS = 2_700


def ordered_active(ctx: EvalContext) -> list[str]:
    """Active servers, reference first."""
    names = ctx.active()
    return sorted(names, key=lambda n: n != ctx.reference)


def is_server_failure(exc: BaseException) -> bool:
    """An error that says the server failed (as opposed to a bug in kvprobe or lm-eval)."""
    import aiohttp
    import requests

    if is_disk_error(exc):  # our disk, not the server: it stops the run with its own line
        return False
    if isinstance(exc, ServerError | aiohttp.ClientError | requests.RequestException | TimeoutError | OSError):
        return True
    # lm-eval reads a 200's body with the stdlib json: a body that is not JSON is the server's fault.
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return True
    # The stdlib json recurses once per nesting level: `[[[[...` deep enough is a RecursionError
    # raised inside json's decoder, still the body's fault. One raised anywhere else is a bug.
    if isinstance(exc, RecursionError):
        frames = traceback.walk_tb(exc.__traceback__)
        return any(frame.f_code.co_filename == json.decoder.__file__ for frame, _ in frames)
    return isinstance(exc, RuntimeError) and "RemoteTokenizer" in str(exc)


def broken_or_raise(ctx: EvalContext, name: str, what: str, exc: BaseException) -> None:
    """A request to `name` that raised `exc` in an lm-eval probe: a server failure marks it broken, with `what`
    and the error's first line; anything else is a bug here or in lm-eval, raised as it is."""
    if not is_server_failure(exc):
        raise exc
    ctx.mark_broken(name, f"{what}: {one_line(exc)}")


async def tokenized_passages(ctx: EvalContext, probe: str, target: Target, task: str, limit: int | None,
                             tasks_dir: Path) -> tuple[list[Any], int | None, list[list[int]]] | None:
    """The task's passages and their token ids from the reference's tokenizer (the same ids go to
    every server); None, with the reference marked broken, when the server failed to tokenize."""
    from kvprobe.quality import lmeval

    with lmeval.quiet():
        passages = await asyncio.to_thread(lmeval.task_passages, task, limit, tasks_dir)
        try:
            prefix, ids = await asyncio.to_thread(lmeval.tokenize, target, passages)
        except Exception as exc:
            broken_or_raise(ctx, target.name, f"{probe}: tokenizing the passages", exc)
            return None
    return passages, prefix, ids


async def targets_for(ctx: EvalContext, names: list[str], max_length: int, num_concurrent: int,
                      probe: str = "perplexity") -> dict[str, Target]:
    """lm-eval settings per server (perplexity and agreement share them, so both tokenize alike); a
    server without a usable tokenizer, or with a local one that is not the server's, is a config error."""
    from kvprobe.quality import lmeval

    servers = {s.name: s for s in ctx.config.servers}
    infos = await asyncio.gather(*(ctx.clients[n].tokenizer_info() for n in names), return_exceptions=True)
    out: dict[str, Target] = {}
    for name, info in zip(names, infos, strict=True):
        if isinstance(info, BaseException):
            if not isinstance(info, ServerError):
                raise info
            ctx.mark_broken(name, f"/tokenizer_info: {one_line(info)}")
            continue
        server, inv = servers[name], ctx.inventories[name]
        tokenizer = lmeval.choose_tokenizer(name, info is not None, server.tokenizer, inv.model_root, inv.has_tokenize)
        target = lmeval.Target(
            name=name, url=server.url, model=inv.model or ctx.clients[name].model or "",
            max_length=max_length, tokenizer=tokenizer,
            num_concurrent=num_concurrent, timeout_s=server.timeout_s, api_key=server.api_key(),
            headers=dict(server.headers))
        # An unchecked local tokenizer only where the server cannot be asked (servers.toml's path on a
        # server without /tokenize: the operator vouched for it); choose_tokenizer never picks the
        # model root there.
        if tokenizer.backend == "huggingface" and inv.has_tokenize and not await _matches_server(ctx, target):
            continue
        if tokenizer.from_root:
            ctx.console.print(f"{probe}: {name} has no /tokenizer_info: tokenizing with the model's own files "
                              f"at {tokenizer.path} (its /v1/models root; same ids as its /tokenize)")
        out[name] = target
    return out


async def _matches_server(ctx: EvalContext, target: Target) -> bool:
    """check_match on CHECK_TEXT (raises ConfigError on a mismatch); False, with the server marked
    broken, when its /tokenize fails."""
    from kvprobe.errors import ConfigError
    from kvprobe.quality import lmeval

    path = target.tokenizer.path
    try:
        with lmeval.quiet():
            local = await asyncio.to_thread(lmeval.encode, target, lmeval.CHECK_TEXT)
    except (OSError, ValueError) as exc:  # what transformers raises for a folder it cannot load
        raise ConfigError([f"{target.name}: cannot load the tokenizer at {path} ({target.tokenizer.origin()}): "
                           f"{one_line(exc)}"]) from None
    try:
        remote = await ctx.clients[target.name].tokenize(prompt=lmeval.CHECK_TEXT, add_special_tokens=False)
    except ServerError as exc:
        ctx.mark_broken(target.name, f"/tokenize: {one_line(exc)}")
        return False
    lmeval.check_match(target.name, target.tokenizer, local, remote)
    return True


def settings_key(task: str, limit: int | None, max_length: int, prefix: int | None, digest: str) -> str:
    return json_digest({"task": task, "limit": limit, "max_length": max_length, "prefix": prefix,
                        "passages": digest}, 12)


def recorded_runs(ctx: EvalContext, key: str) -> tuple[dict[tuple[str, int], list[DocRow]],
                                                       dict[tuple[str, int], dict[str, Any]]]:
    """The finished (server, repeat) runs in the events log: their rows and their run records."""
    runs = {(e["server"], e["repeat"]): e for e in ctx.run.events("perplexity_run", key=key)}
    docs: dict[tuple[str, int], dict[int, DocRow]] = defaultdict(dict)
    for e in ctx.run.events("perplexity_doc", key=key):
        if (e["server"], e["repeat"]) in runs:
            docs[(e["server"], e["repeat"])][e["doc"]] = DocRow(e["doc"], e["loglikelihood"], e["words"],
                                                                e["bytes"], e["tokens"])
    rows = {run: [docs[run][i] for i in sorted(docs[run])] for run in runs}
    return rows, runs


@dataclass
class _Scoring:
    """One perplexity run's shared state: every server's lm-eval runs read the same plans and settings
    and add to the same rows and run records."""

    ctx: EvalContext
    settings: Any
    task: str
    tasks_dir: Path
    key: str
    targets: dict[str, Target]
    plans: list[PassagePlan]
    repeats: dict[str, int]
    rows: dict[tuple[str, int], list[DocRow]]
    run_records: dict[tuple[str, int], dict[str, Any]]
    progress: LoggedProgress = field(init=False)

    def __post_init__(self) -> None:
        self.progress = LoggedProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                       TextColumn("windows"), TimeElapsedColumn(), console=self.ctx.console,
                                       transient=False, unit="windows")

    @property
    def total_windows(self) -> int:
        return sum(len(p.windows) for p in self.plans)

    async def server(self, name: str) -> None:
        """Every repeat of one server in turn (a recorded one only shown); none once the server is broken."""
        total_windows = self.total_windows
        for repeat in range(1, self.repeats[name] + 1):
            label = f"perplexity {name}" + (f" (run {repeat})" if self.repeats[name] > 1 else "")
            if (name, repeat) in self.rows:
                self.progress.add_task(f"{label} [dim](recorded)[/dim]", total=total_windows,
                                       completed=total_windows)
                continue
            if not self.ctx.measuring(name) or name not in self.targets:
                return
            if not await self.score(name, repeat, label, total_windows):
                return

    async def score(self, name: str, repeat: int, label: str, total_windows: int) -> bool:
        """One lm-eval run on one server, its rows recorded; False, with the server marked broken, when
        the server failed."""
        from kvprobe.quality import lmeval

        progress = self.progress
        task_id = progress.add_task(label, total=total_windows)

        def on_window(done: int, total: int, task_id: Any = task_id) -> None:
            progress.update(task_id, completed=done, total=total)

        try:
            result = await asyncio.to_thread(lmeval.evaluate, self.targets[name], self.task, self.settings.limit,
                                             on_window, self.tasks_dir)
        except Exception as exc:
            broken_or_raise(self.ctx, name, "perplexity", exc)
            return False
        tokens = {p.index: p.tokens for p in self.plans}
        got = [DocRow(d.index, d.loglikelihood, d.words, d.bytes, tokens[d.index]) for d in result.docs]
        if [r.index for r in got] != [p.index for p in self.plans]:
            raise RuntimeError(f"lm-eval scored documents {[r.index for r in got]} on {name}, "
                               f"expected {[p.index for p in self.plans]}")
        for row, plan in zip(got, self.plans, strict=True):
            self.ctx.run.event("perplexity_doc", server=name, repeat=repeat, key=self.key, doc=row.index,
                               id=plan.id, loglikelihood=row.loglikelihood, words=row.words, bytes=row.bytes,
                               tokens=row.tokens, windows=len(plan.windows), crossed_chunk=plan.crossed_chunk)
        self.run_records[(name, repeat)] = self.ctx.run.event(
            "perplexity_run", server=name, repeat=repeat, key=self.key, docs=len(got), seconds=result.seconds,
            windows=result.windows, lm_eval=result.aggregate, tokenizer=self.targets[name].tokenizer.describe())
        self.rows[(name, repeat)] = got
        return True


def _without_reference(ctx: EvalContext, error: str) -> dict[str, Any]:
    """perplexity.json when the reference cannot be scored: nothing is compared."""
    summary = {"reference": ctx.reference, "servers": {}, "error": error}
    ctx.run.write_json("perplexity.json", summary)
    return summary


def _common_max_length(ctx: EvalContext, names: list[str]) -> int:
    """The smallest max_model_len of the servers: identical lm-eval settings for every one."""
    lengths = {n: ctx.inventories[n].max_model_len for n in names}
    unknown = [n for n, v in lengths.items() if not v]
    if unknown:
        from kvprobe.errors import ConfigError

        raise ConfigError([f"{n}: max_model_len unknown (/v1/models has none): perplexity needs it" for n in unknown])
    return min(v for v in lengths.values() if v)


def _record_plan(ctx: EvalContext, key: str, task: str, settings: Any, max_length: int, prefix: int | None,
                plans: list[PassagePlan]) -> None:
    """The perplexity_plan event, once per settings key (a rerun finds it there)."""
    if not any(True for _ in ctx.run.events("perplexity_plan", key=key)):
        ctx.run.event("perplexity_plan", key=key, task=task, limit=settings.limit, max_length=max_length,
                      prefix_token_id=prefix, prefill_chunk_tokens=settings.prefill_chunk_tokens,
                      passages=[p.to_dict() for p in plans])


def _say_windows(ctx: EvalContext, plans: list[PassagePlan], max_length: int, prefill_chunk_tokens: int) -> None:
    """Which passages need more than one request, and a warning when none crosses a prefill chunk."""
    windowed = [p for p in plans if len(p.windows) > 1]
    if len(windowed) > 3:  # a short context windows nearly every passage: one line, not one per passage
        counts = sorted({len(p.windows) for p in windowed})
        ctx.console.print(f"perplexity: {len(windowed)} of {len(plans)} passages are longer than one request "
                          f"holds at max_model_len {max_length:,}: each is scored in {counts[0]}-{counts[-1]} "
                          "windows")
    else:
        for p in windowed:
            ctx.console.print(f"perplexity: passage {p.id} has {p.tokens:,} tokens, more than one request "
                              f"holds at max_model_len {max_length:,}: scored in {len(p.windows)} windows")
    if not any(p.crossed_chunk for p in plans):
        ctx.console.print(f"[yellow]perplexity: no passage is longer than one prefill chunk "
                          f"({prefill_chunk_tokens:,} tokens)[/yellow]")


def budget_cost(config: Config, servers: int, speed: Speed, max_model_len: int) -> BudgetCost:
    """A passage is prefilled once per server and again per extra reference repeat; --budget grows the
    passages up to [perplexity] limit (16 when unset)."""
    settings = config.perplexity
    passes = servers + settings.reference_repeats - 1
    return BudgetCost(passes * min(PASSAGE_TOKENS, max_model_len) / speed.prompt_tokens_per_s, least=1,
                      most=settings.limit or 16,
                      resize=lambda n: ({"perplexity": settings.model_copy(update={"limit": n})}, {"passages": n}))


async def run(ctx: EvalContext) -> dict[str, Any]:
    from kvprobe.quality import lmeval

    settings = ctx.config.perplexity
    bar = ctx.config.bars.perplexity_delta_max
    ref = ctx.reference
    names = ordered_active(ctx)
    if ref not in names:
        return _without_reference(ctx, f"reference {ref} is not serving")
    max_length = _common_max_length(ctx, names)
    targets = await targets_for(ctx, names, max_length, settings.num_concurrent)
    if ref not in targets:
        return _without_reference(ctx, f"reference {ref}: {ctx.broken.get(ref)}")

    task, tasks_dir = task_source(settings)
    tokenized = await tokenized_passages(ctx, "perplexity", targets[ref], task, settings.limit, tasks_dir)
    if tokenized is None:
        return _without_reference(ctx, f"reference {ref}: {ctx.broken[ref]}")
    passages, prefix, ids = tokenized
    targets = {n: replace(t, prefix_token_id=prefix) for n, t in targets.items()}
    plans = [plan_passage(p.index, p.id, p.text, len(toks), max_length, settings.prefill_chunk_tokens)
             for p, toks in zip(passages, ids, strict=True)]
    key = settings_key(task, settings.limit, max_length, prefix, lmeval.passages_digest(passages))
    _record_plan(ctx, key, task, settings, max_length, prefix, plans)
    _say_windows(ctx, plans, max_length, settings.prefill_chunk_tokens)

    repeats = {n: settings.reference_repeats if n == ref else 1 for n in names}
    recorded, run_records = recorded_runs(ctx, key)
    rows = {run: got for run, got in recorded.items() if run[0] in names and run[1] <= repeats[run[0]]}
    scoring = _Scoring(ctx, settings, task, tasks_dir, key, targets, plans, repeats, rows, run_records)
    with lmeval.quiet(), scoring.progress:
        await asyncio.gather(*(scoring.server(n) for n in names))

    summary = summarise(ref, names, rows, plans, settings, bar, ctx.broken)
    summary.update(task=task, passages_file=settings.passages, limit=settings.limit, max_length=max_length,
                   prefix_token_id=prefix,
                   prefill_chunk_tokens=settings.prefill_chunk_tokens,
                   tokenizers={n: t.tokenizer.describe() for n, t in targets.items()})
    _add_run_records(summary, run_records)
    ctx.run.write_json("perplexity.json", summary)
    ctx.reporter.probe_done("perplexity", summary, list(summary["servers"]))
    return summary


def _add_run_records(summary: dict[str, Any], run_records: dict[tuple[str, int], dict[str, Any]]) -> None:
    """Each server's first run's lm-eval aggregate and seconds, beside its perplexities."""
    for name in summary["servers"]:
        agg = run_records.get((name, 1))
        if agg:
            summary["servers"][name]["lm_eval"] = agg.get("lm_eval")
            summary["servers"][name]["seconds"] = agg.get("seconds")


def summarise(ref: str, names: list[str], rows: dict[tuple[str, int], list[DocRow]], plans: list[PassagePlan],
              settings: Any, bar: float, broken: dict[str, str]) -> dict[str, Any]:
    """perplexity.json: per server its perplexities and, passage by passage, what the checks judge
    from (kvprobe.verdict.checks.quality): the loglikelihood, the unit count the delta is on and, for the
    reference, its repeated runs' loglikelihoods (the run-to-run noise). Nothing is judged here."""
    unit = settings.delta_unit
    field = UNIT_FIELD[unit]
    servers: dict[str, Any] = {}
    for name in names:
        own = rows.get((name, 1))
        if own is None:
            servers[name] = {"error": broken.get(name, "not measured")}
            continue
        entry: dict[str, Any] = perplexities(own)
        entry["role"] = "reference" if name == ref else "candidate"
        entry.update(passage_doc=[r.index for r in own], passage_ll=[r.loglikelihood for r in own],
                     passage_units=[getattr(r, field) for r in own])
        if name == ref:
            by_doc = [{r.index: r.loglikelihood for r in rows[(ref, k)]}
                      for k in range(2, settings.reference_repeats + 1) if (ref, k) in rows]
            entry["repeat_ll"] = [[again.get(r.index) for r in own] for again in by_doc]
        if name in broken:
            entry["error"] = broken[name]
        servers[name] = entry
    return {
        "reference": ref,
        "unit": unit,
        "bar": bar,
        "reference_repeats": settings.reference_repeats,
        "passages": [p.to_dict() for p in plans],
        "crossed_chunk": sum(p.crossed_chunk for p in plans),
        "servers": servers,
    }
