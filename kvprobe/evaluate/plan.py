"""`kvprobe check`: what `kvprobe eval` would do with a servers.toml, said before anything is measured.

The plan is the config read as eval reads it: the servers (never a key, only whether its variable is
set), the knob, the probes that would run with the settings and sizes that decide their cost and
their power, the bars, the sizing advice eval would print (kvprobe.verdict.design) and a rough time.

Every problem eval would stop on before measuring is one line here too: the config's own
(kvprobe.config), a model_config the memory map cannot read, a task lm-eval cannot load (the probes'
preflights), and a probe setting the operator wrote that cannot fit the servers' context (the probes'
own fit checks, kvprobe.evaluate.orchestrate.fit_phase). The context is a max_model_len given on the command line,
else the one each server reports on /v1/models (`--reach`), else the model_config's
max_position_embeddings (the most a server of that model serves); with none of these the fit is not
checked, and the plan says so. Two more are refused here, where eval would run and answer nothing
useful: two servers at one URL, and a knob a slip away from a known one. A file that runs but may not
answer gets warnings: a key variable not set, a knob kvprobe does not know, and a plan that leaves a
declared bar unmeasured, so it cannot reach adopt.

The time is rough and says so: without a first-prefill smoke there is no measured speed, so each probe
is costed at two assumed speeds, a fast GPU's and the demo's 2-core CPU box: a probe the canary's --budget
sizes by its own cost model (its module's budget_cost) at its whole configured size, the load probe over
its whole design.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kvprobe import knob as knobs
from kvprobe.config import Config, NeedleSettings, Server, shared_urls, unset_keys
from kvprobe.errors import ConfigError, KvprobeError, NotModelled, ServerError
from kvprobe.evaluate import power_plan
from kvprobe.evaluate.power_plan import FAST_LOAD, SLOW_LOAD, span
from kvprobe.probes import PROBES, default_probes, ordered
from kvprobe.probes import load as load_probe
from kvprobe.run.budget import LoadPace, Speed

# Assumed speeds for the rough time. The slow end is the demo trio's 2-core CPU box: its slowest
# first-prefill smoke (1,033 prompt tokens/s) and ~30 ms a decoded answer token with the other servers
# busy on the same cores (kvprobe.run.budget). The fast end is a GPU: 20,000 prompt tokens/s is assumed for a
# small model; ~5 ms a token is what the H200's single-agent load cases took (tests/fixtures/runs/h200-gpu).
FAST = Speed(20_000.0, 0.005)
SLOW = Speed(1_000.0, 0.03)
# A context to cost prompts with when none is known: vLLM's common default for small models.
ASSUMED_MAX_MODEL_LEN = 8192
REACH_TIMEOUT_S = 30.0


@dataclass
class Context:
    """The max_model_len each server is taken to have for the fit checks, and where it came from."""

    lengths: dict[str, int | None]
    source: str | None  # None: not known, the fit is not checked

    @property
    def tightest(self) -> int | None:
        known = [n for n in self.lengths.values() if n]
        return min(known) if known else None


@dataclass
class Reached:
    """What --reach read from one server: its /health and /v1/models, nothing measured."""

    name: str
    ok: bool
    error: str | None = None
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "error": self.error, "models": self.models,
                "max_model_len": self.max_model_len}


@dataclass
class _FitView:
    """What a probe's fit check reads from an EvalContext: the config, each server's context and the
    servers it would measure. Built without any server, so `check` asks the probes' own checks."""

    config: Config
    inventories: dict[str, Any]

    def active(self) -> list[str]:
        return list(self.inventories)


@dataclass
class _Length:
    max_model_len: int | None


def host_port(url: str) -> str:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"{parsed.hostname}:{port}"


def server_row(server: Server) -> dict[str, Any]:
    """A server as the plan shows it: the name of its key's variable and whether it is set, never the key."""
    return {"name": server.name, "url": server.url, "host_port": host_port(server.url), "role": server.role,
            "api_key_env": server.api_key_env,
            "api_key_set": bool(server.api_key()) if server.api_key_env else None,
            "model": server.model, "headers": sorted(server.headers), "timeout_s": server.timeout_s}


