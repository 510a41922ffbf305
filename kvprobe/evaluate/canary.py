"""`kvprobe canary`: the same verdict from a fast subset of every probe, and drift against a baseline.

The subset is the config's own probe settings made small (a setting already smaller is kept):
inventory smoke, capacity, 4 perplexity passages, 1 agreement passage, 8 needles, one load case of
2 agents in up to 8 paired blocks. Minutes, not hours; the bars are the same as for a full run. At these sizes a
wrecked format fails, but nothing can pass a quality bar (that needs 8 passages and ~35 needles): the
canary catches breakage and drift, the full eval decides adoption.

Drift against a verified baseline verdict (same servers file, earlier run): a server's capacity
that fell by more than capacity_gain_min, a candidate's perplexity delta that rose by more than
perplexity_delta_max, or its needle recall that fell by more than needle_recall_drop_max fail the
canary; other changes (version, model, capacity up, decisions) are reported as notes.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from kvprobe.config import Config

# The fewest that can still fail a wrecked format (a t interval over 2 passages has 1 degree of freedom and
# spans -77%..+484% for a +16% rise; 4 lost needles of 4 cannot clear a 0.10 margin, 8 can); too few to pass.
CANARY_PERPLEXITY = {"limit": 4}
CANARY_AGREEMENT = {"passages": 1, "max_tokens_per_passage": 512}
CANARY_NEEDLE = {"count": 8}
# Speed: the full eval's sequential design on one small case, up to 8 blocks (looks at 4 and 8), stopped
# at the --budget like everything else.
CANARY_LOAD = {"agents": [2], "max_blocks": 8, "look_every": 4, "turns": 2, "requests_per_case": 4}


def _smaller(current: Any, fast: Any) -> Any:
    if isinstance(fast, list):
        return fast if not current else [min(current)]
    if current is None:
        return fast
    return min(current, fast)


def canary_config(config: Config, budgeted: bool = False) -> Config:
    """`budgeted`: passages and needles keep the config's own counts, as the most a --budget may grow
    them to (kvprobe.evaluate.budget sizes them); agreement and the load shape are the canary's either way."""
    def shrink(settings: Any, fast: dict[str, Any], **fixed: Any) -> Any:
        # Built with the operator's own fields_set: model_copy would mark the canary's sizes as written in
        # servers.toml, and a probe whose kvprobe defaults do not fit the servers would then stop the run
        # instead of being not measured (kvprobe.evaluate.orchestrate.fit_phase).
        values = {**dict(settings), **{k: _smaller(getattr(settings, k), v) for k, v in fast.items()}, **fixed}
        return type(settings).model_construct(settings.model_fields_set, **values)

    update: dict[str, Any] = {
        "agreement": shrink(config.agreement, CANARY_AGREEMENT),
        "load": shrink(config.load, CANARY_LOAD, duration_s=None),
    }
    if not budgeted:
        update["perplexity"] = shrink(config.perplexity, CANARY_PERPLEXITY)
        update["needle"] = shrink(config.needle, CANARY_NEEDLE)
    return config.model_copy(update=update)


def canary_probes() -> list[str]:
    """Capacity and every probe that is installed, in run order."""
    from kvprobe.probes import default_probes

    return default_probes()


def _servers_of(verdict: dict[str, Any], probe: str) -> dict[str, Any]:
    return ((verdict.get("probes") or {}).get(probe) or {}).get("servers") or {}


def _perplexity_delta(verdict: dict[str, Any], name: str) -> float | None:
    """A candidate's perplexity delta as its check judged it: the probe records per-passage numbers
    only (rules/3), and a rules/2 verdict's check carries the same value as its evidence did."""
    checks = ((verdict.get("decisions") or {}).get(name) or {}).get("checks") or []
    check = next((c for c in checks if c.get("bar") == "perplexity_delta_max"), None)
    value = (check or {}).get("value")
    return float(value) if isinstance(value, int | float) else None


def compare_with_baseline(base: dict[str, Any], cur: dict[str, Any], source: str) -> dict[str, Any]:
    bars = cur.get("bars") or {}
    items: list[dict[str, Any]] = []

    def add(server: str, what: str, was: Any, now: Any, severity: str, text: str) -> None:
        items.append({"server": server, "what": what, "was": was, "now": now, "severity": severity,
                      "text": f"{server}: {text}"})

    base_servers, cur_servers = base.get("servers") or {}, cur.get("servers") or {}
    for name in sorted(set(base_servers) ^ set(cur_servers)):
        add(name, "server", name in base_servers, name in cur_servers, "note",
            "only in the baseline" if name in base_servers else "new since the baseline")
    gain_min = bars.get("capacity_gain_min") or 0.0
    for name in [n for n in cur.get("order") or cur_servers if n in base_servers]:
        was, now = base_servers[name], cur_servers[name]
        for key in ("version", "model", "model_root", "max_model_len", "cache_dtype"):
            if was.get(key) != now.get(key):
                add(name, key, was.get(key), now.get(key), "note", f"{key} changed: {was.get(key)} -> {now.get(key)}")
        t0, t1 = was.get("kv_cache_tokens"), now.get("kv_cache_tokens")
        if t0 and t1 and t0 != t1:
            change = (t1 - t0) / t0
            severity = "fail" if change < -gain_min else "note"
            add(name, "kv_cache_tokens", t0, t1, severity,
                f"capacity changed {t0:,} -> {t1:,} tokens ({change * 100:+.1f}%)")
        if name == cur.get("reference"):
            continue
        p0, p1 = _perplexity_delta(base, name), _perplexity_delta(cur, name)
        bar = bars.get("perplexity_delta_max")
        if p0 is not None and p1 is not None and bar is not None:
            moved = p1 - p0
            if abs(moved) > bar:
                add(name, "perplexity_delta", p0, p1, "fail" if moved > 0 else "note",
                    f"perplexity delta moved {p0 * 100:+.2f}% -> {p1 * 100:+.2f}% "
                    f"({moved * 100:+.2f} points, bar {bar * 100:.2f}%)")
        n0, n1 = _servers_of(base, "needle").get(name) or {}, _servers_of(cur, "needle").get(name) or {}
        bar = bars.get("needle_recall_drop_max")
        if n0.get("recall") is not None and n1.get("recall") is not None and bar is not None:
            fell = n0["recall"] - n1["recall"]
            if fell > bar:
                add(name, "needle_recall", n0["recall"], n1["recall"], "fail",
                    f"needle recall fell {n0['recall']:.2f} -> {n1['recall']:.2f} (bar {bar:.2f})")
        d0 = ((base.get("decisions") or {}).get(name) or {}).get("decision")
        d1 = ((cur.get("decisions") or {}).get(name) or {}).get("decision")
        if d0 != d1:
            add(name, "decision", d0, d1, "note", f"decision {d0} -> {d1}")
    return {
        "baseline": source,
        "baseline_run": (base.get("run") or {}).get("id"),
        "items": items,
        "fails": [i["text"] for i in items if i["severity"] == "fail"],
    }


def drift_table(drift: dict[str, Any]) -> Table:
    table = Table(title=f"Drift against the baseline {drift['baseline_run']}", header_style="bold")
    for col in ("server", "what", "was", "now", "severity", "detail"):
        table.add_column(col, overflow="fold")
    for item in drift["items"]:
        style = "red" if item["severity"] == "fail" else "dim"
        table.add_row(item["server"], item["what"], str(item["was"]), str(item["now"]),
                      f"[{style}]{item['severity']}[/{style}]", item["text"])
    if not drift["items"]:
        table.caption = "no drift: same capacity, quality within the bars"
    return table
