"""Whether dropping client-limited blocks selects on the outcome (issue #33), under rules/5 and rules/6 side by
side. The throughput endpoint drops a block when, in any case of its scope, the client could have moved the
paired ratio by over a quarter of the bar, or a client used a whole core (speed._throughput_limited):

  rules/5 (sealed, kvprobe.verdict.sealed.rules5): d = e_cand - e_ref, each side's e = the client's mean loop
      lag over that server's own median request span (e2e p50). One loop lag reads larger on the faster server,
      so d moves with the case's own log ratio L = log(ref / cand tok/s) (d ~ -e L): the drop is a selection.
  rules/6 (live, kvprobe.stats.client_limit.paired_lateness): effect = (lag_cand - lag_ref) / the shared span
      sqrt(e2e_p50_ref x e2e_p50_cand). One lag on both sides gives 0 whatever the spans, so the effect moves
      with L only through what the lags themselves do. The live Blocks also takes each case's
      kvprobe.stats.client_limit.lateness_move out of its ratio (part 3).

  1. measure: every (run, candidate, case, repeat) pair of tests/fixtures/runs/*/load.json that carries the
     client figures; the paired log ratio L, rules/5's d (the sealed throughput_effect per side) and rules/6's
     effect (paired_lateness); the OLS fit of each on L (pooled and per run), its slope's standard error and
     residual sd; and what each rule drops per run (the sealed Blocks for rules/5, the live Blocks for rules/6,
     on each run's endpoint scope, with the shipped bars);
  2. simulate full sequential runs of the shipped design (servers.toml [load]: max_blocks, look_every, the
     robust statistic, as benchmarks/operating_characteristics.py builds it): 5 cases a block, each case's
     L = truth + N(0, 0.137) (the CPU demo pilot's per-case spread), the block loss the mean over cases; each
     case's lateness under a rule = a + b L + (scale x) a residual, a, b and the residuals the rule's pooled
     fit, each case's residual pair drawn from the recorded pairs, the same pair for both rules (plus whole
     cores at their measured share, for both); a block is dropped when any case's |lateness| > 0.25 x bar
     (checked against each rule's own Blocks below) and a fresh one runs in its place, at most the probe's
     spare max(2, n_max // 4) beyond n_max (kvprobe/probes/load.py: "drop+spare"; "no spare" is a run whose
     budget holds only n_max blocks); a run that ends with fewer usable blocks than n_max decides only at the
     planned looks it reached (as sequential.settle, which the verdict calls: checked below). Decisions by
     sequential.decide. Truth on the bar and equal; no drop, and each rule's drop on the same paths.
     rules/6's model is the mechanism's: with one loop lag on both sides plus per-side lag noise its effect is
     (lag_c - lag_r) / shared span, so L enters only through the fitted b' (near 0, printed) and the residual.
     Scenarios, and how each rules/6 stress is matched to rules/5's:
       measured       each rule's own fit, residual as recorded;
       3x, 10x        rules/5: 3x, 10x its b; rules/6: 3x, 10x its b' (the lateness 3 and 10 times what was
                      recorded, the lag noise kept as recorded, for both);
       busy client    rules/5: b = -0.024 (e ~ -b at one loop lag: a client 2.4% of a span late on both
                      sides, the upper lateness speed.py quotes for a CPU demo); rules/6: the same lag level,
                      b' times the same factor (-0.024 / rules/5's b), residual as recorded;
       ~5/10/30% drop rules/5: the b that drops that share of an equal candidate's blocks, residual as
                      recorded (the most selective way to reach a drop rate); rules/6: its fitted b', residual
                      scaled by the factor (printed) that drops the same share of an equal candidate's blocks
                      (rules/6 cannot reach a drop rate through L: a larger lag difference noise is the only way);
       busy client, within b'  rules/5 as busy client; rules/6: b' = -0.024 x (rules/6's within-comparison slope
                      over rules/5's), the L-dependence the GPU runs show inside a comparison (the pooled b' is
                      near 0 partly because xeon-amx-demo's scatter dilutes it);
       fixed-lag      rules/5: d = a + b (1 - exp(-L)) (= e_ref (exp(-L) - 1) at one lag: the same slope at
                      L = 0, flatter where the candidate is much slower), b = -0.024 or re-found per drop rate;
                      rules/6 has no such form (one lag cancels whatever the spans) and its cell is the linear
                      scenario's, printed again beside it.
     Three noises, each giving the block loss the shape of a sequential.FAMILY member (the cases spread
     normally around their block's mean): normal; exponential (right skew, the member that sets the robust c
     at this design: P(pass | at the bar) 0.023 here with no drop); AR(1) 0.5 over the blocks. speed.py's "busy
     client (3.5% of a span late on both sides) ... passed 12%" is the ~5% drop stress below (b = -0.0346).
  3. attenuation (lines "atten"): the lateness also moves the ratio. Each case's observed
     L_obs = L + k log((1 + e exp(-L)) / (1 + e)): one loop lag, e of the reference's span, on both sides
     (spans 1 and exp(L)), each side's throughput over 1 + lag / its own span; k = 1 where the agents do not
     saturate the server (the model), 0 at capacity. The observed lags are that level plus per-side lag noise,
     lag_r, lag_c = e -+ delta / 2, delta over the shared span rules/6's modelled effect (a + b' L + scale x the
     recorded residual); the noise moves what the rules read (drop, correction), not the ratio. Levels e 0.0018
     (recorded), 0.024, 0.035, b' scaled with e as for the busy client; the drop stresses at the level where
     rules/5's own drop on these lags takes 5/10/30% of an equal candidate's blocks (e 0.033, 0.039, 0.051),
     rules/6 at that level with its lag noise scaled as in 2 (3.3/10.3/35.8x). On the same paths (drop+spare):
     no client effect (no drop); rules/5 (d = lag_c / span_c - lag_r, nothing corrected); rules/6 drop only (the
     previous commit); rules/6 corrected (the product: each case's log1p(lag_c / span_c) - log1p(lag_r / span_r)
     taken out, checked against lateness_move and Blocks.losses). Normal and exponential noise.

Measured inputs (from tests/fixtures/runs; part 1 prints them afresh):
848 pairs of 23 candidate comparisons in 13 runs: amd-avx2-demo, h100-pinned, h200-canary-5m, h200-fp8-pair,
h200-gpu, h200-long-cases, h200-placement-pinned, h200-placement-unpinned, h200-quantized-default, h200-slow-twin,
h200-speed-sized, h200-twins-default, xeon-amx-demo (h200-gpu-hybrid-kv/-ssm carry no load.json). e = lag / own
span: median 0.0018 per side (p90 0.0025; run medians 0.0008-0.0037), max 0.035 (one xeon-amx-demo fp8 case); no
whole-core event (0 of 1696 case runs); no pair that rules/5 reads and rules/6 cannot. rules/5's d on L: pooled
b = -0.0015 (se 0.0002, r -0.21, xeon-amx-demo diluting it; per GPU run -0.0010 to -0.0021, r -0.65 to -0.92;
within comparisons -0.0016), residual sd 0.0013 pooled (0.0001-0.0002 on the GPU runs, 0.0067 on xeon-amx-demo).
rules/6's effect on L: pooled b' = +0.00005 (se 0.00023, r +0.01), residual sd 0.0012 pooled; per GPU run
+0.00006 to +0.00064 (r +0.12 to +0.67; 6 of 10 over 2 se), within comparisons +0.00016, -0.10 x rules/5's: one
loop lag on both sides holds to about nine tenths (a lag growing as span^0.09 would give this). Both rules drop
the same 1 pair, 1 block (xeon-amx-demo, fp8: an outlier of the residual, not of L).

Result (60,000 paths a cell; P(pass | at the bar) with spare, no spare in brackets; no drop: exponential 0.0230,
normal 0.0021). rules/6's fitted slope on L is +0.00005 (se 0.00023) pooled, so its drop does not select: at every
stress its P(pass | at the bar) is no drop's (within noise) or below (fewer blocks), where rules/5's rises.
Exponential noise: busy client rules/5 0.0278 (0.0264), rules/6 0.0229 (0.0225); ~5% drop rules/5 0.1185 (0.0935),
rules/6 0.0232 (0.0211), matched by 3.32 x the recorded residual; ~10% 0.2521 vs 0.0228; ~30% 0.6382 vs 0.0182;
rules/6 at the within-comparison b' (+0.0024 for the busy client) gives the same figures as at the pooled one.
Normal noise: ~5% drop 0.0073 vs 0.0022, ~30% 0.0856 vs 0.0011. The price is power where drops are many: P(pass |
equal), exponential, no drop 0.9906; ~5% drop rules/5 0.9998, rules/6 0.9910 (0.9814 no spare); ~30% 1.0000 vs
0.9618 (0.8639): rules/5's trimmed blocks sharpened its estimate, rules/6's are blocks lost. One lag on both sides
also moves the ratio itself (each side's throughput over 1 + lag / its own span reads L as about (1 - e) L, towards
0): part 3, its own seeds, 60,000 paths a cell (no client effect: exponential 0.0249, normal 0.0022). P(pass | at
the bar), k = 1 / k = 0: exponential, e 0.024: rules/5 0.0308 / 0.0246, rules/6 drop only 0.0308 / 0.0246, rules/6
corrected 0.0250 / 0.0199; e 0.035: 0.0449 / 0.0326, 0.0339 / 0.0246, 0.0251 / 0.0181. Normal, e 0.024: 0.0029 /
0.0021, 0.0031 / 0.0022, 0.0023 / 0.0016; e 0.035: 0.0025 / 0.0013, 0.0035 / 0.0022, 0.0023 / 0.0014. At e 0.0018
every variant is within 0.0005 of no client effect. Corrected at k = 1 is no client effect (a kept block's loss
moved -0.00007 / -0.00009, against -0.00097 / -0.00140 left in); at capacity it over-corrects (+0.00090 /
+0.00131 a block), the candidate looking slower: conservative, for P(pass | equal) exponential 0.9890 (e 0.024)
and 0.9882 (0.035) against 0.9907 drop only, normal 0.9990 and 0.9989 against 0.9992. Drop stresses, exponential:
rules/5's selection and the move add up (~30%: 0.3748 k = 1, 0.2678 k = 0); rules/6 drop only is over 0.025 at
k = 1 (~5/10/30%: 0.0325, 0.0344, 0.0293), corrected under it (0.0234, 0.0224, 0.0144; k = 0: 0.0178, 0.0156,
0.0101), the lag noise it reads as lateness costing equal power at ~30% (0.9544 against 0.9708 drop only, k = 1).

Seeded; prints figures one a line, each naming its scenario and rule; never asserts timing. The line groups run in
two processes (--jobs; the figures do not depend on it).

    .venv/bin/python benchmarks/client_limited_selection.py               # 60,000 paths a cell, ~1.8 min on 2 cores
    .venv/bin/python benchmarks/client_limited_selection.py --paths 4000  # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
from pathlib import Path

import numpy as np

from kvprobe.config import load_config
from kvprobe.stats import sequential
from kvprobe.stats.client_limit import CPU_LIMIT, lateness_move, paired_lateness
from kvprobe.verdict.checks import speed as speed6
from kvprobe.verdict.checks.speed import THROUGHPUT, _scope
from kvprobe.verdict.sealed.rules5 import speed as speed5
from kvprobe.verdict.sealed.rules5.client_limit import throughput_effect

ROOT = Path(__file__).resolve().parent.parent
SERVERS_TOML = ROOT / "servers.toml"
RUNS = ROOT / "tests" / "fixtures" / "runs"
SEED = 20261207
CASES = 5
CASE_SPREAD = 0.137  # per-case sd of the paired log ratio, the CPU demo pilot's
LIMIT_SHARE = 0.25  # speed._throughput_limited: a lateness difference over this share of the bar
BUSY_SLOPE = -0.024  # rules/5: b ~ -e at a fixed loop lag, a client 2.4% late on both sides
TARGET_DROPS = (0.05, 0.10, 0.30)
CHUNK = 5_000
NOISES = ("normal", "exponential", "ar1-0.5")
R5, R6 = "rules/5", "rules/6"
RULES = (R5, R6)
LINEAR, FIXED_LAG = "linear", "fixed-lag"
FORMS = (LINEAR, FIXED_LAG)
Model = tuple[str, str, float, float]  # (rule, form, slope on L, residual scale)
LagModel = tuple[float, float, float]  # (lag level e of the reference's span, rules/6's b', lag noise scale)
LAG_LEVELS = (0.0018, 0.024, 0.035)  # the recorded median e, the busy client, speed.py's 3.5%
SATURATION = (1.0, 0.0)  # k: the share of the lateness's move the ratio takes (1 unsaturated, 0 at capacity)
ATTEN_NOISES = ("normal", "exponential")
VARIANTS = ("rules/5", "rules/6 drop only", "rules/6 corrected")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float, float]:
    """(slope, its standard error, intercept, r, residual sd) of y on x."""
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    sd = float(resid.std(ddof=2))
    r = float(np.corrcoef(x, y)[0, 1]) if y.std() > 0 else 0.0
    return float(b), sd / math.sqrt(float(((x - x.mean()) ** 2).sum())), float(a), r, sd


def p_text(passed: float, failed: float, sims: int) -> str:
    """'P(pass) p [lo, hi]  P(fail) f': a cell's pass rate with its Wilson interval, and its fail rate."""
    lo, hi = wilson(int(passed), sims)
    return f"P(pass) {passed / sims:.4f} [{lo:.4f}, {hi:.4f}]  P(fail) {failed / sims:.4f}"


