"""Load arithmetic, pure functions: per-request rows, a run's summary, repeats combined, and the
candidate-vs-reference speed comparison with bootstrap intervals and the bar rule.

A request is `ok` (the server said it was done and sent no error), `incomplete` (a stream that
started but was cut before [DONE]) or `error` (no stream: HTTP error, refused, timed out). Latency
percentiles and throughput count only `ok` requests; the other two are counted apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from kvprobe.config import Slo
from kvprobe.errors import Unreadable
from kvprobe.load import spec_decode
from kvprobe.server.untrusted import optional_count
from kvprobe.stats import percentiles

if TYPE_CHECKING:  # a type only: verify reads these rules without the HTTP stack
    from kvprobe.server.client import Generation

Status = Literal["ok", "incomplete", "error"]


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def status_of(gen: Generation) -> Status:
    if gen.ok:
        return "ok"
    if gen.chunks and not gen.complete and gen.status is None:
        return "incomplete"
    return "error"


def _usage(gen: Generation, key: str, server: str, problems: list[str]) -> int | None:
    try:
        return optional_count(gen.usage, key, f"{server}: usage")
    except Unreadable as exc:
        problems.append(str(exc))
        return None


def request_row(gen: Generation, t_case: float, server: str = "server") -> dict[str, Any]:
    """What one request measured (times in seconds; t0 relative to the case start). A usage count the
    server garbled is left out (tokens are then counted from the stream) and named in `unreadable`."""
    problems: list[str] = []
    times = gen.token_times  # one pass over the chunks for TTFT, ITL and the count
    out = _usage(gen, "completion_tokens", server, problems)
    row: dict[str, Any] = {
        "status": status_of(gen),
        "t0": _r(gen.t_start - t_case),
        "ttft": _r(times[0] - gen.t_start if times else None),
        "itl": [_r(b - a) for a, b in itertools.pairwise(times)],
        "e2e": _r(gen.e2e),
        "prompt_tokens": _usage(gen, "prompt_tokens", server, problems),
        "output_tokens": out if out is not None else len(times),
        "output_tokens_from_usage": out is not None,
        "finish_reason": gen.finish_reason,
        "error": gen.error,
        "http_status": gen.status,
    }
    if gen.stream_error_code is not None:  # only then: every row is written to the events log
        row["stream_error_code"] = gen.stream_error_code
    if problems:
        row["unreadable"] = "; ".join(problems)
    row["tpot"] = tpot(row)
    return row


def tpot(row: dict[str, Any]) -> float | None:
    """Time per output token after the first: (E2E - TTFT) / (output tokens - 1)."""
    n, ttft, e2e = row.get("output_tokens") or 0, row.get("ttft"), row.get("e2e")
    if n < 2 or ttft is None or e2e is None:
        return None
    return _r((e2e - ttft) / (n - 1))


def meets_slo(row: dict[str, Any], slo: Slo) -> bool:
    """Every limit that is set is met (a missing measurement fails a set limit)."""
    for limit, value in ((slo.ttft_s, row.get("ttft")), (slo.tpot_s, row.get("tpot")), (slo.e2e_s, row.get("e2e"))):
        if limit is not None and (value is None or value > limit):
            return False
    return True


def slo_set(slo: Slo) -> bool:
    return any(v is not None for v in (slo.ttft_s, slo.tpot_s, slo.e2e_s))


def _latencies(ok: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    return {
        "ttft": percentiles([r["ttft"] for r in ok if r["ttft"] is not None]),
        "itl": percentiles([x for r in ok for x in r["itl"]]),
        "tpot": percentiles([r["tpot"] for r in ok if r["tpot"] is not None]),
        "e2e": percentiles([r["e2e"] for r in ok if r["e2e"] is not None]),
    }


def summarize_run(rows: Sequence[dict[str, Any]], duration_s: float, slo: Slo) -> dict[str, Any]:
    """One run of one case on one server. Throughputs are over the run's wall time (first request
    sent to last request finished)."""
    ok = [r for r in rows if r["status"] == "ok"]
    duration = max(duration_s, 1e-9)
    out_tokens = sum(int(r["output_tokens"] or 0) for r in ok)
    lat = _latencies(ok)
    good = sum(1 for r in ok if meets_slo(r, slo)) if slo_set(slo) else None
    return {
        "requests": len(rows),
        "successes": len(ok),
        # apart, as the statuses are: requests = successes + errors + incomplete
        "errors": sum(1 for r in rows if r["status"] == "error"),
        "incomplete": sum(1 for r in rows if r["status"] == "incomplete"),
        "duration_s": _r(duration_s),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(int(r["prompt_tokens"] or 0) for r in ok),
        "output_tokens_per_s": _r(out_tokens / duration),
        "requests_per_s": _r(len(ok) / duration),
        "goodput_requests_per_s": None if good is None else _r(good / duration),
        "good_fraction": None if good is None or not rows else _r(good / len(rows)),
        **{f"{name}_s": {k: _r(v) for k, v in pct.items()} for name, pct in lat.items()},
        "ttft_p99_s": _r(lat["ttft"]["p99"]),
        "itl_p99_s": _r(lat["itl"]["p99"]),
        "e2e_p99_s": _r(lat["e2e"]["p99"]),
        "tpot_p99_s": _r(lat["tpot"]["p99"]),
        # flat, so the verdict's evidence keeps them (the client_limited rule reads them)
        "itl_p50_s": _r(lat["itl"]["p50"]),
        "e2e_p50_s": _r(lat["e2e"]["p50"]),
        # p90 latency endpoints: a run of fewer than 100 requests has no meaningful p99 of TTFT or E2E
        "ttft_p90_s": _r(lat["ttft"]["p90"]),
        "e2e_p90_s": _r(lat["e2e"]["p90"]),
    }


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return _r(sum(vals) / len(vals)) if vals else None


def combine_repeats(runs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], slo: Slo) -> dict[str, Any]:
    """A case over its repeats: counts summed, throughputs averaged over runs, latency percentiles
    over every request of every run, and the per-run figures kept under "repeats" (the samples the
    speed intervals are built from)."""
    ok = [r for r in rows if r["status"] == "ok"]
    lat = _latencies(ok)
    goods = [r.get("goodput_requests_per_s") for r in runs]
    metrics = [r.get("metrics") or {} for r in runs]
    kv = [m.get("kv_usage_max") for m in metrics if m.get("kv_usage_max") is not None]
    return {
        "requests": sum(r["requests"] for r in runs),
        "successes": sum(r["successes"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "incomplete": sum(r["incomplete"] for r in runs),
        "output_tokens_per_s": _mean(r["output_tokens_per_s"] for r in runs),
        "requests_per_s": _mean(r["requests_per_s"] for r in runs),
        "goodput_requests_per_s": None if not slo_set(slo) else _mean(goods),
        "ttft_p99_s": _r(lat["ttft"]["p99"]),
        "itl_p99_s": _r(lat["itl"]["p99"]),
        "e2e_p99_s": _r(lat["e2e"]["p99"]),
        **{f"{name}_s": {k: _r(v) for k, v in pct.items()} for name, pct in lat.items()},
        "kv_usage_max": _r(max(kv)) if kv else None,
        "preemptions": int(sum((m.get("deltas") or {}).get("preemptions", 0) for m in metrics)),
        "running_max": max((m.get("running_max") or 0 for m in metrics), default=None),
        "waiting_max": max((m.get("waiting_max") or 0 for m in metrics), default=None),
        "prefix_cache_hit_rate": _mean(m.get("prefix_cache_hit_rate") for m in metrics),
        **spec_decode.pooled(spec_decode.flat(m.get("spec_decode")) for m in metrics),
        "repeats": list(runs),
    }
