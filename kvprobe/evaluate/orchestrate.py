"""`kvprobe eval`: config -> inventory -> pin check -> fit -> probes -> files in the run directory.

Exit status follows from what was found, most serious first: 2 cannot run (a server unreachable,
wrong key, unreadable capacity, a probe setting written in servers.toml that does not fit the servers;
a probe whose kvprobe defaults do not fit is not measured instead), 3 invalid comparison, 4 a server
is broken, then the verdict's own code (1: no candidate adopted and one fails or does not pass a bar;
see kvprobe.verdict.build), 0 ok.
After the probes the verdict is written from what is on disk and signed (verdict.json(.sig)).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from kvprobe import __version__
from kvprobe.config import Config
from kvprobe.disk import writing
from kvprobe.errors import EXIT_BROKEN, EXIT_CANNOT_RUN, EXIT_INVALID, EXIT_OK, ConfigError
from kvprobe.probes import ORDER, PROBES, ordered
from kvprobe.report.live import TerminalReporter
from kvprobe.run.context import EvalContext
from kvprobe.run.interrupt import CtrlC
from kvprobe.run.store import RunDir, utc_now
from kvprobe.server.client import Client
from kvprobe.server.inventory import NOT_TAKEN, Inventory, take_inventories
from kvprobe.server.pin import check_pin
from kvprobe.verdict.build import write_verdict
from kvprobe.verdict.checks import live_checks
from kvprobe.verdict.sign import SigningKey, sign_file


def say_sizing(ctx: EvalContext, probes: list[str]) -> None:
    """One line per bar the planned sizes cannot pass (kvprobe.verdict.design), said before anything is measured
    and kept in the events log."""
    from kvprobe.verdict.design import sizing_notes

    documents = None
    if "tasks" in probes:
        from kvprobe.probes.tasks import preflight

        documents = {info.name: info.documents for info in preflight(ctx.config)}  # cached: no second load
    said = {e.get("text") for e in ctx.run.events("sizing_note")}
    for line in sizing_notes(ctx.config, probes, documents):
        ctx.console.print(f"[yellow]sizing:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)
        if line not in said:
            ctx.run.event("sizing_note", text=line)


def say_power(ctx: EvalContext, inventories: list[Inventory], probes: list[str]) -> None:
    """The plan's power for a candidate equal to the reference and, under 0.8, the sizes that would reach it
    (kvprobe.evaluate.power_plan.plan_at_the_servers), said before the probes start and kept in the events log
    as `power_plan`."""
    from kvprobe.evaluate.power_plan import lines, plan_at_the_servers

    documents = None
    if "tasks" in probes:
        from kvprobe.probes.tasks import preflight

        documents = {info.name: info.documents for info in preflight(ctx.config)}  # cached: no second load
    data = plan_at_the_servers(ctx.config, probes, inventories, documents).as_dict()
    for line in lines(data):
        ctx.console.print(escape(line), highlight=False, soft_wrap=True)
    if next(ctx.run.events("power_plan"), None) is None:  # a resumed run recorded it when it started
        ctx.run.event("power_plan", **data)


def ask_fit(view: Any, probes: list[str]) -> tuple[dict[str, str], list[str]]:
    """(probe -> why a kvprobe default cannot fit, problems of the operator's own settings): each requested
    probe's fit check on `view` (an EvalContext, or anything with its config and inventories)."""
    reasons: dict[str, str] = {}
    problems: list[str] = []
    for name in ordered(probes):
        check = PROBES[name].cannot_run
        if check is None:
            continue
        try:
            reason = check(view)
        except ConfigError as exc:
            problems += exc.problems
            continue
        if reason is not None:
            reasons[name] = reason
    return reasons, problems


def fit_phase(ctx: EvalContext, probes: list[str]) -> list[str]:
    """Before any probe measures anything, each requested probe that has a fit check says whether it
    can run on the active servers (their max_model_len). A setting the operator wrote that does not fit
    stops the run here, every such line at once (ConfigError, exit 2); kvprobe's own default that does
    not fit leaves that probe not measured, recorded (`probe_cannot_run`, which the verdict reads) and
    said, and the rest of the run goes on. Returns the probes to skip. A resumed run asks again: the
    same servers give the same reason, a larger context lets the probe run."""
    reasons, problems = ask_fit(ctx, probes)
    if problems:
        raise ConfigError(problems)
    for name, reason in reasons.items():
        ctx.run.event("probe_cannot_run", probe=name, reason=reason)
        ctx.console.print(f"[yellow]{name}: not measured:[/yellow] {escape(reason)}", highlight=False,
                          soft_wrap=True)
    return list(reasons)


def cannot_run_lines(inventories: list[Inventory]) -> list[str]:
    """One line per reason the comparison cannot start: a server out of reach, or one whose answers
    cannot be read (a comparison built on a garbled max_model_len or capacity measures nothing)."""
    lines = [inv.error or inv.name for inv in inventories if inv.status in NOT_TAKEN]
    lines += [f"{inv.name}: {line}" for inv in inventories if inv.status not in NOT_TAKEN for line in inv.unreadable]
    return lines


def make_clients(config: Config, transport: Any = None) -> dict[str, Client]:
    return {s.name: Client.for_server(s, transport) for s in config.servers}


@dataclass
class EvalOutcome:
    exit_code: int
    messages: list[str]
    ctx: EvalContext

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The signed verdict as written, or None when the run stopped before one."""
        return self.ctx.results.get("verdict")


def check_resume(config: Config, run: RunDir) -> dict[str, Any]:
    """A resumed run keeps the config it started with: bars and settings are fixed before any number
    comes in, and finished cases are only comparable with the rest under the same settings."""
    meta = run.read_json("run.json")
    recorded, now = meta.get("config") or {}, config.public_dict()
    if recorded != now:
        keys = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
        raise ConfigError([f"--resume {run.path}: the servers file differs from the one this run started with "
                           f"(at {', '.join(keys)}): resume with the same file, or start a new run"])
    return meta


def _write_run_json(run: RunDir, config: Config, probes: list[str], resume: bool,
                    left_out: list[dict[str, str]] | None = None) -> None:
    if resume and run.has("run.json"):
        meta = run.read_json("run.json")
        asked = set(meta.get("probes") or []) | set(probes)
        meta["probes"] = ordered(asked) + sorted(asked - set(ORDER))
        meta["resumed"] = [*meta.get("resumed", []), utc_now()]
        run.write_json("run.json", meta)
        return
    run.write_json("run.json", {
        "kvprobe_version": __version__,
        "started": utc_now(),
        "probes": probes,
        "config": config.public_dict(),
        # Servers meant for this comparison that could not be started (the demo says which and why).
        **({"left_out": left_out} if left_out else {}),
    })


def conclude(run: RunDir, signing_key: SigningKey | None) -> dict[str, Any]:
    """Write verdict.json from what is on disk and sign its exact bytes into verdict.json.sig."""
    sig = run.path / "verdict.json.sig"
    with writing(sig):  # first: a stale signature beside a new verdict (a write that failed between) is a lie
        sig.unlink(missing_ok=True)
    verdict, _ = write_verdict(run)
    if signing_key is not None:
        sign_file(run.path / "verdict.json", signing_key)
    return verdict


def _open_clients(stack: AsyncExitStack, config: Config, transport: Any) -> dict[str, Client]:
    """One client per server, closed when `stack` closes; a model named in servers.toml is the one asked for."""
    clients = make_clients(config, transport)
    for client in clients.values():
        stack.push_async_callback(client.aclose)
    for server in config.servers:
        if server.model:
            clients[server.name].model = server.model
    return clients


async def _inventory_phase(config: Config, run: RunDir, clients: dict[str, Client],
                           console: Console) -> list[Inventory]:
    """Every server's inventory, each written to inventory/ in the run directory and kept in the events log."""
    with console.status("inventory: health, version, model, /metrics, first-prefill smoke"):
        inventories = await take_inventories(
            list(clients.values()),
            roles={s.name: s.role for s in config.servers},
            backends={s.name: s.attention_backend for s in config.servers},
            smoke_fraction=config.smoke.prompt_fraction,
            smoke_max_tokens=config.smoke.max_tokens,
        )
    for inv in inventories:
        run.write_json(f"inventory/{inv.name}.json", inv.to_dict())
        if inv.metrics_text is not None:
            run.write_text(f"inventory/{inv.name}.metrics.txt", inv.metrics_text)
        run.event("inventory", server=inv.name, status=inv.status, error=inv.error,
                  kv_cache_tokens=inv.capacity.kv_cache_tokens if inv.capacity else None)
    return inventories


def _cannot_start(inventories: list[Inventory], probes: list[str]) -> list[str]:
    """Why no probe can run (exit 2): a server out of reach or unreadable, an unknown probe, or a capacity
    run without every server's capacity; none when the probes can start."""
    cannot_run = cannot_run_lines(inventories)
    if cannot_run:
        return cannot_run
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        return [f"--probes: unknown probe(s) {', '.join(unknown)}: choose from {', '.join(PROBES)}"]
    no_capacity = [inv for inv in inventories if inv.capacity is None]
    if "capacity" in probes and no_capacity:
        return [f"{inv.name}: KV capacity unknown: {'; '.join(inv.warnings) or 'no cache_config_info'}"
                for inv in no_capacity]
    return []


async def _probe_phase(ctx: EvalContext, inventories: list[Inventory], probes: list[str], deadline: float | None,
                       advise: bool, ctrl_c: CtrlC) -> None:
    """Fit, sizing advice, then each probe that fits in run order (within the canary's budget when it has one)."""
    skipped = fit_phase(ctx, probes)
    runnable = [p for p in probes if p not in skipped]  # the budget plans no time for the rest
    if advise:
        say_sizing(ctx, runnable)
        say_power(ctx, inventories, runnable)
    budget = _Budget(ctx, inventories, deadline, runnable) if deadline is not None else None
    if budget is not None:
        budget.plan(runnable)
    for name in ordered(runnable):
        ctrl_c.check()
        if ctx.reference in ctx.broken:
            _stop_without_reference(ctx, ordered(runnable)[ordered(runnable).index(name):])
            return
        if ctx.every_candidate_broke():
            _stop_without_candidates(ctx, ordered(runnable)[ordered(runnable).index(name):])
            return
        if budget is None:
            ctx.results[name] = await PROBES[name].run(ctx)
        elif not await budget.run(name, PROBES[name].run):
            continue
        ctx.run.event("probe_done", probe=name)


def _stop_without_reference(ctx: EvalContext, left: list[str]) -> None:
    """The reference broke: what a candidate answers from now on has nothing to be compared with, so the probes
    left are not run (a rerun into the run directory, the reference fixed, measures them)."""
    ref = ctx.reference
    ctx.run.event("probes_not_run", probes=left, why=f"the reference {ref} broke")
    ctx.console.print(f"[red]{', '.join(left)} not run:[/red] the reference {escape(ref)} broke, so nothing more "
                      "can be compared", highlight=False)


def _stop_without_candidates(ctx: EvalContext, left: list[str]) -> None:
    """Every candidate broke: the reference's answers alone compare nothing, and its probes would cost the
    operator minutes (the AVX2 demo's reference spent 10 of its 30 on tasks and load after its one candidate
    died)."""
    gone = ", ".join(c.name for c in ctx.config.candidates if c.name in ctx.broken)
    ctx.run.event("probes_not_run", probes=left, why=f"every candidate broke ({gone})")
    ctx.console.print(f"[red]{', '.join(left)} not run:[/red] every candidate broke ({escape(gone)}), so nothing is "
                      "left to compare", highlight=False)


def _outcome(ctx: EvalContext, inventories: list[Inventory], messages: list[str],
             signing_key: SigningKey | None, ctrl_c: CtrlC) -> EvalOutcome:
    """The verdict written and signed, and the exit code, most serious first: an invalid comparison, a broken
    server, then the verdict's own code; `messages` gains a line for each."""
    code = EXIT_OK
    broken = [inv for inv in inventories if not inv.serving]
    if not ctx.pin.valid:
        code = EXIT_INVALID
        messages += [f"invalid comparison: {d.text}" for d in ctx.pin.all_differences()]
    elif broken or ctx.broken:
        code = EXIT_BROKEN
    messages += [inv.error or f"{inv.name} is broken" for inv in broken]
    messages += [f"{name} broke during the run: {err}" for name, err in ctx.broken.items()]
    ctrl_c.check()  # a run the operator stopped is resumed, never signed as it stands
    verdict = ctx.results["verdict"] = conclude(ctx.run, signing_key)
    if code == EXIT_OK:
        code = verdict.get("exit_code", EXIT_OK)
    return EvalOutcome(code, messages, ctx)


async def run_eval(
    config: Config,
    run: RunDir,
    probes: list[str],
    console: Console,
    transport: Any = None,
    *,
    signing_key: SigningKey | None = None,
    resume: bool = False,
    left_out: list[dict[str, str]] | None = None,
    deadline: float | None = None,
    advise: bool = True,
) -> EvalOutcome:
    """`deadline`: the canary's --budget ends then (time.monotonic(); kvprobe.evaluate.budget). `advise`: say which
    bars the planned sizes cannot pass (not for the canary, whose small sizes are its point)."""
    _write_run_json(run, config, probes, resume, left_out)
    for name in ordered(probes):  # before any server is asked anything
        if (check := PROBES[name].preflight) is not None:
            await asyncio.to_thread(check, config)
    async with AsyncExitStack() as stack:
        ctrl_c = stack.enter_context(CtrlC())
        clients = _open_clients(stack, config, transport)
        inventories = await _inventory_phase(config, run, clients, console)
        invs = {inv.name: inv for inv in inventories}
        ref = config.reference.name
        pin = check_pin(invs[ref], [invs[c.name] for c in config.candidates], config.knob)
        run.event("pin", **pin.to_dict())
        ctx = EvalContext(config, run, clients, invs, pin, console, deadline=deadline,
                          reporter=TerminalReporter(console, ref, config.bars), judge=live_checks)

        cannot_start = _cannot_start(inventories, probes)
        if cannot_start:
            return EvalOutcome(EXIT_CANNOT_RUN, cannot_start, ctx)
        messages: list[str] = []
        if invs[ref].serving:
            await _probe_phase(ctx, inventories, probes, deadline, advise, ctrl_c)
        else:
            messages.append(f"reference {invs[ref].error}: nothing can be compared")
        return _outcome(ctx, inventories, messages, signing_key, ctrl_c)


class _Budget:
    """The canary's --budget over one run: plan from the smoke's speed, run each probe until the
    deadline (less the verdict's few seconds), and re-plan what is left from what the last probe took."""

    def __init__(self, ctx: EvalContext, inventories: list[Inventory], deadline: float, requested: list[str]) -> None:
        lengths = [inv.max_model_len for inv in inventories if inv.serving and inv.max_model_len]
        self.ctx, self.inventories, self.deadline = ctx, inventories, deadline
        self.max_model_len = min(lengths, default=8192)
        self.most = ctx.config  # what each probe may grow to
        self.current: Any = None
        self.requested = list(requested)

    def plan(self, probes: list[str], scale: float = 1.0, source: str | None = None) -> None:
        from kvprobe.evaluate.budget import plan_budget

        left = self.deadline - time.monotonic()
        self.ctx.config, plan = plan_budget(self.most, probes, self.inventories, left, self.max_model_len, scale)
        if source:
            plan.source = source
        self.ctx.console.print(escape(plan.describe()), highlight=False)
        self.ctx.run.event("budget_plan", **plan.to_dict())
        for probe in plan.left_out:
            self.ctx.run.event("budget_cut", probe=probe, started=False)
        self.current = plan

    async def run(self, name: str, probe: Callable[[EvalContext], Awaitable[Any]]) -> bool:
        from kvprobe.run.budget import RESERVE_S, corrected_scale

        if name not in self.current.probes:  # a re-plan left it out
            return False
        left = self.deadline - time.monotonic() - RESERVE_S
        if left <= 0:
            self.ctx.run.event("budget_cut", probe=name, started=False)
            self.ctx.console.print(f"[yellow]budget:[/yellow] {name} not started, the budget is spent",
                                   highlight=False)
            return False
        t0 = time.monotonic()
        try:
            self.ctx.results[name] = await asyncio.wait_for(probe(self.ctx), left)
        except TimeoutError:
            self.ctx.run.event("budget_cut", probe=name, started=True)
            self.ctx.console.print(f"[yellow]budget:[/yellow] {name} cut at the budget; what it measured is in "
                                   "events.jsonl, the verdict counts it as not measured", highlight=False)
            return False
        scale = corrected_scale(self.current, name, time.monotonic() - t0)
        # What was asked and comes later, including what an earlier plan had no time for.
        later = [p for p in ordered(self.requested) if ORDER.index(p) > ORDER.index(name)]
        if scale and PROBES[name].replans and later:
            self.plan(later, scale, f"(re-planned from what {name} took)")
        return True


def run_eval_sync(*args: Any, **kw: Any) -> EvalOutcome:
    return asyncio.run(run_eval(*args, **kw))
