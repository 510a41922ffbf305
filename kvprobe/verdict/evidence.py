"""Read a run directory into the verdict's inputs: the recorded numbers, nothing decided yet.

Each probe's summary (DIR/<probe>.json) is read by one small function here, so a change in a
probe's output shape is adapted in one place. A probe that did not run reads as None and the
verdict says so. The result is plain JSON data: it goes into verdict.json as the evidence that
`kvprobe verify` re-derives the decisions from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvprobe.probes import ORDER
from kvprobe.run.store import RunDir

PROBES = ORDER  # kvprobe.probes: the one list

_INVENTORY_KEYS = ("role", "status", "error", "version", "model", "model_root", "max_model_len", "cache_dtype",
                   "has_tokenize")


def _scalars(row: dict[str, Any]) -> dict[str, Any]:
    """Numbers, strings, booleans and [lo, hi] pairs of a summary row; big arrays stay in the events log."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        elif (isinstance(value, list) and len(value) == 2
              and all(isinstance(v, int | float) or v is None for v in value)):
            out[key] = list(value)
    return out


def _servers_of(data: dict[str, Any]) -> dict[str, Any]:
    """Per-server rows whether the probe wrapped them in "servers" or not."""
    if isinstance(data.get("servers"), dict):
        return data["servers"]
    return {k: v for k, v in data.items() if isinstance(v, dict) and k not in ("pin", "settings", "bars")}


def _numbers(value: Any) -> list[Any] | None:
    """A list of numbers (None allowed), or of such lists: per-passage evidence the checks judge from."""
    if not isinstance(value, list):
        return None
    if all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in value):
        return list(value)
    if all(isinstance(v, list) for v in value):
        rows = [_numbers(v) for v in value]
        return rows if all(r is not None for r in rows) else None
    return None


def read_per_server(data: dict[str, Any], arrays: tuple[str, ...] = ()) -> dict[str, Any]:
    """capacity, agreement, fill: each server's scalars, and the named per-unit arrays (a server that
    died filling its pool is `broken` through the run's broken events, and fill keeps its numbers)."""
    servers = {}
    for name, row in _servers_of(data).items():
        servers[name] = _scalars(row)
        for key in arrays:
            got = _numbers(row.get(key))
            if got is not None:
                servers[name][key] = got
    return {"servers": servers}


def read_perplexity(data: dict[str, Any]) -> dict[str, Any]:
    """Per server its perplexities and, passage by passage, the loglikelihoods the check judges from
    (the reference's repeated runs too); the unit the delta is on."""
    out = read_per_server(data, ("passage_doc", "passage_ll", "passage_units", "repeat_ll"))
    out["unit"] = data.get("unit") if isinstance(data.get("unit"), str) else "byte"
    return out


def read_agreement(data: dict[str, Any]) -> dict[str, Any]:
    return read_per_server(data, ("passage_kl_sum", "passage_top1_sum", "passage_positions"))


def read_capacity(data: dict[str, Any]) -> dict[str, Any]:
    """Per-server capacity, and with `model_config` what the memory map says of each candidate under the
    capacity bar (`explain`) and which knob moves capacity (`lever`): the verdict quotes them."""
    out = read_per_server(data)
    memmap = data.get("memmap") if isinstance(data.get("memmap"), dict) else {}
    explain = memmap.get("explain") if isinstance(memmap.get("explain"), dict) else {}
    out["explain"] = {k: v for k, v in explain.items() if isinstance(v, str)}
    lever = memmap.get("lever") if isinstance(memmap.get("lever"), dict) else {}
    if isinstance(lever.get("sentence"), str):
        out["lever"] = lever["sentence"]
    return out


_CASE_KEYS = ("id", "server", "status", "target_length", "target_depth", "length_tokens", "depth_tokens", "found_in",
              "approximate")