def choose_probes(config: Config, probes: str | None) -> tuple[list[str], list[str]]:
    """(the probes eval would run, problems): the default set, or --probes in eval's order."""
    if not probes:
        return default_probes(config), []
    asked = [p.strip() for p in probes.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PROBES]
    if unknown:
        return [], [f"--probes: unknown probe(s) {', '.join(unknown)}: choose from {', '.join(PROBES)}"]
    return ordered(asked), []


def model_config_facts(config: Config, source: str = "servers.toml") -> tuple[dict[str, Any] | None, list[str],
                                                                          list[str]]:
    """(facts, problems, notes) of servers.toml's model_config: it must exist and be a config.json the
    memory map can read, as eval's capacity probe stops on one it cannot."""
    path = config.model_config_path
    if not path:
        return None, [], []
    where = f"{source}: model_config {path}"
    target = Path(path)
    if not (target.is_file() or (target / "config.json").is_file()):
        return None, [f"{where}: no such file: give the model's Hugging Face config.json"], []
    from kvprobe.memmap import load_config as load_model_config
    from kvprobe.memmap import model_shape

    try:
        shape = model_shape(load_model_config(target), str(target))
    except NotModelled as exc:  # a limit of the memory map, not a mistake: eval leaves the prediction out
        return {"path": path, "max_position_embeddings": None}, [], [f"{where}: {'; '.join(exc.problems)}"]
    except ConfigError as exc:
        return None, [f"{where}: {line}" for line in exc.problems], []
    mpe = shape.max_position_embeddings if isinstance(shape.max_position_embeddings, int) else None
    return {"path": path, "model_type": shape.model_type, "max_position_embeddings": mpe}, [], []


