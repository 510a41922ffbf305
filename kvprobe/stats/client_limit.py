"""Whether the client's own load could have moved a load case's numbers: the rule the load probe
records (client_limited) and the verdict's speed checks apply, both from the recorded figures
(kvprobe.load.client_load measures them), so it sits below both.

`limited`: the client could move a p99 by more than a tenth of the latency bar.
- Receive times from the loop: a chunk's time is late by the loop lag, so the loop lag p99 is compared
  with a tenth of the bar times the case's smallest p99 latency (TTFT or ITL).
- Kernel stamps: exact while the client reads each socket before that socket's next chunk arrives;
  later the kernel has merged the queued packets and they share the newest stamp (tcp_try_coalesce),
  so a read lag p99 over the median token gap marks the case. Otherwise a late loop only sends turns
  late, which the server sees as a lighter load: limited when the mean loop lag is over a tenth of
  the throughput bar of a request's median span.
- At any stamps, a client using 90% of a core or more is limited: its throughput is its own.

`paired_lateness`: for a block's paired throughput ratio, the two sides' mean loop lag compared over one
shared span (the verdict's speed checks drop a block where the difference is over a quarter of the bar);
`lateness_move`: what the lateness that remains can have moved the ratio, which the checks take out.
"""

from __future__ import annotations

import math
from typing import Any

CPU_LIMIT = 0.9
# The p99 latencies a candidate is held to (p99_latency_rise_max), as load.json names them.
P99_KEYS = (("ttft_p99_s", "TTFT p99"), ("itl_p99_s", "ITL p99"), ("e2e_p99_s", "E2E p99"))


def limited(client: dict[str, Any], case: dict[str, Any], latency_bar: float,
            throughput_bar: float = 0.05) -> str | None:
    """Why the client could have moved this case's numbers by more than a tenth of a bar, or None."""
    cpu = client.get("client_cpu_share")
    if isinstance(cpu, int | float) and cpu >= CPU_LIMIT:
        return f"the client used {cpu:.0%} of a core"
    lag = client.get("client_loop_lag_p99_s")
    if client.get("client_stamps") != "kernel":
        p99s = [case[k] for k in ("ttft_p99_s", "itl_p99_s") if isinstance(case.get(k), int | float) and case[k] > 0]
        allowed = 0.1 * latency_bar * min(p99s) if p99s else None
        if isinstance(lag, int | float) and allowed is not None and lag > allowed:
            return (f"the client's loop ran {lag * 1000:.2f} ms late (p99), over a tenth of the {latency_bar:.0%} bar "
                    f"on its smallest p99 latency ({allowed * 1000:.2f} ms; receive times from the loop)")
        return None
    read = client.get("client_read_lag_p99_s")
    itl = _p50(case, "itl")
    if isinstance(read, int | float) and isinstance(itl, int | float) and itl > 0 and read > itl:
        # Behind by more than a token gap: the kernel merges a socket's queued packets, newest stamp.
        return (f"the client read arrived bytes {read * 1000:.2f} ms late (p99), more than the median gap "
                f"between tokens ({itl * 1000:.2f} ms): queued chunks share one kernel stamp")
    mean = client.get("client_loop_lag_mean_s")
    e2e = _p50(case, "e2e")
    if isinstance(mean, int | float) and isinstance(e2e, int | float) and e2e > 0 and mean / e2e > 0.1 * throughput_bar:
        # Closed loop: each turn goes out late by about the mean lag, so the offered load is lighter.
        return (f"the client's loop ran {mean * 1000:.2f} ms late on average, {mean / e2e:.1%} of a request's "
                f"median span: over a tenth of the {throughput_bar:.0%} throughput bar")
    return None


def paired_lateness(ref: dict[str, Any], cand: dict[str, Any]) -> tuple[float, float, float] | None:
    """How far the client could have moved one block's paired throughput ratio, from the client's own figures:
    (the candidate's mean loop lag less the reference's, over one span both share; the two lags in seconds).
    A closed-loop turn sent a lag late lightens that server's load by about lag / span; over a shared span
    (the geometric mean of the two servers' median request spans) the same lag on both sides moves nothing
    whichever server is faster, so whether a block is dropped does not depend on the block's own ratio
    (benchmarks/client_limited_selection.py). Infinite, signed towards the side (the reference's first), when a
    client used a whole core; None when either side lacks the figures."""
    (full_ref, lag_ref, span_ref), (full_cand, lag_cand, span_cand) = _side(ref), _side(cand)
    if full_ref or full_cand:
        return (-math.inf if full_ref else math.inf), *(math.nan if x is None else x for x in (lag_ref, lag_cand))
    if None in (lag_ref, lag_cand, span_ref, span_cand):
        return None
    return (lag_cand - lag_ref) / math.sqrt(span_ref * span_cand), lag_ref, lag_cand


def lateness_move(ref: dict[str, Any], cand: dict[str, Any]) -> float:
    """The most the client's lateness can have moved one case's paired log throughput ratio log(ref / cand):
    log((1 + e_cand) / (1 + e_ref)), e = a side's mean loop lag over its own median request span. A turn sent
    that late stretches each conversation's cycle by that share, so a server the agents do not saturate serves
    that much less; one at capacity loses less, so the move is at most this. The same lag on both sides reads
    larger on the faster server: left in, it pulls every ratio toward 1, a slower candidate toward a pass (a
    client 2.4% late lets skewed blocks on the bar pass 3.1% against the design's 2.5%;
    benchmarks/client_limited_selection.py). 0 where either side lacks the figures (or they are not finite
    numbers), or a client used a whole core (that block is dropped). With several client processes the lag
    is their mean over the agents (kvprobe.load.processes.merge_client): each agent's turns are late by its
    own process's lag."""
    (full_ref, lag_ref, span_ref), (full_cand, lag_cand, span_cand) = _side(ref), _side(cand)
    if full_ref or full_cand or None in (lag_ref, lag_cand, span_ref, span_cand):
        return 0.0
    return math.log1p(lag_cand / span_cand) - math.log1p(lag_ref / span_ref)


def _side(run: dict[str, Any]) -> tuple[bool, float | None, float | None]:
    """One side's client figures as the throughput rules read them: (a whole core used; the mean loop lag,
    None unless a finite number >= 0; the median request span, None unless a finite number > 0)."""
    cpu, lag, span = run.get("client_cpu_share"), run.get("client_loop_lag_mean_s"), _p50(run, "e2e")
    return (isinstance(cpu, int | float) and cpu >= CPU_LIMIT,
            float(lag) if _finite(lag) and lag >= 0 else None, float(span) if _finite(span) and span > 0 else None)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _p50(case: dict[str, Any], name: str) -> float | None:
    value = case.get(f"{name}_p50_s")
    if value is None and isinstance(case.get(f"{name}_s"), dict):
        value = case[f"{name}_s"].get("p50")
    return value if isinstance(value, int | float) else None
