"""`kvprobe compare A B`: what changed between two verdicts of the same comparison, the nightly drift view.

Both verdicts are verified first (kvprobe.verdict.verify: the signature, and the decisions re-derived from their
own numbers); a verdict that does not verify cannot be compared, unless the operator says --unsigned,
and then every line that follows says it was not verified.

Per candidate: the decision A -> B, the capacity ratio A -> B, and each check (by its stable id) whose
outcome or value moved. A regression is a candidate whose decision got worse (adopt > no_gain =
inconclusive > reject > broken = invalid: no_gain and inconclusive are both "not adopted, nothing failed"),
a candidate decided in A and missing from B, or a non-advisory check that passed in A and fails in B.

Beside them, the paired evidence: where both runs measured the same cases (needle cases by id and target
cell, perplexity and agreement passages by document with the same length, task documents by id), the
change B - A on exactly those cases with a 95% interval that fits the data: Tango's score interval and
McNemar's exact p for 0/1 outcomes (kvprobe.stats, the needle and task checks' own), a t interval over
the paired differences otherwise. It describes; it does not gate: the verdicts' own checks judge.
The server facts canary --baseline reads (version, model, max_model_len, capacity, and its point-estimate
drift) are shown as it reads them (kvprobe.evaluate.canary.compare_with_baseline).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvprobe.errors import ConfigError, KvprobeError
from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.report import cells
from kvprobe.report.platform_text import platform_short
from kvprobe.server.platform import Platform
from kvprobe.verdict.build import rederive, same

SCHEMA = "kvprobe.compare/1"

# Higher is better. no_gain and inconclusive tie: neither is adopted and neither failed a bar.
DECISION_RANK = {"adopt": 3, "no_gain": 2, "inconclusive": 2, "reject": 1, "broken": 0, "invalid": 0}
OUTCOME_RANK = {"pass": 2, "inconclusive": 1, "not_measured": 1, "fail": 0}


@dataclass
class Side:
    """One verdict to compare and how far it was checked."""

    label: str  # "A" or "B"
    path: Path  # its verdict.json
    verdict: dict[str, Any]
    verified: bool
    signer: str | None
    how: str  # one line: what was checked

    def as_dict(self) -> dict[str, Any]:
        run = self.verdict.get("run") or {}
        return {"path": str(self.path), "run": run.get("id"), "rules": self.verdict.get("rules"),
                "verified": self.verified, "signer": self.signer, "how": self.how}


def _one_line(exc: Exception) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def load_side(label: str, target: Path, allowed_signers: Path | None, unsigned: bool) -> Side:
    """The verdict at `target` (a run directory or its verdict.json), verified; ConfigError (one line)
    when it cannot be compared. With `unsigned`, a verdict that does not verify is compared as it is."""
    from kvprobe.verdict.verify import locate, verify_verdict

    try:
        path = locate(target)
    except ConfigError as exc:
        raise ConfigError([f"{label} {line}" for line in exc.problems]) from None
    try:
        result = verify_verdict(path, allowed_signers)
    except KvprobeError as exc:
        reason = _one_line(exc)
        if not unsigned:
            raise ConfigError([f"{label} {target}: {reason}: compare needs two verified verdicts (--unsigned "
                               "compares them as they are, and says so)"]) from None
    else:
        signer = result.signer
        return Side(label, path, result.verdict, True, signer.fingerprint,
                    f"signed by {signer.fingerprint} ({', '.join(signer.principals)} in {result.allowed_source}); "
                    "decisions re-derived")
    try:
        verdict = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError([f"{label} {path}: not a readable verdict: {exc}"]) from None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("decisions"), dict):
        raise ConfigError([f"{label} {path}: not a kvprobe verdict (no decisions)"])
    problems = rederive(verdict)
    follows = ("its decisions follow from its numbers" if not problems
               else f"its decisions do NOT follow from its numbers ({problems[0]})")
    return Side(label, path, verdict, False, None, f"NOT VERIFIED (--unsigned): {reason}; {follows}")


# -- checks and decisions ------------------------------------------------------------------------

def check_key(check: dict[str, Any]) -> str:
    """A check's stable id; rules/2 verdicts had none, so what it measures stands in (its metric and case, as
    the summary names it: `kvprobe_qa exact_match drop`, not `tasks.kvprobe_qa.kvprobe_qa exact_match drop`)."""
    if check.get("id"):
        return str(check["id"])
    return cells.label(check)


def _check_view(check: dict[str, Any] | None) -> dict[str, Any] | None:
    if check is None:
        return None
    # `shown`: the figure as every other surface shows it (a speed check as its ratio: kvprobe.report.cells)
    return {"outcome": check.get("outcome"), "value": check.get("value"), "interval": check.get("interval"),
            "shown": cells.estimate_text(check), "gating": check.get("gating", True),
            "advisory": bool(check.get("advisory")), "text": check.get("text")}


def _checks(verdict: dict[str, Any], cand: str) -> dict[str, dict[str, Any]]:
    decision = (verdict.get("decisions") or {}).get(cand) or {}
    return {check_key(c): c for c in decision.get("checks") or []}


def compare_checks(a: dict[str, Any], b: dict[str, Any], cand: str) -> tuple[list[dict[str, Any]], int]:
    """(every check whose outcome or value moved, or that only one side has; how many did not move)."""
    ca, cb = _checks(a, cand), _checks(b, cand)
    changed: list[dict[str, Any]] = []
    unchanged = 0
    for key in [*ca, *(k for k in cb if k not in ca)]:
        was, now = _check_view(ca.get(key)), _check_view(cb.get(key))
        if was is not None and now is not None:
            moved_outcome = was["outcome"] != now["outcome"]
            if not moved_outcome and same(was["value"], now["value"]) and same(was["interval"], now["interval"]):
                unchanged += 1
                continue
            change = "outcome" if moved_outcome else "value"
            rank_a, rank_b = OUTCOME_RANK.get(was["outcome"], 1), OUTCOME_RANK.get(now["outcome"], 1)
            direction = "worse" if rank_b < rank_a else "better" if rank_b > rank_a else "same"
        else:
            change, direction = ("only_a" if now is None else "only_b"), "same"
        # Advisory speed never changes a decision or an exit code, so it cannot regress one either.
        regression = bool(was and now and was["outcome"] == "pass" and now["outcome"] == "fail"
                          and not now["advisory"])
        label = cells.label(cb.get(key) or ca[key])
        changed.append({"id": key, "label": label, "a": was, "b": now, "change": change, "direction": direction,
                        "regression": regression})
    return changed, unchanged


def _pair(was: Any, now: Any) -> dict[str, Any]:
    return {"a": was, "b": now, "changed": not same(was, now)}


def compare_candidate(a: dict[str, Any], b: dict[str, Any], cand: str) -> dict[str, Any]:
    da, db = (a.get("decisions") or {}).get(cand), (b.get("decisions") or {}).get(cand)
    out: dict[str, Any] = {"in_a": da is not None, "in_b": db is not None}
    da, db = da or {}, db or {}
    dec_a, dec_b = da.get("decision"), db.get("decision")
    worse = (dec_a is not None and dec_b is not None
             and DECISION_RANK.get(dec_b, 0) < DECISION_RANK.get(dec_a, 0))
    out["decision"] = {**_pair(dec_a, dec_b), "worse": worse}
    out["capacity_ratio"] = _pair(da.get("capacity_ratio"), db.get("capacity_ratio"))
    out["kv_cache_tokens"] = _pair(da.get("kv_cache_tokens"), db.get("kv_cache_tokens"))
    out["checks"], out["unchanged_checks"] = compare_checks(a, b, cand)
    regressions = []
    if worse:
        regressions.append(f"{cand}: decision {dec_a} -> {dec_b}")
    if dec_a is not None and dec_b is None:
        regressions.append(f"{cand}: decided in A ({dec_a}), no decision in B")
    regressions += [f"{cand}: {c['label']} pass -> fail" for c in out["checks"] if c["regression"]]
    out["regressions"] = regressions
    return out


# -- paired evidence -----------------------------------------------------------------------------

def _fmt_interval(lo: float, hi: float, scale: float = 1.0, digits: int = 3) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval"
    return f"[{lo * scale:+.{digits}f}, {hi * scale:+.{digits}f}]"


def _binary(name: str, evidence: str, pairs: list[tuple[int, int]], note: str = "") -> dict[str, Any]:
    """Paired 0/1 outcomes (A, B): the change B - A with Tango's score interval and McNemar's exact p."""
    from kvprobe.stats import mcnemar_p, paired_binary_interval

    n = len(pairs)
    lost = sum(1 for x, y in pairs if x and not y)
    gained = sum(1 for x, y in pairs if y and not x)
    row: dict[str, Any] = {"server": name, "evidence": evidence, "pairs": n, "method": "tango", "lost": lost,
                           "gained": gained, "a": sum(x for x, _ in pairs), "b": sum(y for _, y in pairs),
                           "note": note}
    if n == 0:
        return row | {"difference": None, "interval": None, "p": None}
    drop = paired_binary_interval(n, lost, gained)  # A - B: flipped to B - A (+ 0.0: no "-0.000")
    return row | {"difference": -drop.estimate + 0.0, "interval": [-drop.hi + 0.0, -drop.lo + 0.0],
                  "p": mcnemar_p(lost, gained)}


def _continuous(name: str, evidence: str, pairs: list[tuple[float, float]], unit: str,
                note: str = "") -> dict[str, Any]:
    """Paired numbers (A, B): the mean change B - A with a t interval (n - 1 df)."""
    from kvprobe.stats import mean_t_interval

    n = len(pairs)
    row: dict[str, Any] = {"server": name, "evidence": evidence, "pairs": n, "method": "t", "unit": unit,
                           "identical": sum(1 for x, y in pairs if x == y), "note": note,
                           "a": math.fsum(x for x, _ in pairs) / n if n else None,
                           "b": math.fsum(y for _, y in pairs) / n if n else None}
    if n == 0:
        return row | {"difference": None, "interval": None, "df": None}
    iv = mean_t_interval([y - x for x, y in pairs])
    return row | {"difference": iv.estimate, "interval": [iv.lo, iv.hi] if n > 1 else None, "df": iv.df}


def _probe(verdict: dict[str, Any], name: str) -> dict[str, Any]:
    return (verdict.get("probes") or {}).get(name) or {}


def _needle_cases(verdict: dict[str, Any], server: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in _probe(verdict, "needle").get("cases") or []
            if c.get("server") == server and "id" in c}


def paired_needles(a: dict[str, Any], b: dict[str, Any], server: str) -> dict[str, Any] | None:
    """The server's hits on the needle cases both runs asked, by id and the same target cell (length and
    depth): a run with other lengths asked other questions under the same ids. A case that errored or ran
    to the cap scores as a miss, as the needle checks score it."""
    ca, cb = _needle_cases(a, server), _needle_cases(b, server)
    if not ca or not cb:
        return None
    pairs: list[tuple[int, int]] = []
    other_cell = 0
    for cid in sorted(set(ca) & set(cb)):
        x, y = ca[cid], cb[cid]
        if (x.get("target_length"), x.get("target_depth")) != (y.get("target_length"), y.get("target_depth")):
            other_cell += 1
            continue
        pairs.append((int(x.get("status") == "hit"), int(y.get("status") == "hit")))
    left = len(set(ca) ^ set(cb)) + other_cell
    note = f"{left} case(s) not in both runs at the same cell" if left else ""
    return _binary(server, "needle hits", pairs, note)


def _passages(verdict: dict[str, Any], server: str) -> dict[Any, tuple[float, float]]:
    """doc -> (loglikelihood, units) of one server's perplexity passages (verdicts of rules/3 on)."""
    s = (_probe(verdict, "perplexity").get("servers") or {}).get(server) or {}
    docs, lls, units = s.get("passage_doc"), s.get("passage_ll"), s.get("passage_units")
    if not (isinstance(docs, list) and isinstance(lls, list) and isinstance(units, list)):
        return {}
    return {d: (float(ll), float(u)) for d, ll, u in zip(docs, lls, units, strict=False) if u}


