"""Agreement: do a candidate's next-token distributions match the reference's on the same tokens?

The first `passages` passages of the perplexity task, tokenized once with lm-eval's tokenizer and
prefix token, are sent as token ids to every server with `prompt_logprobs = top_k` (such requests
skip vLLM's prefix cache, so each is a real prefill). Per position: approximate KL divergence (the
tokens both servers reported plus one leftover-mass bucket), top-1 agreement, and the largest
absolute logprob difference; summarised as mean, median, p99 and max over all positions. The
reference is fetched twice and compared with itself: its row is the run-to-run floor.

Events: agreement_doc (one per server and passage, with the per-position values). A rerun into the
same directory skips every (server, passage) already recorded with the same settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kvprobe.errors import ConfigError, ServerError
from kvprobe.probes.perplexity import broken_or_raise, ordered_active, targets_for, tokenized_passages
from kvprobe.quality.divergence import Comparison, TopK, compare, parse_prompt_logprobs
from kvprobe.quality.own_data import task_source
from kvprobe.quality.passages import split_ids
from kvprobe.run.budget import BudgetCost
from kvprobe.run.progress import LoggedProgress

if TYPE_CHECKING:
    from kvprobe.config import Config
    from kvprobe.run.budget import Speed
    from kvprobe.run.context import EvalContext
    from kvprobe.server.client import Client


async def fetch_positions(client: Client, prefix: int, ids: list[int], max_model_len: int,
                          top_k: int) -> list[TopK | None]:
    """Top-k logprobs at every position of a passage (split into windows when it is too long for
    one request: each window starts again after the prefix token, nothing is dropped)."""
    positions: list[TopK | None] = []
    for window in split_ids(ids, max_model_len):
        try:
            data = await client.completions({"prompt": [prefix, *window], "max_tokens": 1, "temperature": 0,
                                             "prompt_logprobs": top_k})
        except ServerError as exc:
            if exc.status == 400 and "logprob" in exc.detail.lower():
                raise ConfigError([f"{client.name}: {exc.detail}: lower agreement.top_k in servers.toml"]) from None
            raise
        got = parse_prompt_logprobs(data, client.name)
        if len(got) != len(window) + 1:
            raise ServerError(client.name, f"{len(got)} prompt logprobs for a {len(window) + 1}-token prompt",
                              path="/v1/completions")
        positions.extend(got[1:])  # position 0 is the prefix token, which has no logprob
    return positions


def summarise_server(per_doc: list[Comparison]) -> dict[str, Any]:
    """Pooled over every position of every passage, and per passage the sums the checks judge from
    (kvprobe.verdict.checks.quality: a ratio of sums over passages with a t interval)."""
    kl = np.concatenate([np.asarray(c.kl, float) for c in per_doc]) if per_doc else np.zeros(0)
    top1 = np.concatenate([np.asarray(c.top1, float) for c in per_doc]) if per_doc else np.zeros(0)
    diff = np.concatenate([np.asarray(c.diff, float) for c in per_doc]) if per_doc else np.zeros(0)
    if kl.size == 0:
        return {"positions": 0, "passages": len(per_doc)}
    return {
        "kl_mean": float(kl.mean()),
        "kl_median": float(np.median(kl)),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "top1_agreement": float(top1.mean()),
        "logprob_diff_median": float(np.median(diff)),
        "logprob_diff_p99": float(np.percentile(diff, 99)),
        "logprob_diff_max": float(diff.max()),
        "positions": int(kl.size),
        "passages": len(per_doc),
        "passage_kl_sum": [math.fsum(c.kl) for c in per_doc],
        "passage_top1_sum": [float(sum(c.top1)) for c in per_doc],
        "passage_positions": [c.positions for c in per_doc],
    }


def _key(top_k: int, max_tokens: int, max_model_len: int, prefix: int, ids: list[list[int]]) -> str:
    h = hashlib.sha256(orjson.dumps({"top_k": top_k, "max_tokens": max_tokens, "max_model_len": max_model_len,
                                     "prefix": prefix, "ids": ids}))
    return h.hexdigest()[:12]


def _recorded(ctx: EvalContext, key: str) -> dict[tuple[str, int], Comparison]:
    out = {}
    for e in ctx.run.events("agreement_doc", key=key):
        out[(e["server"], e["doc"])] = Comparison(e["kl"], [bool(x) for x in e["top1"]], e["diff"])
    return out


@dataclass
class _Comparing:
    """One agreement run's shared state: the same ids go to every server, and each server's positions
    are compared with the reference's first fetch of the same passage."""

    ctx: EvalContext
    settings: Any
    passages: list[Any]
    prefix: int
    ids: list[list[int]]
    max_model_len: int
    key: str
    done: dict[tuple[str, int], Comparison]
    pending: set[tuple[str, int]]
    ref_positions: dict[int, list[TopK | None]] = field(default_factory=dict)
    progress: LoggedProgress = field(init=False)

    def __post_init__(self) -> None:
        self.progress = LoggedProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                       TextColumn("passages"), TimeElapsedColumn(), console=self.ctx.console,
                                       transient=False, unit="passages")

    async def fetch(self, name: str, doc: int) -> list[TopK | None]:
        return await fetch_positions(self.ctx.clients[name], self.prefix, self.ids[doc], self.max_model_len,
                                     self.settings.top_k)

    async def reference_pass(self) -> bool:
        """The reference's positions on every pending passage, what the others are compared with; False,
        with the reference marked broken, when it failed."""
        ref = self.ctx.reference
        need = sorted({d for (_, d) in self.pending})
        task_id = self.progress.add_task(f"agreement {ref} (baseline)", total=len(need))
        for doc in need:
            try:
                self.ref_positions[doc] = await self.fetch(ref, doc)
            except Exception as exc:
                broken_or_raise(self.ctx, ref, "agreement", exc)
                return False
            self.progress.advance(task_id)
        return True

    async def server(self, name: str) -> None:
        """One server's pending passages, `concurrency` at a time."""
        ref, n = self.ctx.reference, len(self.ids)
        todo = [d for d in range(n) if (name, d) in self.pending]
        label = f"agreement {name}" + (" vs itself" if name == ref else f" vs {ref}")
        task_id = self.progress.add_task(label, total=n, completed=n - len(todo))
        sem = asyncio.Semaphore(self.settings.concurrency)
        await asyncio.gather(*(self.passage(name, d, sem, task_id) for d in todo))

    async def passage(self, name: str, doc: int, sem: asyncio.Semaphore, task_id: Any) -> None:
        """One passage on one server compared and recorded; nothing once it or the reference is broken."""
        ctx = self.ctx
        if not ctx.measuring(name):
            return
        async with sem:
            try:
                positions = await self.fetch(name, doc)
            except Exception as exc:
                broken_or_raise(ctx, name, "agreement", exc)
                return
        result = compare(self.ref_positions[doc], positions)
        self.done[(name, doc)] = result
        ctx.run.event("agreement_doc", server=name, reference=ctx.reference, key=self.key, doc=doc,
                      id=self.passages[doc].id, positions=result.positions, tokens=len(self.ids[doc]),
                      top_k=self.settings.top_k, kl=result.kl, top1=[int(x) for x in result.top1],
                      diff=result.diff)
        self.progress.advance(task_id)

    def summary(self, compared: list[str]) -> dict[str, Any]:
        """agreement.json: per server its pooled and per-passage values over the passages done."""
        ctx, ids, done = self.ctx, self.ids, self.done
        summary: dict[str, Any] = {}
        for name in compared:
            per_doc = [done[(name, d)] for d in range(len(ids)) if (name, d) in done]
            entry = summarise_server(per_doc)
            entry.update(reference=ctx.reference, self=name == ctx.reference, top_k=self.settings.top_k,
                         tokens=sum(len(ids[d]) for d in range(len(ids)) if (name, d) in done),
                         passages_total=len(ids))
            if name in ctx.broken:
                entry["error"] = ctx.broken[name]
            summary[name] = entry
        return summary


