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


def throughput_effect(run: dict[str, Any]) -> float | None:
    """How much lighter the client made a closed-loop run's offered load: its mean loop lag as a share of a
    request's median span (each turn goes out about that late); infinite when the client used a whole
    core; None when the run carries no client figures."""
    cpu = run.get("client_cpu_share")
    if isinstance(cpu, int | float) and cpu >= CPU_LIMIT:
        return math.inf
    mean, e2e = run.get("client_loop_lag_mean_s"), _p50(run, "e2e")
    if isinstance(mean, int | float) and isinstance(e2e, int | float) and e2e > 0:
        return mean / e2e
    return 0.0 if isinstance(cpu, int | float) else None


def _p50(case: dict[str, Any], name: str) -> float | None:
    value = case.get(f"{name}_p50_s")
    if value is None and isinstance(case.get(f"{name}_s"), dict):
        value = case[f"{name}_s"].get("p50")
    return value if isinstance(value, int | float) else None