def paired_perplexity(a: dict[str, Any], b: dict[str, Any], cand: str) -> dict[str, Any] | None:
    """The candidate's per-passage perplexity delta against its own run's reference, paired by passage
    across the runs. Only passages of the same length in both (same text) and the same unit pair. The
    mean of per-passage deltas, not the check's ratio of sums: its change, not the check's value."""
    unit_a = _probe(a, "perplexity").get("unit", "byte")
    unit_b = _probe(b, "perplexity").get("unit", "byte")
    ref_a, ref_b = a.get("reference"), b.get("reference")
    pa, pb = _passages(a, cand), _passages(b, cand)
    ra, rb = _passages(a, str(ref_a)), _passages(b, str(ref_b))
    if not (pa and pb and ra and rb):
        return None
    if unit_a != unit_b:
        return _continuous(cand, "perplexity delta per passage", [], "points",
                           f"A is on {unit_a} perplexity, B on {unit_b}: not paired")
    pairs: list[tuple[float, float]] = []
    for doc in sorted(set(pa) & set(pb) & set(ra) & set(rb), key=str):
        if not (pa[doc][1] == pb[doc][1] == ra[doc][1] == rb[doc][1]):
            continue
        delta_a = math.expm1((ra[doc][0] - pa[doc][0]) / pa[doc][1])
        delta_b = math.expm1((rb[doc][0] - pb[doc][0]) / pb[doc][1])
        pairs.append((delta_a * 100, delta_b * 100))
    return _continuous(cand, f"{unit_a} perplexity delta per passage", pairs, "points")


