"""KV pressure: is the KV cache what limits a server, read from its own /metrics over a short window.

`kvprobe audit --watch 60s` samples /metrics every ~2 s; everything here is a pure function of those
samples, so the diagnosis is tested on real captures with edited counters. What it reads (names as
vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__, registers them; kvprobe.server.metrics maps the
pre-0.9.2 names `vllm:gpu_cache_usage_perc` and `vllm:gpu_prefix_cache_{queries,hits}` onto these):

- `vllm:kv_cache_usage_perc` (gauge, 0..1): the peak over the window
- `vllm:num_preemptions_total` (counter): its increase, per minute
- `vllm:num_requests_running`, `vllm:num_requests_waiting` (gauges)
- `vllm:num_requests_waiting_by_reason{reason="capacity"}` (gauge, where the server has it)
- `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (counters): the hit rate over the window
- `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` (counters): whether anything ran at all

KV-bound means the pool ran out: vLLM's V1 scheduler preempts a running request only when it cannot
allocate the KV blocks that request needs next (vllm/v1/core/sched/scheduler.py), so one preemption in
the window says the pool was full at that moment, even if no 2-second sample caught usage at its peak.
A queue beside a nearly full pool says the same. A queue beside a pool with room is waiting on
something else (max_num_seqs, the batch's token budget): a bigger pool frees nothing there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvprobe.errors import ConfigError
from kvprobe.server.metrics import (
    GENERATION_TOKENS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    MetricsSnapshot,
)

if TYPE_CHECKING:
    from kvprobe.server.inventory import Inventory

# Peak usage from which a queue counts as waiting for KV. Usage is sampled, not tracked: vLLM keeps a
# few blocks free while it schedules, and a 2 s sample rarely lands on the exact peak.
KV_FULL = 0.90
INTERVAL_S = 2.0
MIN_WINDOW_S = 10.0  # five samples at least: fewer cannot tell a blip from a trend

Verdict = Literal["kv_bound", "not_kv_bound", "no_traffic", "unknown"]


@dataclass(frozen=True)
class Sample:
    t: float  # seconds on a monotonic clock
    snap: MetricsSnapshot


@dataclass(frozen=True)
class Window:
    """What the samples show, each figure None where the server does not expose it."""

    seconds: float
    samples: int
    peak_kv_usage: float | None
    running_at_peak: int | None  # running requests in the sample with the peak usage
    peak_running: int | None
    preemptions: float | None
    preemptions_per_min: float | None
    peak_waiting: int | None
    peak_waiting_capacity: int | None  # None: no vllm:num_requests_waiting_by_reason on this server
    prefix_cache_hit_rate: float | None  # None: no prefix-cache lookup in the window
    prompt_tokens: float | None
    generation_tokens: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def increase(values: list[float]) -> float:
    """A counter's increase over the samples, as Prometheus' increase() counts it: a drop is a restart
    (the counter began again from zero), so what it shows after the drop is all new."""
    return sum(b - a if b >= a else b for a, b in pairwise(values))


def _series(samples: list[Sample], name: str) -> list[float]:
    """The counter's value in every sample that has it (a sample that lost it is skipped, not zero)."""
    return [v for s in samples if (v := s.snap.total(name)) is not None]


def _peak(values: list[float | None]) -> int | None:
    present = [v for v in values if v is not None]
    return round(max(present)) if present else None


