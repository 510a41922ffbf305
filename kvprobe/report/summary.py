"""The answer in a few lines: per candidate one line per axis (capacity, quality, speed, serving), then
its decision and what would settle anything unsettled. What `eval`, `canary` and `report` print by
default; `--verbose` adds the full tables.

Every figure is the check's own (kvprobe.report.cells words them), so the summary says what the signed
verdict says. Lines are wrapped here (kvprobe.report.wrap), between figures: a narrow terminal never cuts one,
nor an interval's two ends apart.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from kvprobe.load import spec_decode
from kvprobe.probes import on_axis
from kvprobe.report import cells
from kvprobe.report.terminal import OUTCOME_STYLE
from kvprobe.report.wrap import wrap

QUALITY_PROBES = on_axis("quality")
AXIS = 9  # "capacity " etc.: the label column


def _word(word: str) -> str:
    style = OUTCOME_STYLE.get(word)
    return f"[{style}]{escape(word)}[/{style}]" if style else escape(word)


def check_text(check: dict[str, Any]) -> str:
    """`perplexity delta -0.57% [-1.12%, -0.05%] (bar 1.00%) pass`; a speed check as its ratio (cells.figure)."""
    shown = cells.estimate_text(check)
    value = "" if shown in ("-", "") else f" {shown}"
    bar = f" (bar {cells.limit_text(check)})" if check.get("limit") is not None else ""
    return f"{escape(cells.label(check))}{escape(value)}{escape(bar)} {_word(cells.outcome_word(check))}"


def _tally(checks: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for c in checks:
        counts[cells.outcome_word(c)] = counts.get(cells.outcome_word(c), 0) + 1
    return ", ".join(f"{n} {_word(w)}" for w, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _speed(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return "not measured"
    primary = [c for c in checks if str(c.get("id", "")).startswith("load.endpoint.")]
    if primary:  # rules/4: the declared endpoint decides; guardrails only count when they fail
        guards = [c for c in checks if not c.get("gating", True)]
        failed = [c for c in guards if c["outcome"] == "fail"]
        extra = (f" · guardrails: {len(failed)} of {len(guards)} [red]fail[/red]" if failed
                 else f" · guardrails: none of {len(guards)} fail" if guards else "")
        return " · ".join(check_text(c) for c in primary) + extra
    # Older rules judged every case: the tally, and the worst case in full.
    worst = min(checks, key=lambda c: ("fail", "inconclusive", "not_measured", "pass").index(c["outcome"])
                if c["outcome"] in ("fail", "inconclusive", "not_measured", "pass") else 4)
    return f"{len(checks)} checks: {_tally(checks)}; e.g. {check_text(worst)}"


def _serving(verdict: dict[str, Any], name: str, checks: list[dict[str, Any]]) -> str:
    server = (verdict.get("servers") or {}).get(name) or {}
    smoke = server.get("smoke_ok")
    parts = ["smoke " + ("not run" if smoke is None else
                         f"ok ({server['smoke_prompt_tokens']:,} tokens)" if smoke and server.get("smoke_prompt_tokens")
                         else "ok" if smoke else "[red]failed[/red]")]
    fill = [c for c in checks if c.get("probe") == "fill"]
    status = (verdict.get("probes_status") or {}).get("fill")
    parts.append(" · ".join(check_text(c) for c in fill) if fill else f"fill {escape(status or 'not run')}")
    if server.get("status") not in (None, "ok"):
        parts.append(f"[red]{escape(str(server.get('error') or server['status']))}[/red]")
    return " · ".join(parts)


def _settle(checks: list[dict[str, Any]]) -> list[str]:
    """What would settle each unsettled check that holds the candidate back (client-limited ones in one
    line: the advice is the same for all)."""
    out = []
    unsettled = [c for c in checks if c["outcome"] == "inconclusive" and cells.holds_back(c)]
    limited = [c for c in unsettled if cells.client_limited(c)]
    if limited:
        out.append(f"{len(limited)} speed check(s) not judged, the client was the bottleneck: "
                   f"{cells.CLIENT_LIMITED_ADVICE}")
    for c in unsettled:
        power = c.get("power") or {}
        if cells.client_limited(c):
            continue
        if (endpoint := cells.sequential_settle(c)) is not None:
            how = endpoint
        elif power.get("needed"):
            how = f"about {power['needed']:,} {power.get('unit') or 'samples'} (now {power.get('n')})"
        else:
            how = "more samples, or a quieter box"
        out.append(f"{escape(cells.label(c))}: {escape(how)}")
    return out


def candidate_rows(verdict: dict[str, Any], name: str, more: str = "--verbose, or report.html"
                   ) -> list[tuple[str, str]]:
    """The summary's rows of one candidate, (axis, rich markup); `more`: where the settling advice cut at four
    continues."""
    d = verdict["decisions"][name]
    checks = d.get("checks") or []
    ref = verdict.get("reference")
    tokens = d.get("kv_cache_tokens")
    ref_tokens = ((verdict.get("servers") or {}).get(ref) or {}).get("kv_cache_tokens")
    ratio = d.get("capacity_ratio")
    capacity = "-" if ratio is None else f"{ratio:.2f}x" + (
        f" ({tokens:,} vs {ref_tokens:,} KV tokens)" if tokens and ref_tokens else "")
    quality = [c for c in checks if c.get("probe") in QUALITY_PROBES]
    rows = [("capacity", capacity)]
    rows += [("quality" if i == 0 else "", check_text(c)) for i, c in enumerate(quality)] or [("quality",
                                                                                              "not measured")]
    rows += [("speed", _speed([c for c in checks if c.get("probe") == "load"])),
             ("serving", _serving(verdict, name, checks))]
    if d["decision"] in ("invalid", "broken", "no_gain") and d.get("reasons"):
        rows.append(("why", escape(d["reasons"][0])))
    settle = _settle(checks) if d["decision"] == "inconclusive" else []
    rows += [("to settle" if i == 0 else "", s) for i, s in enumerate(settle[:4])]
    if len(settle) > 4:
        rows.append(("", f"and {len(settle) - 4} more ({more})"))
    return rows


def _lines(markup: str, width: int, head: str = "") -> list[Text]:
    """`markup` wrapped at `width` by kvprobe.report.wrap (an interval's two ends stay on one line), after `head`
    and under it, with no padding after the last word."""
    body = Text.from_markup(markup)
    plain = body.plain
    out, pos = [], 0
    for i, line in enumerate(wrap(plain, max(width - len(head), 20))):
        start = plain.index(line, pos)
        pos = start + len(line)
        out.append(Text(head if i == 0 else " " * len(head)) + body[start:pos])
    return out


def summary(verdict: dict[str, Any], width: int) -> list[Text]:
    """The whole summary at `width` columns: a heading, per candidate its decision and a line per axis
    (the axis, then its figures, wrapped under themselves), then the recommendation."""
    rec = verdict.get("recommendation") or {}
    pin = verdict.get("pin") or {}
    knob = pin.get("knob") or "kv_cache_dtype"
    one_knob = ("" if not pin else f" · one-knob check valid ({escape(knob)})" if pin.get("valid")
                else " · one-knob check [magenta]INVALID[/magenta]")
    out = _lines(f"reference [bold]{escape(str(verdict.get('reference')))}[/bold] · {len(verdict['decisions'])} "
                 f"candidate(s){one_knob} · {escape(str(verdict.get('rules', '')).removeprefix('kvprobe.'))}", width)
    for name, d in verdict["decisions"].items():
        out += _lines(f"[bold]{escape(name)}[/bold]: {_word(d['decision'])}", width)
        for axis, text in candidate_rows(verdict, name):
            out += _lines(text, width, f"  {axis}".ljust(AXIS + 3))
    if rec.get("server") is not None:
        change = "adopt" if rec.get("change") else "keep"
        out += _lines(f"[bold]recommendation: {change} {escape(str(rec['server']))}[/bold]", width)
        if (caveat := kept_but_broke(verdict)) is not None:
            out += _lines("but " + escape(caveat), width, "  ")
    return out


def kept_but_broke(verdict: dict[str, Any]) -> str | None:
    """What keeping the reference leaves out when the reference itself broke during the run: the rules still
    say keep it (no candidate was adopted), but the server the operator runs today hung or failed under the
    probes, which is the first thing to fix. None when the recommended server did not break."""
    rec = verdict.get("recommendation") or {}
    server = rec.get("server")
    if rec.get("change") or server is None or server not in (verdict.get("broken") or {}):
        return None
    return f"{server} itself broke during this run: fix it, then rerun to finish the comparison"


def _accept(summary: dict[str, Any] | None, name: str) -> str | None:
    """A server's draft acceptance pooled over its load cases, where it decodes speculatively."""
    cases = (((summary or {}).get("servers") or {}).get(name) or {}).get("cases") or []
    if not spec_decode.any_recorded(cases):
        return None
    return spec_decode.shown(spec_decode.pooled(cases))


def _unbarred(probe: str, summary: dict[str, Any] | None, name: str) -> str:
    """A probe measured with no bar declared: its headline figures, judged by nothing."""
    row = (summary or {}).get(name) if probe == "agreement" else None
    if isinstance(row, dict) and row.get("top1_agreement") is not None:
        return (f"top-1 agreement {row['top1_agreement']:.1%}, mean KL {row.get('kl_mean', 0):.3g} over "
                f"{row.get('positions', 0):,} positions (no bar set: not judged)")
    return "measured; no bar set (the report shows it)"


def probe_lines(probe: str, checks: dict[str, list[dict[str, Any]]], summary: dict[str, Any] | None = None
                ) -> list[str]:
    """As a probe ends: one line per candidate with the checks the verdict will carry (the full table
    comes once, at the end, with --verbose). The load line adds draft acceptance beside speed where a
    server decodes speculatively: shown, not judged."""
    lines = []
    ref = (summary or {}).get("reference")
    for cand, cs in checks.items():
        own = [c for c in cs if c.get("probe") in (None, probe)]
        if probe == "load":
            text = _speed(own)
            accept = _accept(summary, cand)
            if accept is not None:
                ref_accept = _accept(summary, ref) if ref else None
                text += f" · spec accept {accept}" + (f" vs {ref_accept}" if ref_accept else "")
        else:
            text = " · ".join(check_text(c) for c in own) or _unbarred(probe, summary, cand)
        lines.append(f"{probe}: [bold]{escape(cand)}[/bold] {text}")
    return lines


def print_probe(console: Console, probe: str, checks: dict[str, list[dict[str, Any]]],
                summary: dict[str, Any] | None = None) -> None:
    for line in probe_lines(probe, checks, summary):
        console.print(line, highlight=False)


def decision_lines(verdict: dict[str, Any]) -> list[str]:
    """`--quiet`: one line per candidate, `fp8: inconclusive`."""
    return [f"{name}: {d['decision']}" for name, d in verdict["decisions"].items()]


def print_summary(console: Console, verdict: dict[str, Any]) -> None:
    for line in summary(verdict, console.width):
        # Wrapped already: soft_wrap prints each line as it is (a path longer than the terminal whole, for the
        # terminal to fold, never cropped)
        console.print(line, highlight=False, soft_wrap=True)