def reference_passages(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """The reference's own loglikelihood per passage, across the runs: identical on a deterministic
    build, and the first thing to read when every candidate's delta moved."""
    ra, rb = _passages(a, str(a.get("reference"))), _passages(b, str(b.get("reference")))
    pairs = [(ra[d][0] / ra[d][1], rb[d][0] / rb[d][1]) for d in sorted(set(ra) & set(rb), key=str)
             if ra[d][1] == rb[d][1]]
    if not pairs:
        return None
    return _continuous(str(a.get("reference")), "loglikelihood per unit, per passage", pairs, "nats")


def paired_agreement(a: dict[str, Any], b: dict[str, Any], cand: str) -> dict[str, Any] | None:
    """The candidate's top-1 agreement per passage, by passage index, where both measured as many positions."""
    def rows(v: dict[str, Any]) -> list[tuple[float, float]]:
        s = (_probe(v, "agreement").get("servers") or {}).get(cand) or {}
        top1, positions = s.get("passage_top1_sum"), s.get("passage_positions")
        if not (isinstance(top1, list) and isinstance(positions, list)):
            return []
        return [(float(t), float(p)) for t, p in zip(top1, positions, strict=False)]

    xa, xb = rows(a), rows(b)
    if not xa or not xb:
        return None
    pairs = [(ta / pa_, tb / pb_) for (ta, pa_), (tb, pb_) in zip(xa, xb, strict=False) if pa_ and pa_ == pb_]
    return _continuous(cand, "top-1 agreement per passage", pairs, "share")


def paired_tasks(a: dict[str, Any], b: dict[str, Any], server: str) -> list[dict[str, Any]]:
    """The server's score per task document, by document id. 0/1 scores (an answer cut at the cap
    scores 0, as the task checks score it) get Tango's interval; other scores a t interval."""
    out = []
    ta, tb = _probe(a, "tasks").get("tasks") or {}, _probe(b, "tasks").get("tasks") or {}
    for task in [t for t in ta if t in tb]:
        def rows(t: dict[str, Any]) -> dict[Any, tuple[float, bool]]:
            got = ((t.get("servers") or {}).get(server) or {}).get("rows") or []
            return {r[0]: (float(r[1]), bool(r[2])) for r in got if isinstance(r, list) and len(r) >= 3}

        ra, rb = rows(ta[task]), rows(tb[task])
        if not ra or not rb:
            continue
        docs = sorted(set(ra) & set(rb), key=str)
        metric = ta[task].get("metric") or "score"
        note = "" if len(docs) == len(ra) == len(rb) else f"{len(set(ra) ^ set(rb))} document(s) not in both runs"
        scores = [s for d in docs for s in (ra[d][0], rb[d][0])]
        if ta[task].get("metric") != tb[task].get("metric"):
            out.append(_continuous(server, f"{task} {metric}", [], "score", "the runs scored different metrics"))
        elif all(s in (0.0, 1.0) for s in scores):
            pairs = [(int(ra[d][0] == 1.0 and not ra[d][1]), int(rb[d][0] == 1.0 and not rb[d][1])) for d in docs]
            out.append(_binary(server, f"{task} {metric}", pairs, note))
        else:
            out.append(_continuous(server, f"{task} {metric}", [(ra[d][0], rb[d][0]) for d in docs], "score", note))
    return out


def paired_evidence(a: dict[str, Any], b: dict[str, Any], candidates: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    ref = str(a.get("reference"))
    for name in [*candidates, ref]:
        got = [paired_needles(a, b, name)]
        if name != ref:
            got += [paired_perplexity(a, b, name), paired_agreement(a, b, name)]
        else:
            got.append(reference_passages(a, b))
        rows += [r for r in got if r is not None] + paired_tasks(a, b, name)
    return rows


# -- the platform --------------------------------------------------------------------------------

def platform_drift(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(each platform change, grouped over the servers it is the same for; notes on servers whose platform one
    side did not record). What the one-knob check recorded (pin.platforms) is compared field by field where
    both recorded the field: a verdict written before a field existed does not read as a change."""
    pa, pb = (a.get("pin") or {}).get("platforms"), (b.get("pin") or {}).get("platforms")
    if not isinstance(pa, dict) or not isinstance(pb, dict):
        missing = [label for label, p in (("A", pa), ("B", pb)) if not isinstance(p, dict)]
        return [], [f"{' and '.join(missing)} recorded no platform: whether the machine changed is not known"]
    changes: dict[tuple[str, str, str], list[str]] = {}
    unknown = []
    for name in [n for n in (a.get("order") or pa) if n in pb and n in pa]:
        x, y = pa[name], pb[name]
        if not isinstance(x, dict) or not isinstance(y, dict):
            if x != y:
                unknown.append(name)
            continue
        fields = sorted(k for k in set(x) & set(y) if x[k] != y[k])
        if fields:
            key = (platform_short(Platform.from_dict(x)), platform_short(Platform.from_dict(y)), ", ".join(fields))
            changes.setdefault(key, []).append(name)
    items = [{"server": ", ".join(names), "what": "platform", "was": was, "now": now, "severity": "note",
              "fields": fields.split(", "),
              "text": f"{', '.join(names)}: platform changed: {was} -> {now} ({fields})"}
             for (was, now, fields), names in changes.items()]
    notes = [f"{', '.join(unknown)}: platform not exposed on one side: whether it changed is not known"] if unknown \
        else []
    return items, notes


# -- the comparison ------------------------------------------------------------------------------

def _knob(verdict: dict[str, Any]) -> str:
    return (verdict.get("pin") or {}).get("knob") or DEFAULT_KNOB


def compare(a: Side, b: Side) -> dict[str, Any]:
    """The comparison of two loaded verdicts; ConfigError (one line) when they are not the same comparison."""
    from kvprobe.evaluate.canary import compare_with_baseline

    va, vb = a.verdict, b.verdict
    if va.get("reference") != vb.get("reference"):
        raise ConfigError([f"cannot compare: A's reference is {va.get('reference')!r}, B's is {vb.get('reference')!r}: "
                           "not the same comparison"])
    if _knob(va) != _knob(vb):
        raise ConfigError([f"cannot compare: A tests the knob {_knob(va)}, B tests {_knob(vb)}: not the same "
                           "comparison"])
    ref = va["reference"]
    order = [n for n in [*(va.get("decisions") or {}), *(vb.get("decisions") or {})] if n != ref]
    candidates = list(dict.fromkeys(order))
    notes = []
    if va.get("rules") != vb.get("rules"):
        notes.append(f"A was judged under {va.get('rules')}, B under {vb.get('rules')}: checks named differently "
                     "are listed as only in one")
    bars_a, bars_b = va.get("bars") or {}, vb.get("bars") or {}
    moved = sorted(k for k in set(bars_a) | set(bars_b) if not same(bars_a.get(k), bars_b.get(k)))
    if moved:
        notes.append("the bars differ (" + ", ".join(f"{k} {bars_a.get(k)} -> {bars_b.get(k)}" for k in moved)
                     + "): an outcome can move with its bar alone")
    notes += [f"{side.label} is not verified (--unsigned): what it says is compared as it is"
              for side in (a, b) if not side.verified]
    platform, unknown = platform_drift(va, vb)
    notes += unknown
    per = {c: compare_candidate(va, vb, c) for c in candidates}
    drift = compare_with_baseline(va, vb, str(a.path))
    regressions = [r for c in per.values() for r in c["regressions"]]
    changed = (any(c["decision"]["changed"] or c["capacity_ratio"]["changed"] or c["kv_cache_tokens"]["changed"]
                   or c["checks"] for c in per.values())
               or any(i["what"] != "decision" for i in drift["items"]) or bool(platform))
    result = {
        "schema": SCHEMA,
        "a": a.as_dict(), "b": b.as_dict(),
        "reference": ref, "knob": _knob(va),
        "verdict_exit_code": _pair(va.get("exit_code"), vb.get("exit_code")),
        "recommendation": _pair((va.get("recommendation") or {}).get("server"),
                                (vb.get("recommendation") or {}).get("server")),
        "candidates": per,
        "paired": paired_evidence(va, vb, candidates),
        "drift": platform + [i for i in drift["items"] if i["what"] != "decision"],
        "notes": notes,
        "changed": changed,
        "platform_changed": bool(platform),
        "regressions": regressions,
    }
    return result | {"conclusion": conclusion(result)}


# -- words ---------------------------------------------------------------------------------------

def _check_text(view: dict[str, Any] | None) -> str:
    if view is None:
        return "absent"
    return f"{view['outcome']} {view['shown']}"


def _ratio(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, int | float) else "-"


def _tokens(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else "-"


def paired_line(row: dict[str, Any]) -> str:
    """One row of paired evidence in words, its size and its interval honest at any n."""
    head = f"paired {row['evidence']} ({row['pairs']} in both runs)"
    if row["pairs"] == 0:
        return f"{head}: nothing to pair" + (f"; {row['note']}" if row["note"] else "")
    if row["method"] == "tango":
        n = row["pairs"]
        text = (f"{head}: {row['a']}/{n} -> {row['b']}/{n}, change {row['difference']:+.3f} "
                f"{_fmt_interval(*row['interval'])} (Tango), {row['lost']} lost, {row['gained']} gained, "
                f"McNemar p {row['p']:.2g}")
    else:
        scale = {"points": "points", "nats": "nats", "share": "", "score": ""}[row["unit"]]
        unit = f" {scale}" if scale else ""
        interval = (_fmt_interval(*row["interval"], digits=4) + f" (t, {row['df']:.0f} df)" if row["interval"]
                    else "no interval from 1 pair")
        text = (f"{head}: mean {row['a']:+.4f} -> {row['b']:+.4f}{unit}, change {row['difference']:+.4f}{unit} "
                f"{interval}; {row['identical']}/{row['pairs']} identical")
    return text + (f"; {row['note']}" if row["note"] else "")


def conclusion(result: dict[str, Any]) -> str:
    """The answer in one line, said first: regression or not, and why; with a platform change, that the
    difference may be the machine's."""
    if result["regressions"]:
        head = "regression: " + "; ".join(result["regressions"])
    elif result["changed"]:
        head = "no regression: some figures moved, no decision got worse and no check went from pass to fail"
    else:
        head = "no regression: nothing changed (decisions, capacities, every check's outcome and value)"
    moved = [i for i in result["drift"] if i["what"] == "platform"]
    if moved:
        head += ("; but the platform changed (" + "; ".join(f"{i['was']} -> {i['now']}" for i in moved)
                 + "), so a difference between A and B is not attributable to the software")
    return head


def _gating(change: dict[str, Any]) -> bool:
    return bool((change["b"] or change["a"] or {}).get("gating", True))


def describe(result: dict[str, Any], verbose: bool = False) -> list[str]:
    """The comparison in lines, for the terminal and a CI log: the conclusion first, then what it rests on.
    The checks that never gate (the speed guardrails, 20 a candidate) are one count line unless `verbose` or
    one of them went pass -> fail: listed, they were most of a 122-line comparison."""
    lines = [result["conclusion"]]
    for label in ("a", "b"):
        side = result[label]
        lines.append(f"{label.upper()}: {side['path']}: {side['how']}; {side['rules']}, run {side['run']}")
    lines.append(f"comparison: reference {result['reference']}, knob {result['knob']}; the verdicts' exit code "
                 f"{result['verdict_exit_code']['a']} -> {result['verdict_exit_code']['b']}; recommendation "
                 f"{result['recommendation']['a']} -> {result['recommendation']['b']}")
    lines += [f"note: {n}" for n in result["notes"]]
    lines += [f"drift: {i['text']}" + (" (beyond a bar by its point estimate: canary --baseline fails on it)"
                                       if i["severity"] == "fail" else "") for i in result["drift"]]
    paired = result["paired"]
    for cand, c in result["candidates"].items():
        d = c["decision"]
        mark = "  REGRESSION" if d["worse"] or (c["in_a"] and not c["in_b"]) else ""
        lines.append(f"{cand}: decision {d['a'] or 'absent'} -> {d['b'] or 'absent'}; capacity "
                     f"{_ratio(c['capacity_ratio']['a'])} -> {_ratio(c['capacity_ratio']['b'])} "
                     f"({_tokens(c['kv_cache_tokens']['a'])} -> {_tokens(c['kv_cache_tokens']['b'])} KV tokens)"
                     + mark)
        listed = [verbose or ch["regression"] or _gating(ch) for ch in c["checks"]]
        folded = [ch for ch, shown in zip(c["checks"], listed, strict=True) if not shown]
        for ch in (ch for ch, shown in zip(c["checks"], listed, strict=True) if shown):
            tag = "  REGRESSION" if ch["regression"] else f"  ({ch['direction']})" if ch["direction"] != "same" else ""
            was, now = _check_text(ch["a"]), _check_text(ch["b"])
            finer = " (moved by less than the figures show)" if was == now else ""
            lines.append(f"  {ch['label']}: {was} -> {now}{finer}{tag}")
        if folded:
            kinds = Counter(ch["change"] for ch in folded)
            ways = Counter(ch["direction"] for ch in folded)
            moved = kinds["outcome"] + kinds["value"]
            parts = ([f"{moved} moved ({ways['worse']} worse, {ways['better']} better)"] if moved else []) + [
                f"{kinds[k]} only in {side}" for k, side in (("only_a", "A"), ("only_b", "B")) if kinds[k]]
            lines.append(f"  guardrails (never gating, none pass -> fail): {', '.join(parts)}: --verbose lists them")
        lines.append(f"  {c['unchanged_checks']} check(s) unchanged" if c["checks"] or c["unchanged_checks"] else
                     "  no checks")
        lines += [f"  {paired_line(r)}" for r in paired if r["server"] == cand]
    ref_rows = [r for r in paired if r["server"] == result["reference"]]
    if ref_rows:
        lines.append(f"{result['reference']} (reference):")
        lines += [f"  {paired_line(r)}" for r in ref_rows]
    return lines