def summarize(samples: list[Sample]) -> Window:
    """The window's figures; counters need two samples, gauges one."""
    samples = sorted(samples, key=lambda s: s.t)
    seconds = samples[-1].t - samples[0].t if samples else 0.0
    usage = [(u, s) for s in samples if (u := s.snap.kv_usage) is not None]
    peak_usage, at_peak = max(usage, key=lambda pair: (pair[0], pair[1].snap.total(RUNNING) or 0)) if usage \
        else (None, None)
    running_at_peak = at_peak.snap.total(RUNNING) if at_peak is not None else None

    def counted(name: str) -> float | None:
        values = _series(samples, name)
        return increase(values) if len(values) > 1 else None

    preemptions = counted(PREEMPTIONS)
    queries, hits = counted(PREFIX_QUERIES), counted(PREFIX_HITS)
    return Window(
        seconds=seconds, samples=len(samples),
        peak_kv_usage=peak_usage,
        running_at_peak=None if running_at_peak is None else round(running_at_peak),
        peak_running=_peak([s.snap.total(RUNNING) for s in samples]),
        preemptions=preemptions,
        preemptions_per_min=preemptions * 60 / seconds if preemptions is not None and seconds > 0 else None,
        peak_waiting=_peak([s.snap.total(WAITING) for s in samples]),
        peak_waiting_capacity=_peak([s.snap.labelled_total(WAITING_BY_REASON, "reason", "capacity")
                                     for s in samples]),
        prefix_cache_hit_rate=hits / queries if queries and hits is not None else None,
        prompt_tokens=counted(PROMPT_TOKENS), generation_tokens=counted(GENERATION_TOKENS),
    )


@dataclass(frozen=True)
class TwoX:
    """What a KV format half as wide as the server's would hold, by the memory map (kvprobe.memmap);
    `reason` says why there is no figure."""

    dtype: str | None = None
    ratio: float | None = None  # its kv_cache_tokens over the server's own dtype's, predicted
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    sentence: str
    window: Window
    two_x: TwoX | None = None
    more_sequences: int | None = None  # the estimate in a KV-bound sentence

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "sentence": self.sentence, "more_sequences": self.more_sequences,
                "two_x": self.two_x.to_dict() if self.two_x else None, **self.window.to_dict()}


def _requests(n: int) -> str:
    return f"{n} request{'s' if n != 1 else ''}"


def _rate(per_min: float) -> str:
    return f"{per_min:.0f}" if per_min >= 10 or per_min == int(per_min) else f"{per_min:.1f}"


def _waiting_text(w: Window) -> str:
    if w.peak_waiting_capacity is not None:
        n = w.peak_waiting_capacity
        return f"{_requests(n)} waiting for capacity" if n else "nothing waiting for capacity"
    # An older server without the by-reason gauge: its whole queue, which may also hold deferred requests.
    n = w.peak_waiting or 0
    return f"{_requests(n)} waiting" if n else "nothing waiting"


def _estimate(w: Window, two_x: TwoX | None, max_num_seqs: int | None) -> tuple[str, int | None]:
    """The KV-bound sentence's tail: about how many more sequences a 2x format would let run.

    room = running at the peak x (ratio - 1): the same requests, each as long as now, in a pool
    `ratio` times larger. It can only be an estimate: it holds request lengths fixed, and it cannot
    admit more than are waiting or than max_num_seqs allows."""
    if two_x is None or two_x.ratio is None or not two_x.dtype:
        reason = two_x.reason if two_x and two_x.reason else "the memory map is not available"
        return f"{reason}, so no estimate of what a 2x KV format frees", None
    running = w.running_at_peak or w.peak_running or 0
    room = max(0, round(running * (two_x.ratio - 1)))
    more, caps = room, []
    waiting = w.peak_waiting_capacity if w.peak_waiting_capacity is not None else w.peak_waiting
    if waiting is not None and waiting < more:
        more = waiting
        caps.append(f"the {waiting} waiting")
    if max_num_seqs is not None and max_num_seqs - running < more:
        more = max(0, max_num_seqs - running)
        caps.append(f"max_num_seqs {max_num_seqs}")
    capped = f", capped by {' and '.join(caps)}" if caps else ""
    return (f"a 2x KV format ({two_x.dtype}: {two_x.ratio:.2f}x the KV tokens by the memory map) would let about "
            f"{more} more sequences run (an estimate: {running} running x ({two_x.ratio:.2f} - 1) = {room}"
            f"{capped})"), more