def alpha_flag(passed: float, truth: float, sims: int) -> str:
    """For a candidate on the bar (truth > 0): whether the false-pass rate's interval is over, under or holds 0.025."""
    if truth <= 0:
        return ""
    lo, hi = wilson(int(passed), sims)
    return "  over 0.025" if lo > sequential.ALPHA else ("  under 0.025" if hi < sequential.ALPHA else "  0.025 inside")


def q(x: np.ndarray) -> str:
    fin = x[np.isfinite(x)]
    return f"median {np.median(fin):.4f} p90 {np.quantile(fin, 0.9):.4f} max {fin.max():.4f}"


def measure(bars: object) -> dict[str, object]:
    """Every paired (case, repeat) of every recorded run with client figures: rules/5's difference e_cand - e_ref
    (the sealed throughput_effect) and rules/6's effect (the live paired_lateness), and what each rule's own
    Blocks drops."""
    pairs = []  # (run, cand, L, e_ref, e_cand, rules/6 effect)
    sides: dict[str, dict[tuple, float]] = {"ref": {}, "cand": {}}
    cpu_total = cpu_whole = only5 = 0
    print("measure: run / candidate: pairs, blocks in scope, e = lag / own span per side; then per rule the pairs "
          "its rule marks and the blocks its Blocks drops (rules/5: sealed; rules/6: live)")
    for path in sorted(RUNS.glob("*/load.json")):
        run = path.parent.name
        load = json.loads(path.read_text())
        ref = load["reference"]
        for cand in sorted(load["servers"]):
            if cand == ref:
                continue
            cases = (load["servers"][ref]["cases"], load["servers"][cand]["cases"])
            live = speed6.Blocks(*(speed6.runs_by_case(c) for c in cases), bars, (ref, cand))
            sealed = speed5.Blocks(*(speed5.runs_by_case(c) for c in cases), bars, (ref, cand))
            rows = []
            for (key, b), ref_run in sorted(live.ref.items()):
                cand_run = live.cand.get((key, b))
                if cand_run is None or key not in live.cases:
                    continue
                e_ref, e_cand = throughput_effect(ref_run), throughput_effect(cand_run)
                found = paired_lateness(ref_run, cand_run)
                if e_ref is None or e_cand is None or found is None:
                    only5 += e_ref is not None and e_cand is not None  # rules/5 read 0 for a run without a lag
                    continue  # recorded before kvprobe measured its client
                for side, r, e in (("ref", ref_run, e_ref), ("cand", cand_run, e_cand)):
                    sides[side][(run, ref if side == "ref" else cand, key, b)] = e
                    cpu = r.get("client_cpu_share")
                    if isinstance(cpu, int | float):
                        cpu_total += 1
                        cpu_whole += cpu >= CPU_LIMIT
                rows.append((math.log(ref_run[THROUGHPUT] / cand_run[THROUGHPUT]), e_ref, e_cand, found[0]))
            if not rows:
                print(f"measure  {run:24} {cand:20} no client figures")
                continue
            scope, _ = _scope(load, live.cases) or (live.cases, "")
            arr = np.array(rows)
            print(f"measure  {run:24} {cand:20} pairs {len(rows):3}  blocks {len(live.complete(scope)):2}  "
                  f"e_ref {q(arr[:, 1])}  e_cand {q(arr[:, 2])}")
            for rule, blocks in ((R5, sealed), (R6, live)):
                _, _, dropped = blocks.losses(scope, THROUGHPUT, drop=True)
                print(f"measure  {run:24} {cand:20} {rule} limited pairs {len(blocks.limited_throughput)}  "
                      f"dropped blocks {dropped}")
            pairs += [(run, cand, *row) for row in rows]
    runs = np.array([p[0] for p in pairs])
    L = np.array([p[2] for p in pairs])
    d = {R5: np.array([p[4] - p[3] for p in pairs]), R6: np.array([p[5] for p in pairs])}
    finite = np.isfinite(d[R5]) & np.isfinite(d[R6])
    print(f"measure  pooled: {len(pairs)} pairs in {len(set(runs))} runs, "
          f"{len({(p[0], p[1]) for p in pairs})} candidate comparisons; pairs rules/5 reads (a lag missing read as "
          f"0) and rules/6 cannot: {only5}")
    for side in ("ref", "cand"):
        e = np.array(list(sides[side].values()))
        print(f"measure  pooled e_{side} ({len(e)} distinct runs of a case): {q(e)}; "
              f"inf (whole core) {int(np.isinf(e).sum())}")
    print(f"measure  whole-core share: {cpu_whole} of {cpu_total} case runs with client_cpu_share >= {CPU_LIMIT} "
          f"(95% upper bound {wilson(cpu_whole, cpu_total)[1]:.4f})")
    label = {R5: "d = e_cand - e_ref", R6: "effect = lag diff / shared span"}
    for rule in RULES:
        for run in sorted(set(runs)):
            m = (runs == run) & finite
            if m.sum() >= 10:
                b, se, a, r, sd = ols(L[m], d[rule][m])
                print(f"measure  fit {rule} {run:24} n {int(m.sum()):3}  r {r:+.3f}  slope {b:+.5f} (se {se:.5f})  "
                      f"intercept {a:+.6f}  resid sd {sd:.5f}")
            else:
                print(f"measure  fit {rule} {run:24} n {int(m.sum()):3}  too few pairs for a fit")
    fits = {}
    for rule in RULES:
        b, se, a, r, sd = ols(L[finite], d[rule][finite])
        resid = d[rule][finite] - (a + b * L[finite])
        fits[rule] = {"slope": b, "intercept": a, "resid": resid}
        print(f"measure  pooled fit {rule} {label[rule]} = a + b L: n {int(finite.sum())}  r {r:+.3f}  slope "
              f"{b:+.5f} (se {se:.5f})  intercept {a:+.6f}  resid sd {sd:.5f}  |resid| p99 "
              f"{np.quantile(np.abs(resid), 0.99):.5f} max {np.abs(resid).max():.5f}")
    comps = np.array([f"{p[0]}/{p[1]}" for p in pairs])[finite]
    x = L[finite].copy()
    for c in set(comps):
        x[comps == c] -= x[comps == c].mean()
    for rule in RULES:
        y = d[rule][finite]
        fits[rule]["within"] = float(x @ y / (x @ x))  # per-comparison intercepts: a comparison's own L swing
        print(f"measure  within-comparison fit {rule} (each candidate comparison its own intercept): slope "
              f"{fits[rule]['within']:+.5f}")
    print(f"measure  rules/6's within-comparison slope over rules/5's: {fits[R6]['within'] / fits[R5]['within']:+.3f} "
          "(0 if one loop lag on both sides; a lag growing with the span, lag ~ span^k, gives about -k / (1 - k))")
    e_all = np.array([e for side in sides.values() for e in side.values()])
    print(f"measure  mechanism: at one loop lag e ~ lag / span, so rules/5's d ~ -e L and rules/6's effect ~ 0 L; "
          f"median e {np.median(e_all):.4f} against rules/5's -b {-fits[R5]['slope']:.4f} and rules/6's -b "
          f"{-fits[R6]['slope']:.4f}")
    thr = LIMIT_SHARE * bars.throughput_drop_max
    for rule in RULES:
        b = fits[rule]["slope"]
        print(f"measure  {rule} at its b, a case {3 * CASE_SPREAD:.2f} (3 sd) off moves the lateness by "
              f"{abs(b) * 3 * CASE_SPREAD:.5f}, against the rule's {thr:.4f}")
    return {**fits, "whole_core": cpu_whole / max(cpu_total, 1), "threshold": thr,
            "n_resid": int(finite.sum())}