def read_needle(data: dict[str, Any]) -> dict[str, Any]:
    cases = []
    for case in data.get("cases") or []:
        if not isinstance(case, dict) or "server" not in case or "status" not in case:
            continue
        row = {k: case.get(k) for k in _CASE_KEYS if k in case}
        if isinstance(row.get("found_in"), list):
            row["found_in"] = ",".join(map(str, row["found_in"]))
        cases.append(row)
    cases.sort(key=lambda c: (str(c["server"]), str(c.get("id"))))
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    cap = settings.get("max_tokens")
    return {"servers": {name: _scalars(row) for name, row in _servers_of(data).items()
                        if name not in ("settings", "heatmaps", "paired")},
            "cases": cases, "cap": cap if isinstance(cap, int) else None}


def read_load(data: dict[str, Any]) -> dict[str, Any]:
    servers: dict[str, Any] = {}
    for name, row in _servers_of(data).items():
        cases = []
        for case in row.get("cases") or []:
            if not isinstance(case, dict):
                continue
            flat = _scalars(case)
            # A case that carries its repeats keeps each repeat's numbers: the intervals come from them.
            if isinstance(case.get("repeats"), list):
                flat["repeats"] = [_scalars(r) for r in case["repeats"] if isinstance(r, dict)]
            cases.append(flat)
        servers[name] = {**_scalars(row), "cases": cases}
    out: dict[str, Any] = {"servers": servers}
    # The speed design declared before the run (the checks compute its boundaries) and why the probe
    # stopped measuring a candidate before the design's last block (a budget, a broken server).
    for key in ("design", "stops", "sizing"):
        if isinstance(data.get(key), dict):
            out[key] = _scalars(data[key])
    plan = data["design"].get("plan") if isinstance(data.get("design"), dict) else None
    if isinstance(plan, dict) and isinstance(plan.get("statistic"), str):
        # The statistic the design was declared with (rules/5's robust one): without it the checks would judge
        # the blocks with rules/4's t and its looks. A rules/4 plan names none, and its evidence stays as it was.
        out["design"]["plan"] = {"statistic": plan["statistic"]}
    if isinstance(data.get("sizing"), dict) and isinstance(data["sizing"].get("pilot"), dict):
        out["sizing"]["pilot"] = _scalars(data["sizing"]["pilot"])
    if isinstance(data.get("duty_cycle"), int | float):
        out["duty_cycle"] = data["duty_cycle"]
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    if "design" not in out and isinstance(settings.get("repeats"), int):
        # Written before the sequential design: its repeats ran every server back to back, interleaved,
        # which is a fixed design of that many blocks.
        out["design"] = {"repeats": settings["repeats"]}
    return out


def read_tasks(data: dict[str, Any]) -> dict[str, Any]:
    """Per task: its kind and metric, and per server its own score and every document as [doc, score,
    cut at the cap]: the checks pair them with the reference's."""
    tasks: dict[str, Any] = {}
    for name, task in (data.get("tasks") or {}).items():
        if not isinstance(task, dict):
            continue
        servers = task.get("servers") if isinstance(task.get("servers"), dict) else {}
        rows = {}
        for server, row in servers.items():
            if not isinstance(row, dict):
                continue
            rows[server] = _scalars(row)
            docs = row.get("rows")
            if isinstance(docs, list):
                rows[server]["rows"] = [[r[0], r[1], bool(r[2])] for r in docs
                                        if isinstance(r, list) and len(r) == 3
                                        and all(isinstance(v, int | float) for v in r)]
        tasks[name] = {**_scalars(task), "servers": rows}
    cap = data.get("max_gen_toks")
    return {"tasks": tasks, "cap": cap if isinstance(cap, int) else None}


READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "capacity": read_capacity,
    "perplexity": read_perplexity,
    "agreement": read_agreement,
    "needle": read_needle,
    "tasks": read_tasks,
    "load": read_load,
    "fill": read_per_server,
}