def _nothing_compared(ctx: EvalContext) -> dict[str, Any]:
    ctx.run.write_json("agreement.json", {})
    return {}


def _common_max_model_len(ctx: EvalContext, names: list[str]) -> int:
    """The smallest max_model_len of the servers (every server gets the same windows)."""
    max_model_len = min(ctx.inventories[n].max_model_len or 0 for n in names)
    if max_model_len < 3:
        raise ConfigError([f"{n}: max_model_len unknown (/v1/models has none): agreement needs it" for n in names
                           if not ctx.inventories[n].max_model_len])
    return max_model_len


def budget_cost(config: Config, servers: int, speed: Speed, max_model_len: int) -> BudgetCost:
    """A passage's windows are prefilled once per server and again per extra reference repeat. The canary
    asks one passage whatever its budget (kvprobe.evaluate.canary), so --budget never grows it."""
    passes = servers + config.perplexity.reference_repeats - 1
    return BudgetCost(passes * config.agreement.max_tokens_per_passage / speed.prompt_tokens_per_s, least=1,
                      most=1, resize=lambda n: ({}, {"passages": n}))


async def run(ctx: EvalContext) -> dict[str, Any]:
    settings = ctx.config.agreement
    ref = ctx.reference
    names = ordered_active(ctx)
    if ref not in names:
        return _nothing_compared(ctx)
    max_model_len = _common_max_model_len(ctx, names)
    # The same tokenizer choice (and check) as perplexity: the passages become the same ids.
    targets = await targets_for(ctx, names, max_model_len, ctx.config.perplexity.num_concurrent, "agreement")
    if ref not in targets:
        return _nothing_compared(ctx)
    task, tasks_dir = task_source(ctx.config.perplexity)
    tokenized = await tokenized_passages(ctx, "agreement", targets[ref], task, settings.passages, tasks_dir)
    if tokenized is None:
        return _nothing_compared(ctx)
    passages, prefix, full_ids = tokenized
    ids = [toks[: settings.max_tokens_per_passage] for toks in full_ids]
    key = _key(settings.top_k, settings.max_tokens_per_passage, max_model_len, prefix, ids)
    done = _recorded(ctx, key)
    # The reference against itself: a second fetch compared with the first.
    compared = [n for n in names if n in targets]
    pending = {(n, d) for n in compared for d in range(len(ids)) if (n, d) not in done}
    comparing = _Comparing(ctx, settings, passages, prefix, ids, max_model_len, key, done, pending)

    with comparing.progress:
        if pending and await comparing.reference_pass():
            await asyncio.gather(*(comparing.server(n) for n in compared))

    summary = comparing.summary(compared)
    ctx.run.write_json("agreement.json", summary)
    ctx.reporter.probe_done("agreement", summary, list(summary))
    return summary