def diagnose(w: Window, two_x: TwoX | None = None, max_num_seqs: int | None = None) -> Diagnosis:
    """One sentence per server: KV-bound, not KV-bound, or not enough traffic to tell."""
    if w.samples < 2 or w.seconds <= 0:
        return Diagnosis("unknown", f"cannot tell: {w.samples} readable /metrics sample(s) in the window", w, two_x)
    if w.peak_kv_usage is None:
        return Diagnosis("unknown", "cannot tell: /metrics has no vllm:kv_cache_usage_perc "
                                    "(nor the older vllm:gpu_cache_usage_perc)", w, two_x)
    ran = any((w.peak_running, w.peak_waiting, w.preemptions, w.prompt_tokens, w.generation_tokens))
    if not ran:
        return Diagnosis("no_traffic", f"not enough traffic in the window to tell: no request ran or waited "
                                       f"in {w.seconds:.0f} s", w, two_x)
    usage = f"peak KV usage {w.peak_kv_usage:.0%}"
    waiting = _waiting_text(w)
    queued = w.peak_waiting_capacity if w.peak_waiting_capacity is not None else w.peak_waiting
    if (w.preemptions or 0) > 0 or (w.peak_kv_usage >= KV_FULL and (queued or 0) > 0):
        tail, more = _estimate(w, two_x, max_num_seqs)
        rate = _rate(w.preemptions_per_min or 0.0)
        return Diagnosis("kv_bound", f"KV-bound: {usage}, {rate} preemptions/min, {waiting}: {tail}", w, two_x, more)
    if queued:
        # A queue while the pool has room: the scheduler's other limits hold it, not KV.
        return Diagnosis("not_kv_bound", f"not KV-bound: {usage}, {waiting} with KV to spare (max_num_seqs or the "
                                         "token budget holds them): more KV frees nothing you use", w, two_x)
    return Diagnosis("not_kv_bound", f"not KV-bound: {usage}, {waiting}: more KV frees nothing you use", w, two_x)


# A format half as wide per element as the one served, by bytes per K/V element (kvprobe.memmap.dtypes).
_HALF = {4: "bfloat16", 2: "fp8"}


def two_x_format(inv: Inventory, config: str | Path | None = None) -> TwoX:
    """The memory map's prediction for a KV format half as wide as the server's, from the model's
    config.json: `config`, else the /v1/models root's when that folder is on this disk. Reads the disk,
    so it is kept apart from the pure diagnosis."""
    from kvprobe.memmap import build, load_config, model_shape
    from kvprobe.memmap.dtypes import KV_DTYPES, kv_element_bytes
    from kvprobe.server.allocator import memmap_settings

    if config is None:
        if not inv.model_root:
            return TwoX(reason="the memory map needs the model's config.json, and /v1/models gives no root")
        config = Path(inv.model_root) / "config.json"
        if not config.is_file():
            return TwoX(reason=f"the memory map needs the model's config.json: {config} is not on this disk")
    dtype = inv.cache_dtype
    if dtype not in KV_DTYPES:
        return TwoX(reason=f"the memory map has no byte model for cache_dtype {dtype}")
    settings = memmap_settings(inv, inv)
    if settings is None:
        return TwoX(reason="the memory map has no allocator model for this server's mamba_cache_mode")
    try:
        model = model_shape(load_config(config), str(config))
        width = kv_element_bytes(dtype, settings.model_dtype or model.dtype)
        half = _HALF.get(width) or ("int4_per_token_head" if width == 1 and settings.platform == "cuda" else None)
        if half is None:
            return TwoX(reason=f"cache_dtype {dtype} already stores {width} byte{'s' if width != 1 else ''} per "
                               f"element, and the memory map sizes no format half as wide on {settings.platform}")
        mm = build(config, [dtype, half], inv.max_model_len, settings)
    except ConfigError as exc:  # NotModelled too: a format or model it cannot size is said, not guessed
        return TwoX(reason=f"the memory map cannot size it ({'; '.join(exc.problems)})")
    return TwoX(dtype=half, ratio=mm.ratio(half))