def lateness(inputs: dict[str, object], model: Model, L: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """One rule's lateness per case: a + b x + scale * residual, the residual the recorded pair idx's (the same
    pair for both rules). x is L ("linear", the fit), or 1 - exp(-L) ("fixed-lag", rules/5 only: each side's
    e = lag / span at one loop lag, so d = e_ref (exp(-L) - 1), with b = -e_ref; the same slope at L = 0,
    flatter where the candidate is much slower, steeper where it is much faster)."""
    rule, form, slope, scale = model
    fit = inputs[rule]
    return fit["intercept"] + slope * (L if form == LINEAR else -np.expm1(-L)) + scale * fit["resid"][idx]


def drop_rate(model: Model, inputs: dict[str, object], sims: int = 20_000) -> float:
    rng = np.random.default_rng([SEED, 7])
    L = rng.normal(0.0, CASE_SPREAD, (sims, CASES))
    idx = rng.integers(0, inputs["n_resid"], L.shape)
    return float((np.abs(lateness(inputs, model, L, idx)) > inputs["threshold"]).any(axis=1).mean())


def bisect(rate: object, target: float, hi: float, steps: int = 40) -> float:
    """The smallest x in (0, hi) at which rate(x) reaches target (rate increasing in x)."""
    lo = 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < target else (lo, mid)
    return hi


def rule_check(bars: object, model: Model, inputs: dict[str, object], rng: np.random.Generator,
               n_blocks: int = 40) -> None:
    """The vectorised drop below against the rule's own Blocks (rules/5: sealed; rules/6: live) on synthetic runs
    built so that the rule reads exactly the simulated lateness (spans exp(-+L/2) times a common factor, so the
    shared span is that factor; rules/5's spans equal), with three whole cores on a random side: same kept losses,
    same count. The live Blocks takes each case's lateness_move out of its ratio, so rules/6's expected kept losses
    are L less lateness_correction of the same lags and spans (rules/5's sealed Blocks corrects nothing)."""
    rule = model[0]
    L = rng.normal(0.0, CASE_SPREAD, (n_blocks, CASES))
    d = lateness(inputs, model, L, rng.integers(0, inputs["n_resid"], L.shape))
    core = np.zeros(L.shape, bool)
    core.flat[rng.choice(core.size, 3, replace=False)] = True
    core_side = rng.random(L.shape) < 0.5
    scale = np.exp(rng.normal(0.0, 1.0, L.shape))
    lag_ref = 0.002 + np.maximum(-d, 0.0)
    mine = ((np.abs(d) > inputs["threshold"]) | core).any(axis=1)
    speed = speed5 if rule == R5 else speed6

    def runs(side: str) -> dict:
        cases = []
        for c in range(CASES):
            reps = []
            for b in range(n_blocks):
                s = scale[b, c]
                half = 0.0 if rule == R5 else L[b, c] / 2
                span = s * math.exp(-half if side == "ref" else half)
                lag = s * (lag_ref[b, c] + (0.0 if side == "ref" else d[b, c]))
                tok = 100.0 if side == "ref" else 100.0 * math.exp(-L[b, c])
                cpu = 0.95 if core[b, c] and core_side[b, c] == (side == "ref") else 0.1
                reps.append({"repeat": b, THROUGHPUT: tok, "e2e_p50_s": span, "client_loop_lag_mean_s": lag,
                             "client_cpu_share": cpu, "client_stamps": "kernel"})
            cases.append({"shape": "default", "agents": 2 ** c, "repeats": reps})
        return speed.runs_by_case(cases)

    blocks = speed.Blocks(runs("ref"), runs("cand"), bars)
    losses, used, dropped = blocks.losses(blocks.cases, THROUGHPUT, drop=True)
    kept = ~mine
    expected = L
    if rule == R6:
        half = L / 2
        expected = L - lateness_correction(lag_ref, lag_ref + d, np.exp(-half), np.exp(half), core)
    same = (dropped == int(mine.sum()) and used == list(np.flatnonzero(kept))
            and np.allclose(losses, expected[kept].mean(axis=1)))
    print(f"rule     {rule} vectorised drop vs its speed.Blocks on {n_blocks} synthetic blocks ({int(core.sum())} "
          f"whole cores) at slope {model[2]:+.4f}, residual x {model[3]:.2f}: {int(mine.sum())} dropped by both, "
          f"kept losses {'identical' if same else 'DIFFER'}")


def limited_check(bars: object, threshold: float) -> None:
    """Each rule's _throughput_limited on hand-made pairs: the candidate's lag over the shared span at 1.01 and
    0.99 x the threshold (spans 0.5 and 2 s, so the shared span is 1 s and each side's own span is not), and one
    lag 2.4% of the shared span on both sides; beside each, how far the mechanism (each side's throughput over
    1 + lag / its own span) moves the log ratio."""
    names, bar = ("reference", "candidate"), bars.throughput_drop_max
    for label, lags in (("lag diff 1.01 x threshold", (0.0, 1.01 * threshold)),
                        ("lag diff 0.99 x threshold", (0.0, 0.99 * threshold)),
                        ("one lag 2.4% of the shared span", (0.024, 0.024))):
        ref = {"e2e_p50_s": 0.5, "client_loop_lag_mean_s": lags[0], "client_cpu_share": 0.1}
        cand = {"e2e_p50_s": 2.0, "client_loop_lag_mean_s": lags[1], "client_cpu_share": 0.1}
        moved = math.log1p(lags[1] / 2.0) - math.log1p(lags[0] / 0.5)  # the mechanism's move of the log ratio
        for rule, speed in ((R5, speed5), (R6, speed6)):
            found = speed._throughput_limited(ref, cand, names, bar)
            print(f"rule     {rule} _throughput_limited, spans 0.5 / 2 s, {label} (the ratio moved "
                  f"{moved:+.4f}): {'limited (' + found[0] + ')' if found else 'not limited'}")


def settle_check(plan: sequential.Design, margin: float, model: Model, inputs: dict[str, object],
                 rows: int = 300) -> None:
    """decide on the kept blocks (NaN past a short run's kept count) against sequential.settle row by row, the
    function the verdict calls on the usable blocks: same outcome and blocks used."""
    rng = np.random.default_rng([SEED, 5])
    raw = plan.n_max + max(2, plan.n_max // 4)
    L = margin + CASE_SPREAD * rng.standard_normal((rows, raw, CASES))
    idx = rng.integers(0, inputs["n_resid"], L.shape)
    drop = (np.abs(lateness(inputs, model, L, idx)) > inputs["threshold"]).any(axis=2)
    kept, _, count = kept_first(L.mean(axis=2), drop, plan.n_max)
    with np.errstate(invalid="ignore", divide="ignore"):
        passed, failed, used = sequential.decide(kept, margin, plan)
    agree = 0
    for i in range(rows):
        at = sequential.settle(list(kept[i, :count[i]]), margin, plan)
        outcome = at.outcome if at.outcome in ("pass", "fail") else "none"
        mine = "pass" if passed[i] else ("fail" if failed[i] else "none")
        agree += outcome == mine and (mine == "none" or at.n == used[i])
    print(f"rule     decide on kept blocks vs sequential.settle, {rows} runs at the bar, {model[0]} at slope "
          f"{model[2]:+.4f} ({int((count < plan.n_max).sum())} short of n_max): {agree} of {rows} agree")


def kept_first(loss: np.ndarray, drop: np.ndarray, n_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the first n_max kept block losses (NaN past the kept count: no look decides there), the raw
    block index of each kept block, and the kept count."""
    order = np.argsort(drop, axis=1, kind="stable")[:, :n_max]
    count = (~drop).sum(axis=1)
    out = np.take_along_axis(loss, order, axis=1)
    out[np.arange(n_max)[None, :] >= count[:, None]] = np.nan
    return out, order, count


def run_arm(loss: np.ndarray, drop: np.ndarray, n_max: int, margin: float,
            plan: sequential.Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(passed, failed, blocks dropped before the run ended) per row."""
    kept, order, count = kept_first(loss, drop, n_max)
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN past a short run's kept blocks: no decision there
        passed, failed, used = sequential.decide(kept, margin, plan)
    raw = loss.shape[1]
    decided = passed | failed
    u = np.where(decided, used, np.minimum(count, n_max)).astype(int)
    at = order[np.arange(len(u)), np.maximum(u, 1) - 1] + 1  # raw blocks run to reach the u-th kept one
    ran = np.where(decided | (count >= n_max), at, raw)
    return passed, failed, ran - u


def scenarios(inputs: dict[str, object]) -> dict[str, dict[str, Model]]:
    """Per scenario, each rule's model (see the docstring for how each stress is matched)."""
    b5, b6 = inputs[R5]["slope"], inputs[R6]["slope"]
    busy = BUSY_SLOPE / b5  # the lateness the busy client stands for, in multiples of the recorded one
    out: dict[str, dict[str, Model]] = {}
    for name, k in (("measured", 1.0), ("3x lateness", 3.0), ("10x lateness", 10.0)):
        out[name] = {R5: (R5, LINEAR, k * b5, 1.0), R6: (R6, LINEAR, k * b6, 1.0)}
    for form in FORMS:
        out[f"{'' if form == LINEAR else 'fixed-lag '}busy client"] = {R5: (R5, form, BUSY_SLOPE, 1.0),
                                                                     R6: (R6, LINEAR, busy * b6, 1.0)}
    within = BUSY_SLOPE * inputs[R6]["within"] / inputs[R5]["within"]
    out["busy client, within b'"] = {R5: (R5, LINEAR, BUSY_SLOPE, 1.0), R6: (R6, LINEAR, within, 1.0)}
    scale6 = {t: bisect(lambda s: drop_rate((R6, LINEAR, b6, s), inputs), t, 1_000.0) for t in TARGET_DROPS}
    for form in FORMS:
        for t in TARGET_DROPS:
            s5 = -bisect(lambda s, f=form: drop_rate((R5, f, -s, 1.0), inputs), t, 0.5)
            out[f"{'' if form == LINEAR else 'fixed-lag '}~{t:.0%} drop"] = {R5: (R5, form, s5, 1.0),
                                                                           R6: (R6, LINEAR, b6, scale6[t])}
    return out


def describe(model: Model) -> str:
    _, form, slope, scale = model
    x = "L" if form == LINEAR else "(1 - exp(-L))"
    return f"a + b {x} + {'' if scale == 1 else f'{scale:.2f} x '}resid, b {slope:+.5f}"


def lateness_correction(lag_r: np.ndarray, lag_c: np.ndarray, span_r: np.ndarray, span_c: np.ndarray,
                        core: np.ndarray) -> np.ndarray:
    """kvprobe.stats.client_limit.lateness_move, vectorised: log1p(lag_c / span_c) - log1p(lag_r / span_r), each
    side's loop lag over its own span; 0 where a figure is missing (NaN), a span is not positive, or a client used
    a whole core (that block is dropped)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.log1p(lag_c / span_c) - np.log1p(lag_r / span_r)
    bad = core | ~np.isfinite(out) | ~(span_r > 0) | ~(span_c > 0)
    return np.where(bad, 0.0, out)


def attenuation_lags(inputs: dict[str, object], lag: LagModel, L: np.ndarray,
                     idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shared lag level plus per-side lag noise, in units of the reference's span (its span 1): (the
    reference's observed lag, the candidate's, the candidate's span exp(L)). The lags' difference over the shared
    span exp(L / 2) is rules/6's modelled effect a + b' L + scale x resid (the recorded pair idx's), split evenly
    about the level e: lag_r = e - delta / 2, lag_c = e + delta / 2, each held at 0 or more as kvprobe's client
    records a lag (kvprobe/load/client_load.py)."""
    e, slope, scale = lag
    delta = lateness(inputs, (R6, LINEAR, slope, scale), L, idx) * np.exp(L / 2)
    return np.maximum(e - delta / 2, 0.0), np.maximum(e + delta / 2, 0.0), np.exp(L)


def true_move(e: float, L: np.ndarray) -> np.ndarray:
    """What one loop lag e (of the reference's span) on both sides does to the case log ratio where the agents
    do not saturate the server: each side's throughput over 1 + lag / its own span."""
    return np.log1p(e * np.exp(-L)) - np.log1p(e)


def attenuation_cells(inputs: dict[str, object],
                      cells: dict[str, dict[str, Model]]) -> dict[str, dict[str, LagModel]]:
    """Per scenario, each rule's lag model (level e, b', residual scale). Lag levels: both rules the same lags,
    b' the pooled one times e over the level rules/5's slope stands for (-b: at e = 0.024, the busy client's
    b'). Drop stresses: the level at which rules/5's drop on these lags (d = e (exp(-L) - 1) + about the lag
    difference), the lag noise as recorded, reaches that share of an equal candidate's blocks; rules/6 at the same
    level with the lag noise scaled as in its existing cell (the same share)."""
    b5, b6 = inputs[R5]["slope"], inputs[R6]["slope"]
    out: dict[str, dict[str, LagModel]] = {}
    for e in LAG_LEVELS:
        same = (e, b6 * e / -b5, 1.0)
        out[f"lag e {e:.4f}"] = {R5: same, R6: same}
    for t in TARGET_DROPS:
        e = bisect(lambda x: attenuation_drop_rate(R5, (x, b6 * x / -b5, 1.0), inputs), t, 0.5)
        _, _, slope6, scale6 = cells[f"~{t:.0%} drop"][R6]
        out[f"~{t:.0%} drop, e {e:.4f}"] = {R5: (e, b6 * e / -b5, 1.0), R6: (e, slope6, scale6)}
    return out


def move_check(rng: np.random.Generator, n: int = 400) -> None:
    """lateness_correction against the product's lateness_move on synthetic run dicts: lags and spans over
    decades, some figures missing, spans zero, the span as e2e_p50_s or as e2e_s {"p50"}, whole cores either
    side."""
    lag = np.exp(rng.uniform(-9, 0, (2, n)))
    span = np.exp(rng.uniform(-3, 3, (2, n)))
    lag[rng.random((2, n)) < 0.05] = np.nan
    span[rng.random((2, n)) < 0.03] = 0.0
    core = rng.random((2, n)) < 0.05
    form = rng.random((2, n)) < 0.5
    mine = lateness_correction(lag[0], lag[1], span[0], span[1], core.any(axis=0))
    worst, special = 0.0, 0
    for i in range(n):
        runs = []
        for s in (0, 1):
            run: dict[str, object] = {"client_cpu_share": 0.95 if core[s, i] else 0.2}
            if np.isfinite(lag[s, i]):
                run["client_loop_lag_mean_s"] = float(lag[s, i])
            run.update({"e2e_p50_s": float(span[s, i])} if form[s, i] else {"e2e_s": {"p50": float(span[s, i])}})
            runs.append(run)
        theirs = lateness_move(*runs)
        special += theirs == 0.0
        worst = max(worst, abs(theirs - mine[i]))
    print(f"rule     vectorised lateness correction vs client_limit.lateness_move on {n} synthetic pairs "
          f"({special} of them 0: a figure missing, a zero span or a whole core): max |difference| {worst:.1e}")


def correction_check(bars: object, inputs: dict[str, object], rng: np.random.Generator, n_blocks: int = 40,
                     e: float = 0.035, scale: float = 4.0) -> None:
    """The vectorised drop and corrected block loss of the attenuation section against the live speed.Blocks
    .losses (throughput, drop=True: its drop and its lateness_move correction) on synthetic runs: each case's
    lags from attenuation_lags at level e with the lag noise x scale (some blocks dropped), each side's span and
    lag times a common factor, the candidate's tokens/s giving L + the true move, three whole cores."""
    L = margin_of(bars) + rng.normal(0.0, CASE_SPREAD, (n_blocks, CASES))
    lag_r, lag_c, span_c = attenuation_lags(inputs, (e, inputs[R6]["slope"], scale), L,
                                            rng.integers(0, inputs["n_resid"], L.shape))
    obs = L + true_move(e, L)
    core = np.zeros(L.shape, bool)
    core.flat[rng.choice(core.size, 3, replace=False)] = True
    core_side = rng.random(L.shape) < 0.5
    factor = np.exp(rng.normal(0.0, 1.0, L.shape))
    d6 = (lag_c - lag_r) / np.sqrt(span_c)
    drop = ((np.abs(d6) > inputs["threshold"]) | core).any(axis=1)
    mine = (obs - lateness_correction(lag_r, lag_c, np.ones_like(L), span_c, core)).mean(axis=1)

    def runs(side: str) -> dict:
        cases = []
        for c in range(CASES):
            reps = []
            for b in range(n_blocks):
                f = factor[b, c]
                ref = side == "ref"
                reps.append({"repeat": b, THROUGHPUT: 100.0 if ref else 100.0 * math.exp(-obs[b, c]),
                             "e2e_p50_s": f * (1.0 if ref else span_c[b, c]),
                             "client_loop_lag_mean_s": f * (lag_r[b, c] if ref else lag_c[b, c]),
                             "client_cpu_share": 0.95 if core[b, c] and core_side[b, c] == ref else 0.1,
                             "client_stamps": "kernel"})
            cases.append({"shape": "default", "agents": 2 ** c, "repeats": reps})
        return speed6.runs_by_case(cases)

    blocks = speed6.Blocks(runs("ref"), runs("cand"), bars)
    losses, used, dropped = blocks.losses(blocks.cases, THROUGHPUT, drop=True)
    kept = ~drop
    same = (dropped == int(drop.sum()) and used == list(np.flatnonzero(kept))
            and np.allclose(losses, mine[kept], rtol=0.0, atol=1e-12))
    worst = float(np.abs(np.array(losses) - mine[kept]).max()) if len(losses) == int(kept.sum()) else math.nan
    print(f"rule     {R6} corrected: vectorised drop and lateness correction vs the live speed.Blocks.losses on "
          f"{n_blocks} synthetic blocks (e {e}, lag noise x {scale:.0f}, {int(core.sum())} whole cores): "
          f"{int(drop.sum())} dropped by both, kept losses {'identical' if same else 'DIFFER'} "
          f"(max |difference| {worst:.1e}; mean correction subtracted {float(np.mean(obs.mean(axis=1) - mine)):+.5f})")


def margin_of(bars: object) -> float:
    return -math.log1p(-bars.throughput_drop_max)


def attenuation(noise: str, t_name: str, truth: float, sims: int, lag_cells: dict[str, dict[str, LagModel]],
                inputs: dict[str, object], plan: sequential.Design, margin: float) -> None:
    """Full sequential runs (drop+spare) with the lateness's move of the ratio in: each case's observed
    L = L + k x true_move(e, L); rules/5 drops on its d from the observed lags and spans and keeps the observed
    ratio; rules/6 drops on the lags' difference over the shared span, and keeps the observed ratio (drop only)
    or subtracts lateness_correction of the observed lags and spans (corrected, the product now)."""
    n_max = plan.n_max
    raw = n_max + max(2, n_max // 4)
    thr, whole = inputs["threshold"], inputs["whole_core"]
    who = f"atten {noise} {t_name}"
    keys = [(name, k, v) for name in lag_cells for k in SATURATION for v in VARIANTS]
    tally = {key: np.zeros(5) for key in keys}  # passed, failed, blocks dropped, sum of shift, blocks in shift
    base = np.zeros(2)
    for start in range(0, sims, CHUNK):
        m_ = min(CHUNK, sims - start)
        rng = np.random.default_rng([SEED, 11, NOISES.index(noise), int(truth * 1e6), start])
        L = truth + CASE_SPREAD * case_noise(noise, rng, (m_, raw, CASES))
        idx = rng.integers(0, inputs["n_resid"], L.shape)
        core = rng.random(L.shape) < whole if whole > 0 else np.zeros(L.shape, bool)
        loss = L.mean(axis=2)
        p, f, _ = sequential.decide(loss[:, :n_max], margin, plan)
        base += (p.sum(), f.sum())
        ones = np.ones_like(L)
        for name, per_rule in lag_cells.items():
            reads = {}
            for rule in RULES:
                lag_r, lag_c, span_c = attenuation_lags(inputs, per_rule[rule], L, idx)
                d = lag_c / span_c - lag_r if rule == R5 else (lag_c - lag_r) / np.exp(L / 2)
                drop = ((np.abs(d) > thr) | core).any(axis=2)
                corr = lateness_correction(lag_r, lag_c, ones, span_c, core) if rule == R6 else None
                reads[rule] = (drop, true_move(per_rule[rule][0], L), corr)
            for k in SATURATION:
                for v in VARIANTS:
                    drop, move, corr = reads[R5 if v == VARIANTS[0] else R6]
                    obs = L + k * move
                    if v == VARIANTS[2]:
                        obs = obs - corr
                    block = obs.mean(axis=2)
                    p, f, dr = run_arm(block, drop, n_max, margin, plan)
                    shift = (block - loss)[~drop]
                    tally[(name, k, v)] += (p.sum(), f.sum(), dr.sum(), shift.sum(), shift.size)

    print(f"{who:28} truth {truth:.4f}: {sims} paths a cell, drop+spare; the same paths in every cell")
    print(f"{who:28} {'no client effect':22} {'':4} {'no drop':22} {p_text(base[0], base[1], sims)}"
          f"{alpha_flag(base[0], truth, sims)}")
    for name, k, v in keys:
        passed, failed, dropped, shift, n_shift = tally[(name, k, v)]
        print(f"{who:28} {name:22} k {k:.0f} {v:22} {p_text(passed, failed, sims)}  blocks dropped "
              f"{dropped / sims:5.2f}  mean shift of a kept block's loss {shift / n_shift:+.5f}"
              f"{alpha_flag(passed, truth, sims)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=60_000, help="simulated runs a cell (default 60,000)")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the line groups (default 2; the "
                        "figures are the same at any count)")
    args = parser.parse_args()
    config = load_config(SERVERS_TOML)
    bars, load = config.bars, config.load
    margin = -math.log1p(-bars.throughput_drop_max)
    inputs = measure(bars)
    thr = inputs["threshold"]

    plan = sequential.design(load.max_blocks, load.look_every, statistic=sequential.STATISTIC)
    n_max = plan.n_max
    spare = max(2, n_max // 4)
    raw = n_max + spare
    print(f"design   shipped [load]: max_blocks {load.max_blocks}, look_every {load.look_every}, {plan.statistic}: "
          f"looks {plan.looks}, c {plan.c}; margin {margin:.4f}; drop at |lateness| > {thr:.4f}; at most {spare} "
          f"replacement blocks ({raw} in all); {CASES} cases a block, per-case spread {CASE_SPREAD} "
          f"(block spread {CASE_SPREAD / math.sqrt(CASES):.4f})")
    cells = scenarios(inputs)
    for model in (cells["10x lateness"][R5], cells["~30% drop"][R5], cells["busy client"][R6],
                  cells["~30% drop"][R6]):
        rule_check(bars, model, inputs, np.random.default_rng([SEED, 3, RULES.index(model[0])]))
    limited_check(bars, thr)
    settle_check(plan, margin, cells["~30% drop"][R5], inputs)
    for name, models in cells.items():
        for rule, model in models.items():
            print(f"scenario {name:24} {rule} {describe(model):52} P(block dropped | equal) "
                  f"{drop_rate(model, inputs):.4f}")

    lag_cells = attenuation_cells(inputs, cells)
    move_check(np.random.default_rng([SEED, 9]))
    correction_check(bars, inputs, np.random.default_rng([SEED, 10]))
    for name, per_rule in lag_cells.items():
        for rule, lag in per_rule.items():
            e, slope, scale = lag
            print(f"atten scenario {name:22} {rule} lag level e {e:.4f} of the reference's span, lag difference over "
                  f"the shared span a + b L + {scale:.2f} x resid, b {slope:+.5f}  P(block dropped | equal) "
                  f"{attenuation_drop_rate(rule, lag, inputs):.4f}")

    truths = (("at the bar", margin), ("equal", 0.0))
    jobs = [(simulate, (noise, t_name, truth, args.paths, cells, inputs, plan, margin))
            for noise in NOISES for t_name, truth in truths]
    jobs += [(attenuation, (noise, t_name, truth, args.paths, lag_cells, inputs, plan, margin))
             for noise in ATTEN_NOISES for t_name, truth in truths]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            for out in pool.imap(captured, jobs):
                print(out, end="", flush=True)
    else:
        for job in jobs:
            job[0](*job[1])


def captured(job: tuple) -> str:
    """One line group's printout (its figures do not depend on the process: each chunk seeds its own generator)."""
    fn, args = job
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args)
    return buf.getvalue()


def attenuation_drop_rate(rule: str, lag: LagModel, inputs: dict[str, object], sims: int = 20_000) -> float:
    """P(block dropped | equal) of one rule on attenuation_lags (no whole cores)."""
    rng = np.random.default_rng([SEED, 7])
    L = rng.normal(0.0, CASE_SPREAD, (sims, CASES))
    lag_r, lag_c, span_c = attenuation_lags(inputs, lag, L, rng.integers(0, inputs["n_resid"], L.shape))
    d = lag_c / span_c - lag_r if rule == R5 else (lag_c - lag_r) / np.exp(L / 2)
    return float((np.abs(d) > inputs["threshold"]).any(axis=1).mean())


def case_noise(noise: str, rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
    """Per-case noise of sd 1 whose mean over a block's cases is the block noise of one sequential.FAMILY member
    (its own generator) over sqrt(cases), the cases spread normally around it: "normal" is iid normal cases."""
    paths, blocks, cases = shape
    w = sequential._family_noise(noise, rng, (paths, blocks))
    z = rng.standard_normal(shape)
    return w[:, :, None] / math.sqrt(cases) + z - z.mean(axis=2, keepdims=True)


def simulate(noise: str, t_name: str, truth: float, sims: int, cells: dict[str, dict[str, Model]],
             inputs: dict[str, object], plan: sequential.Design, margin: float) -> None:
    n_max = plan.n_max
    raw = n_max + max(2, n_max // 4)
    thr, whole = inputs["threshold"], inputs["whole_core"]
    who = f"{noise} {t_name}"
    models = sorted({m for models in cells.values() for m in models.values()})
    arms = ("drop+spare", "drop, no spare")
    print(f"{who:22} truth {truth:.4f}: {sims} paths a cell, the same paths (and the same recorded pair behind "
          f"each case's residual, for both rules) in every cell of this line group")
    base = np.zeros(2)
    tally = {(m, a): np.zeros(3) for m in models for a in arms}  # passed, failed, blocks dropped
    sel = {m: np.zeros(5) for m in models}  # sum kept, sum kept^2, n kept, sum all, sum all^2
    for start in range(0, sims, CHUNK):
        m_ = min(CHUNK, sims - start)
        rng = np.random.default_rng([SEED, NOISES.index(noise), int(truth * 1e6), start])
        L = truth + CASE_SPREAD * case_noise(noise, rng, (m_, raw, CASES))
        idx = rng.integers(0, inputs["n_resid"], L.shape)
        core = rng.random(L.shape) < whole if whole > 0 else np.zeros(L.shape, bool)
        loss = L.mean(axis=2)
        p, f, _ = sequential.decide(loss[:, :n_max], margin, plan)
        base += (p.sum(), f.sum())
        for m in models:
            drop = ((np.abs(lateness(inputs, m, L, idx)) > thr) | core).any(axis=2)
            p, f, dr = run_arm(loss, drop, n_max, margin, plan)
            tally[(m, arms[0])] += (p.sum(), f.sum(), dr.sum())
            p, f, dr = run_arm(loss[:, :n_max], drop[:, :n_max], n_max, margin, plan)
            tally[(m, arms[1])] += (p.sum(), f.sum(), dr.sum())
            k = loss[~drop]
            sel[m] += (k.sum(), (k * k).sum(), k.size, loss.sum(), (loss * loss).sum())

    print(f"{who:22} {'no drop':24} both    {'':16} {p_text(base[0], base[1], sims)}{alpha_flag(base[0], truth, sims)}")
    for name, per_rule in cells.items():
        for rule, m in per_rule.items():
            sk, sk2, nk, sa, sa2 = sel[m]
            na = sims * raw
            mk, ma = sk / nk, sa / na
            sdk, sda = math.sqrt(sk2 / nk - mk * mk), math.sqrt(sa2 / na - ma * ma)
            print(f"{who:22} {name:24} {rule} {'selection':16} kept {nk / na:.4f} of blocks; mean block loss kept "
                  f"- all {mk - ma:+.5f} ({(mk - ma) / sda:+.3f} block sd); sd kept / all {sdk / sda:.4f}")
            for a in arms:
                passed, failed, dropped = tally[(m, a)]
                print(f"{who:22} {name:24} {rule} {a:16} {p_text(passed, failed, sims)}  blocks dropped "
                      f"{dropped / sims:5.2f}{alpha_flag(passed, truth, sims)}")


if __name__ == "__main__":
    main()