def _capacity_from_inventory(inventories: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Capacity is known from /metrics even when the capacity probe was not asked for."""
    servers = {}
    for name, inv in inventories.items():
        cap = inv.get("capacity") or {}
        servers[name] = {"kv_cache_tokens": cap.get("kv_cache_tokens"), "estimate": cap.get("estimate"),
                         "max_concurrency": cap.get("max_concurrency"), "cache_dtype": inv.get("cache_dtype"),
                         "source": "inventory"}
    return {"servers": servers}


def _inventory_summary(inv: dict[str, Any]) -> dict[str, Any]:
    out = {k: inv.get(k) for k in _INVENTORY_KEYS}
    cap = inv.get("capacity") or {}
    out["kv_cache_tokens"] = cap.get("kv_cache_tokens")
    out["kv_cache_tokens_estimate"] = cap.get("estimate")
    out["max_concurrency"] = cap.get("max_concurrency")
    smoke = inv.get("smoke") or {}
    out["smoke_ok"] = smoke.get("ok")
    out["smoke_prompt_tokens"] = smoke.get("prompt_tokens")
    return out


def broken_during_run(run: RunDir) -> dict[str, str]:
    """Servers a probe marked broken, with their first error. Sticky across --resume: a server that
    failed under a probe once in this run is broken even if it served again after a restart."""
    broken: dict[str, str] = {}
    for event in run.events("broken"):
        server = event.get("server")
        if server and server not in broken:
            broken[server] = str(event.get("error"))
    return dict(sorted(broken.items()))


def gather(run: RunDir) -> dict[str, Any]:
    """Everything the decisions depend on, read from the run directory."""
    meta = run.read_json("run.json")
    config = meta.get("config") or {}
    servers_cfg = config.get("server") or []
    reference = next((s["name"] for s in servers_cfg if s.get("role") == "reference"), None)
    inventories: dict[str, dict[str, Any]] = {}
    for server in servers_cfg:
        name = server["name"]
        if run.has(f"inventory/{name}.json"):
            inventories[name] = run.read_json(f"inventory/{name}.json")
    servers = {}
    for server in servers_cfg:
        name = server["name"]
        inv = inventories.get(name)
        row = _inventory_summary(inv) if inv else {"status": "not_inventoried"}
        row["role"] = server.get("role", "candidate")
        servers[name] = row

    probes: dict[str, Any] = {}
    for probe in PROBES:
        file = f"{probe}.json"
        probes[probe] = READERS[probe](run.read_json(file)) if run.has(file) else None
    capacity_source = "probe"
    if probes["capacity"] is None and inventories:
        probes["capacity"] = _capacity_from_inventory(inventories)
        capacity_source = "inventory"

    pin = run.read_json("capacity.json").get("pin") if run.has("capacity.json") else None
    if pin is None:
        pin = next((e for e in reversed(list(run.events("pin")))), None)
        if pin is not None:
            pin = {k: v for k, v in pin.items() if k not in ("t", "kind")}
    requested = list(meta.get("probes") or [])
    cut = {e.get("probe") for e in run.events("budget_cut")}
    # Probes the fit phase found unable to run on these servers at kvprobe's defaults, with why. The
    # newest word per probe wins: a later session that ran it, or was cut running it, clears it; one
    # that found it unable again says so with its own reason.
    cannot: dict[str, str] = {}
    for event in run.events():
        probe = event.get("probe")
        if event.get("kind") == "probe_cannot_run" and isinstance(probe, str):
            cannot[probe] = str(event.get("reason"))
        elif event.get("kind") in ("probe_done", "budget_cut") and isinstance(probe, str):
            cannot.pop(probe, None)
    return {
        "reference": reference,
        "order": [s["name"] for s in servers_cfg],
        "bars": config.get("bars") or {},
        "servers": servers,
        "pin": pin,
        "broken": broken_during_run(run),
        "probes": probes,
        "probes_status": {
            p: ("ran" if probes[p] is not None and not (p == "capacity" and capacity_source == "inventory")
                else "from inventory" if p == "capacity" and probes[p] is not None
                else f"cannot run: {cannot[p]}" if p in cannot
                else "cut at the budget" if p in cut
                else "requested, no results" if p in requested else "not run")
            for p in PROBES
        },
    }