def preflight_problems(config: Config, probes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The probes' own checks that need no server (a task lm-eval cannot load, ...), as eval runs them
    first: (what they found, problems)."""
    found: dict[str, Any] = {}
    problems: list[str] = []
    for name in ordered(probes):
        if (check := PROBES[name].preflight) is None:
            continue
        try:
            found[name] = check(config)
        except ConfigError as exc:
            problems += exc.problems
            found[name] = None  # failed: its fit check would only say the same again
        except KvprobeError as exc:
            problems.append(str(exc))
            found[name] = None
    return found, problems


async def _reach_one(server: Server, transport: Any = None) -> Reached:
    from kvprobe.server.client import Client
    from kvprobe.server.untrusted import MAX_MODEL_LEN, number

    # A short timeout and few retries: a check that waits a server's 600 s request timeout says nothing more.
    client = Client(server.name, server.url, api_key=server.api_key(), headers=server.headers,
                    timeout_s=min(server.timeout_s, REACH_TIMEOUT_S), transport=transport, retries=2,
                    unset_key_env=server.unset_key_env())
    try:
        await client.health()
        models = await client.models()
        ids = [m["id"] for m in models]
        if not models:
            return Reached(server.name, False, f"{server.name}: {server.url}/v1/models lists no model")
        if server.model and server.model not in ids:
            return Reached(server.name, False, f"{server.name}: model {server.model!r} (servers.toml) is not among "
                           f"/v1/models ({', '.join(ids)})", ids)
        first = next((m for m in models if m["id"] == server.model), models[0])
        length = None
        if first.get("max_model_len") is not None:
            length = int(number(first["max_model_len"], f"{server.name}: /v1/models max_model_len", integer=True,
                                minimum=1, maximum=MAX_MODEL_LEN))
        return Reached(server.name, True, None, ids, length)
    except ServerError as exc:  # unreachable, a refused key, garbage where a number belongs: one line each
        return Reached(server.name, False, str(exc))
    finally:
        await client.aclose()


def reach(config: Config, transport: Any = None) -> list[Reached]:
    """GET /health and /v1/models of every server at once; nothing is measured."""

    async def go() -> list[Reached]:
        return list(await asyncio.gather(*(_reach_one(s, transport) for s in config.servers)))

    return asyncio.run(go())


def context_of(config: Config, declared: int | None, reached: list[Reached] | None,
               model: dict[str, Any] | None) -> Context:
    names = [s.name for s in config.servers]
    if declared:
        return Context(dict.fromkeys(names, declared), "--max-model-len")
    if reached and any(r.max_model_len for r in reached):
        return Context({r.name: r.max_model_len for r in reached}, "/v1/models (--reach)")
    if model and model.get("max_position_embeddings"):
        return Context(dict.fromkeys(names, model["max_position_embeddings"]),
                       "model_config max_position_embeddings: the most a server of this model serves")
    return Context(dict.fromkeys(names), None)


def fit(config: Config, probes: list[str], context: Context) -> tuple[dict[str, str], list[str]]:
    """(probe -> why eval would leave it not measured, problems): the probes' own fit checks against the
    context. A setting the operator wrote that cannot fit is a problem (eval stops with exit 2); a
    kvprobe default that cannot fit leaves the probe not measured, as eval says it."""
    from kvprobe.evaluate.orchestrate import ask_fit

    if context.source is None:
        return {}, []
    return ask_fit(_FitView(config, {name: _Length(n) for name, n in context.lengths.items()}), probes)


def knob_lines(config: Config, source: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the declared knob: a slip of a known name is refused (it would compare
    nothing, and the servers' real knob would read as a second difference); a name kvprobe does not
    know is said, as eval reads it as a cache_config_info label a server may not have."""
    name = config.knob
    if (meant := knobs.near_miss(name)) is not None:
        return [f"{source}: knob: {name!r} is not a knob: did you mean {meant}?"], []
    if name in knobs.NAMES:
        return [], []
    return [], [f"{source}: knob: {name!r} is not a setting kvprobe knows ({', '.join(knobs.KNOWN)}, or a "
                "vllm:cache_config_info label such as cache_dtype): eval reads it as a label of that name, "
                "and says so when a server has none"]


def gating_bars(config: Config, probe: str) -> list[str]:
    """The bars `probe` measures that adopt waits for (kvprobe.verdict.build: every gating check
    measured and passed). Agreement's bars only when set; advisory speed never gates."""
    bars = config.bars
    if probe == "agreement":
        return [b for b in ("kl_mean_max", "top1_agreement_min") if getattr(bars, b) is not None]
    if probe == "load":
        latency = ["p99_latency_rise_max"] if config.load.latency_endpoint else []
        return [] if config.load.advisory else ["throughput_drop_max", *latency]
    return {"capacity": ["capacity_gain_min"], "perplexity": ["perplexity_delta_max"],
            "needle": ["needle_recall_drop_max", "truncation_rise_max"],
            "tasks": ["task_accuracy_drop_max", "truncation_rise_max"]}.get(probe, [])


def cannot_adopt(config: Config, chosen: list[str], not_measured: dict[str, str]) -> list[str]:
    """A line per probe whose bars this plan leaves unmeasured: then no candidate can be adopted, and
    eval ends `inconclusive` at best. The tasks probe is opt-in: adopt waits for it only when asked for."""
    lines = []
    for probe in PROBES:
        bars = gating_bars(config, probe)
        if not bars or (probe == "tasks" and probe not in chosen):
            continue
        need = f"{' and '.join(bars)} {'needs' if len(bars) == 1 else 'need'} the {probe} probe"
        if probe not in chosen:
            lines.append(f"this plan cannot reach adopt: {need}, which --probes leaves out: add it, or read "
                         "the run as a first look")
        elif probe in not_measured:
            lines.append(f"this plan cannot reach adopt: {need}, not measured here: {not_measured[probe]}")
    return lines


# -- sizes ---------------------------------------------------------------------------------------

def needle_grid(settings: NeedleSettings, context: Context) -> dict[str, Any]:
    """The length x depth grid eval would place, when the context is known (else how it is sized)."""
    from kvprobe.needle.cases import resolve_grid

    tight = context.tightest
    if settings.lengths or tight:
        largest = tight - settings.max_tokens if tight else 0
        if not settings.lengths and largest < 16:
            return {"lengths": None, "depths": None, "sized": "no room for a prompt"}
        lengths, depths = resolve_grid(settings, largest)
        return {"lengths": lengths, "depths": depths, "sized": "planned"}
    _, depths = resolve_grid(settings.model_copy(update={"lengths": [settings.min_length]}), settings.min_length)
    return {"lengths": None, "depths": depths, "lengths_count": math.ceil(settings.count / len(depths)),
            "sized": "at the inventory, from min_length up to max_model_len - max_tokens"}


def probe_settings(config: Config, probes: list[str], context: Context, found: dict[str, Any]) -> dict[str, Any]:
    """Per probe, the settings that decide what it measures and how much."""
    from kvprobe.load.workload import shapes_of
    from kvprobe.probes.load import shape_need
    from kvprobe.stats.sequential import STATISTIC, planned_looks

    out: dict[str, Any] = {}
    if "capacity" in probes:
        out["capacity"] = {"source": "vllm:cache_config_info kv_cache_size_tokens on /metrics",
                           "model_config": config.model_config_path}
    if "perplexity" in probes or "agreement" in probes:
        passages, source = power_plan.planned_passages(config)
        p = config.perplexity
        if "perplexity" in probes:
            out["perplexity"] = {"passages": passages, "source": source, "reference_repeats": p.reference_repeats,
                                 "num_concurrent": p.num_concurrent, "delta_unit": p.delta_unit,
                                 "prefill_chunk_tokens": p.prefill_chunk_tokens}
        if "agreement" in probes:
            a = config.agreement
            out["agreement"] = {"passages": min(a.passages, passages) if passages else a.passages, "top_k": a.top_k,
                                "max_tokens_per_passage": a.max_tokens_per_passage, "concurrency": a.concurrency}
    if "needle" in probes:
        n = config.needle
        out["needle"] = {"count": n.count, **needle_grid(n, context), "min_length": n.min_length,
                         "max_tokens": n.max_tokens,
                         "templates": n.templates, "concurrency": n.concurrency, "seed": n.seed}
    if "tasks" in probes:
        t = config.tasks
        infos = found.get("tasks") or []
        out["tasks"] = {"names": t.names,
                        "documents": {i.name: i.documents for i in infos} or None,
                        "metric": {i.name: i.metric for i in infos} or dict(t.metric) or None,
                        "max_gen_toks": t.max_gen_toks, "limit": t.limit, "num_concurrent": t.num_concurrent}
    if "load" in probes:
        ld = config.load
        looks = ([ld.repeats] if ld.repeats is not None
                 else list(planned_looks(ld.max_blocks, ld.look_every, statistic=STATISTIC)))
        out["load"] = {
            "shapes": [{**s.describe(), "agents": list(s.agents), "last_turn_tokens": shape_need(s)}
                       for s in shapes_of(ld)],
            "mode": ld.mode, "rate": ld.rate, "requests_per_case": ld.requests_per_case, "duration_s": ld.duration_s,
            "endpoint": ld.endpoint, "latency_endpoint": ld.latency_endpoint,
            "design": "fixed" if ld.repeats is not None else "sequential", "looks": looks,
            "budget_s": ld.budget_s, "advisory": ld.advisory}
    if "fill" in probes:
        f = config.fill
        out["fill"] = {"fraction": f.fraction, "prompt_tokens": f.prompt_tokens, "concurrency": f.concurrency}
    return out


# -- the rough time ------------------------------------------------------------------------------

# The whole configured size of each probe costed by its own model (budget_cost), in its units.
WHOLE_SIZE: dict[str, Callable[[Config, dict[str, Any]], int]] = {
    "perplexity": lambda config, sizes: sizes["perplexity"]["passages"] or 16,
    "agreement": lambda config, sizes: sizes["agreement"]["passages"],
    "needle": lambda config, sizes: config.needle.count,
}


def _seconds(config: Config, probes: list[str], sizes: dict[str, Any], servers: int, max_model_len: int,
             speed: Speed, slow: bool) -> dict[str, float]:
    """Seconds per probe at one assumed speed, the whole configured size rather than the canary's: the
    probes' own cost models (prefill tokens over the servers, a decode allowance per answer), task
    documents costed like needles, and the load probe over its design."""
    rate, decode = speed
    smoke = config.smoke
    out = {"inventory": max_model_len * smoke.prompt_fraction / rate + smoke.max_tokens * decode}
    for probe in probes:
        if probe in WHOLE_SIZE and (cost := PROBES[probe].budget_cost) is not None:
            out[probe] = cost(config, servers, speed, max_model_len).seconds(WHOLE_SIZE[probe](config, sizes))
        elif probe == "tasks":
            documents = sum((sizes["tasks"]["documents"] or {}).values()) or 40 * len(config.tasks.names)
            out["tasks"] = power_plan.task_seconds(config, documents, servers, speed)
        elif probe == "load":
            pace = SLOW_LOAD if slow else FAST_LOAD
            out["load"] = load_probe.rough_seconds(config, servers, pace)[1 if slow else 0]
    return out


def estimate(config: Config, probes: list[str], sizes: dict[str, Any], context: Context) -> dict[str, Any]:
    """A rough range: every probe costed at the fast and at the slow assumed speed (the load probe to
    the design's first look at the fast one, to its last at the slow one). Fill is not costed: it serves
    each server's claimed KV capacity, unknown before the inventory."""
    servers = len(config.servers)
    length = context.tightest or ASSUMED_MAX_MODEL_LEN
    fast = _seconds(config, probes, sizes, servers, length, FAST, slow=False)
    slow = _seconds(config, probes, sizes, servers, length, SLOW, slow=True)
    return {
        "rough": True,
        "low_s": round(sum(fast.values())), "high_s": round(sum(slow.values())),
        "by_probe": {p: [round(fast[p]), round(slow[p])] for p in fast},
        "not_costed": [p for p in probes if p == "fill"],
        "assumed": {"prompt_tokens_per_s": [FAST[0], SLOW[0]], "s_per_decoded_token": [FAST[1], SLOW[1]],
                    "load": {k: [f, s] for k, f, s in zip(LoadPace._fields, FAST_LOAD, SLOW_LOAD, strict=True)},
                    "max_model_len": None if context.tightest else ASSUMED_MAX_MODEL_LEN, "servers": servers},
    }


def power_of(config: Config, probes: list[str], sizes: dict[str, Any], documents: dict[str, int],
             context: Context) -> dict[str, Any]:
    """The plan's power for a candidate equal to the reference (kvprobe.evaluate.power_plan), each size that
    would reach 0.8 costed at the fast and the slow assumed speed."""
    passages = (sizes.get("perplexity") or {}).get("passages")
    plan = power_plan.plan_power(config, probes, documents=documents, passages=passages,
                                 max_model_len=context.tightest or ASSUMED_MAX_MODEL_LEN, speeds=(FAST, SLOW),
                                 load_paces=(FAST_LOAD, SLOW_LOAD))
    return plan.as_dict()


# -- the whole plan ------------------------------------------------------------------------------

@dataclass
class Plan:
    data: dict[str, Any]
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def build_plan(config: Config, source: str, probes: str | None = None, max_model_len: int | None = None,
               reached: list[Reached] | None = None) -> Plan:
    """Everything `kvprobe check` says about a config that loaded; `problems` are one line each."""
    from kvprobe.verdict.design import sizing_notes

    chosen, problems = choose_probes(config, probes)
    knob_problems, warnings = knob_lines(config, source)
    # Two servers at one URL: eval runs it as an A/A comparison; as a servers.toml for CI it is a slip.
    problems += shared_urls(config, source) + knob_problems
    warnings = unset_keys(config, source) + warnings
    model, model_problems, notes = model_config_facts(config, source)
    problems += model_problems
    found, preflight = preflight_problems(config, chosen)
    problems += preflight
    if reached:
        problems += [r.error for r in reached if not r.ok and r.error]
    context = context_of(config, max_model_len, reached, model)
    failed = [p for p, got in found.items() if got is None]
    not_measured, fit_problems = fit(config, [p for p in chosen if p not in failed], context)
    problems += fit_problems
    runnable = [p for p in chosen if p not in not_measured]
    if not problems:
        warnings += cannot_adopt(config, chosen, not_measured)
    sizes = probe_settings(config, chosen, context, found) if not problems else {}
    documents = {i.name: i.documents for i in found.get("tasks") or []}
    data: dict[str, Any] = {
        "servers_file": source,
        "valid": not problems,
        "knob": config.knob,
        "reference": config.reference.name,
        "servers": [server_row(s) for s in config.servers],
        "probes": chosen,
        "probes_chosen_by": "--probes" if probes else "default",
        "not_measured": not_measured,
        "settings": sizes,
        "bars": config.bars.model_dump(mode="json"),
        "sizing": sizing_notes(config, runnable, documents) if not problems else [],
        "max_model_len": {"value": context.tightest, "source": context.source,
                          "per_server": context.lengths if context.source else None},
        "model_config": model,
        "reach": [r.as_dict() for r in reached] if reached is not None else None,
        "notes": notes,
        "estimate": estimate(config, runnable, sizes, context) if not problems else None,
        "power": power_of(config, runnable, sizes, documents, context) if not problems else None,
        "problems": problems,
        "warnings": warnings,
    }
    return Plan(data, problems, warnings)


# -- words ---------------------------------------------------------------------------------------

def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _settings_line(probe: str, s: dict[str, Any]) -> str:
    if probe == "capacity":
        mm = f"; memory map of {s['model_config']}" if s.get("model_config") else ""
        return f"KV tokens from /metrics (vllm:cache_config_info){mm}"
    if probe == "perplexity":
        count = f"{s['passages']} passages" if s["passages"] else "every passage"
        return (f"{count} ({s['source']}), the reference measured {s['reference_repeats']} times, "
                f"{s['num_concurrent']} requests in flight, delta on {s['delta_unit']} perplexity")
    if probe == "agreement":
        return (f"{s['passages']} passages, top-{s['top_k']} logprobs, up to {_n(s['max_tokens_per_passage'])} "
                f"tokens each, {s['concurrency']} request(s) in flight")
    if probe == "needle":
        depths = s.get("depths") or []
        if s.get("lengths"):
            lengths = s["lengths"]
            grid = (f"{len(lengths)} length(s) ({_n(lengths[0])}-{_n(lengths[-1])} tokens)" if len(lengths) > 1
                    else f"1 length ({_n(lengths[0])} tokens)")
        elif s.get("lengths_count"):
            grid = (f"{s['lengths_count']} lengths (sized at the inventory: {_n(s['min_length'])} tokens up to "
                    f"max_model_len - {_n(s['max_tokens'])})")
        else:
            grid = f"no lengths ({s['sized']})"
        return (f"{s['count']} needles over {grid} x {len(depths)} depth(s), answer cap {_n(s['max_tokens'])} "
                f"tokens, templates {', '.join(s['templates'])}, {s['concurrency']} in flight")
    if probe == "tasks":
        docs = s.get("documents") or {}
        metric = s.get("metric") or {}
        names = ", ".join(f"{t} ({docs[t]} documents, {metric.get(t, 'its first metric')})" if t in docs else t
                          for t in s["names"])
        return f"{names}; answer cap {_n(s['max_gen_toks'])} tokens, {s['num_concurrent']} in flight"
    if probe == "load":
        shapes = "; ".join(
            f"shape {sh['shape']}: agents {sh['agents']}, {sh['turns']} turns x "
            f"{_n(sh['tokens_per_turn'])} tokens + {_n(sh['system_tokens'])} system, {sh['max_output_tokens']} out "
            f"(last turn ~{_n(sh['last_turn_tokens'])} tokens)" for sh in s["shapes"])
        loop = "closed loop" if s["mode"] == "closed" else f"open loop at {s['rate']} requests/s"
        design = (f"a fixed design of {s['looks'][0]} paired blocks" if s["design"] == "fixed"
                  else f"sequential paired blocks, looks at {', '.join(map(str, s['looks']))}")
        endpoint = f"endpoint {s['endpoint']}" + (f" and {s['latency_endpoint']}" if s["latency_endpoint"] else "")
        budget = f"; budget {s['budget_s']:g} s" if s["budget_s"] else ""
        advisory = "; advisory (never gates)" if s["advisory"] else ""
        return f"{shapes}; {loop}; {design}; {endpoint}{budget}{advisory}"
    if probe == "fill":
        prompt = f"{_n(s['prompt_tokens'])}-token prompts" if s["prompt_tokens"] else "max_model_len prompts"
        return f"{s['fraction']:g} x each server's claimed KV tokens in {prompt}, {s['concurrency']} in flight"
    return ""


def describe(data: dict[str, Any]) -> list[str]:
    """A valid plan in lines, for the terminal and a CI log."""
    warned = f", with {len(data['warnings'])} warning(s) (on stderr)" if data["warnings"] else ""
    lines = [f"{data['servers_file']}: valid{warned}; nothing was measured",
             f"knob: {data['knob']} (the one setting the servers may differ in)",
             f"servers ({len(data['servers'])}):"]
    width = max(len(s["name"]) for s in data["servers"])
    where = max(len(s["host_port"]) for s in data["servers"])
    for s in data["servers"]:
        key = (f"API key from ${s['api_key_env']} ({'set' if s['api_key_set'] else 'not set'})" if s["api_key_env"]
               else "no API key")
        model = f", model {s['model']}" if s.get("model") else ""
        lines.append(f"  {s['name']:<{width}}  {s['host_port']:<{where}}  {s['role']:<9}  {key}{model}")
    which = "from --probes" if data["probes_chosen_by"] == "--probes" else "the default set"
    lines.append(f"probes ({which}): {', '.join(data['probes'])}")
    for probe in data["probes"]:
        if probe in data["not_measured"]:
            lines.append(f"  {probe:<10}  not measured: {data['not_measured'][probe]}")
        elif probe in data["settings"]:
            lines.append(f"  {probe:<10}  {_settings_line(probe, data['settings'][probe])}")
    mml = data["max_model_len"]
    if mml["source"]:
        values = sorted({v for v in (mml["per_server"] or {}).values() if v})
        shown = ", ".join(_n(v) for v in values)
        lines.append(f"max_model_len: {shown}, from {mml['source']}: the probe settings were checked against it")
    else:
        lines.append("max_model_len: not known, so whether the probe settings fit the servers is not checked "
                     "(give --max-model-len, or --reach to read it from /v1/models)")
    if data.get("model_config"):
        mc = data["model_config"]
        lines.append(f"model_config: {mc['path']} (readable by the memory map)")
    for r in data.get("reach") or []:
        lines.append(f"reach: {r['name']}: /health ok; /v1/models {', '.join(r['models'])}"
                     + (f" (max_model_len {_n(r['max_model_len'])})" if r["max_model_len"] else ""))
    bars = data["bars"]
    set_bars = ", ".join(f"{k} {v}" for k, v in bars.items() if v is not None)
    unset = [k for k, v in bars.items() if v is None]
    lines.append(f"bars: {set_bars}" + (f" ({', '.join(unset)} not set)" if unset else ""))
    lines += [f"sizing: {line}" for line in data["sizing"]]
    lines += [f"note: {line}" for line in data["notes"]]
    est = data["estimate"]
    if est:
        parts = ", ".join(f"{p} {span(*v)}" for p, v in est["by_probe"].items())
        assumed = est["assumed"]
        length = (f"; an {_n(assumed['max_model_len'])}-token context assumed" if assumed["max_model_len"] else "")
        left = f"; {', '.join(est['not_costed'])} not costed (it serves each server's claimed KV pool)" \
            if est["not_costed"] else ""
        lines.append(
            f"estimate (rough): {span(est['low_s'], est['high_s'])} for {assumed['servers']} servers ({parts}), "
            f"from {assumed['prompt_tokens_per_s'][0]:,.0f} down to {assumed['prompt_tokens_per_s'][1]:,.0f} prompt "
            f"tokens/s and {assumed['s_per_decoded_token'][0] * 1000:.0f}-"
            f"{assumed['s_per_decoded_token'][1] * 1000:.0f} ms a decoded token, assumed: no server was measured"
            f"{length}{left}; `kvprobe canary --budget` sizes a run from a real first-prefill smoke")
    if data.get("power"):
        lines += power_plan.lines(data["power"])
    return lines
