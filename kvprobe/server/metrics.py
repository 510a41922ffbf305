"""/metrics: parse with prometheus-client, normalise renamed metrics, read cache config and capacity."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvprobe.errors import MetricsError, Unreadable
from kvprobe.server.untrusted import MAX_TOKENS, number

# Old name -> current name. vLLM renamed the usage gauge and prefix-cache counters in v0.9.2
# (PR #18354), hid the old names in 0.11 and removed them in late 2025; servers of every age exist.
ALIASES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "vllm:time_per_output_token_seconds_sum": "vllm:inter_token_latency_seconds_sum",
    "vllm:time_per_output_token_seconds_count": "vllm:inter_token_latency_seconds_count",
}

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# The waiting queue split by why it waits, label reason="capacity" (scheduling capacity: KV blocks,
# max_num_seqs, the token budget) or "deferred" (LoRA budget, KV transfer); the two sum to WAITING.
# vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__ (WAITING_REASON_CAPACITY). Servers from
# before it have none; the captures here (0.26 GPU, 0.32 CPU) have it.
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
CACHE_CONFIG = "vllm:cache_config_info"

COUNTERS = (PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, PROMPT_TOKENS, GENERATION_TOKENS)
# Speculative decoding, as vLLM's SpecDecodingProm registers it (vllm/v1/spec_decode/metrics.py): one
# series per engine (labels model_name, engine; the per-position one adds position), registered only when
# the server runs a speculative config, so a server without one has none of them. prometheus_client
# exposes a counter with the _total suffix.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS)
# What kvprobe reads from the samples, and what a sane value is. Other series may be NaN (an empty
# summary) without it being anyone's concern.
_SAMPLE_RANGES: dict[str, dict[str, Any]] = {
    KV_USAGE: {"minimum": 0, "maximum": 1},
    RUNNING: {"minimum": 0, "maximum": MAX_TOKENS},
    WAITING: {"minimum": 0, "maximum": MAX_TOKENS},
    WAITING_BY_REASON: {"minimum": 0, "maximum": MAX_TOKENS},
    **{name: {"minimum": 0} for name in (*COUNTERS, *SPEC_DECODE)},
}


@dataclass(frozen=True)
class Capacity:
    """KV cache capacity as the server reports it (or estimates it)."""

    kv_cache_tokens: int
    estimate: bool  # True: num_gpu_blocks x block_size, wrong for hybrid models
    max_concurrency: float | None
    num_blocks: int | None
    block_size: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MetricsSnapshot:
    """One scrape: samples by canonical name, and the cache-config labels."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    cache_config: dict[str, str] | None = None
    cache_config_engines: list[dict[str, str]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # samples left out, each naming its series

    def total(self, name: str) -> float | None:
        """Sum over every series of `name` (engines, model names); None when absent."""
        rows = self.samples.get(name)
        return None if not rows else sum(v for _, v in rows)

    def labelled_total(self, name: str, label: str, value: str) -> float | None:
        """Sum over the series of `name` whose `label` is `value`; None when there is none."""
        rows = [v for labels, v in self.samples.get(name, []) if labels.get(label) == value]
        return sum(rows) if rows else None

    def maximum(self, name: str) -> float | None:
        rows = self.samples.get(name)
        return None if not rows else max(v for _, v in rows)

    @property
    def kv_usage(self) -> float | None:
        """KV cache usage as a fraction 0..1 (the highest engine)."""
        return self.maximum(KV_USAGE)

    def counters(self) -> dict[str, float]:
        return {name: v for name in COUNTERS if (v := self.total(name)) is not None}

    def gauges(self) -> dict[str, float]:
        out = {}
        for name in (KV_USAGE, RUNNING, WAITING):
            if (v := (self.maximum(name) if name == KV_USAGE else self.total(name))) is not None:
                out[name] = v
        return out

    def capacity(self) -> Capacity | None:
        """kv_cache_size_tokens when the server reports it (vLLM >= mid-2026), else blocks x size.
        None when the labels are absent; Unreadable when one is there but is not a sane number: a
        capacity built on "inf" or "-5" would be a wrong measurement, so there is no estimate then."""
        if not self.cache_config_engines:
            return None
        tokens = _sum_label(self.cache_config_engines, "kv_cache_size_tokens", minimum=1)
        blocks = _sum_label(self.cache_config_engines, "num_gpu_blocks", minimum=1)
        block_size = _label(self.cache_config_engines[0], "block_size", minimum=1)
        conc = _sum_label(self.cache_config_engines, "kv_cache_max_concurrency", minimum=0, integer=False)
        if tokens is not None:
            return Capacity(tokens, False, conc, blocks, block_size)
        if blocks is not None and block_size is not None:
            return Capacity(number(blocks * block_size, f"{CACHE_CONFIG} num_gpu_blocks x block_size", integer=True,
                                   maximum=MAX_TOKENS), True, conc, blocks, block_size)
        return None


def _label(labels: dict[str, str], name: str, *, minimum: float, integer: bool = True,
           engine: bool = False) -> Any:
    """A cache_config_info label as a number; None when absent (vLLM writes unset values as "None")."""
    raw = labels.get(name)
    if raw in (None, "None", ""):
        return None
    where = f" (engine {labels.get('engine')})" if engine else ""
    return number(raw, f"/metrics {CACHE_CONFIG} {name}{where}", integer=integer, minimum=minimum,
                  maximum=MAX_TOKENS, text=True)


def _sum_label(engines: list[dict[str, str]], name: str, *, minimum: float, integer: bool = True) -> Any:
    """The label summed over engines (each has its own pool); None when any engine lacks it."""
    values = [_label(labels, name, minimum=minimum, integer=integer, engine=len(engines) > 1) for labels in engines]
    return None if not values or None in values else sum(values)


def only_families(text: str, names: Iterable[str]) -> str:
    """The lines of these metric families (and their aliases' old names), for a scrape that needs only
    a few gauges and counters: vLLM's histograms are most of the text, and parsing all of it took
    9 ms here, on the event loop, twice a second during every load case."""
    wanted = set(names)
    wanted |= {old for old, new in ALIASES.items() if new in wanted}
    prefixes = tuple(sorted(wanted))
    keep = []
    for line in text.splitlines():
        bare = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        if bare.startswith(prefixes):
            end = len(bare.split("{", 1)[0].split(" ", 1)[0])
            name = bare[:end]
            if name in wanted or name.removesuffix("_total") in wanted or f"{name}_total" in wanted:
                keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition; raise MetricsError (one line) when it is not that."""
    snap = MetricsSnapshot()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = ALIASES.get(sample.name, sample.name)
                value = sample.value
                if name in _SAMPLE_RANGES:
                    try:
                        value = number(value, f"/metrics {name}", **_SAMPLE_RANGES[name])
                    except Unreadable as exc:
                        if str(exc) not in snap.unreadable:
                            snap.unreadable.append(str(exc))
                        continue
                snap.samples.setdefault(name, []).append((dict(sample.labels), float(value)))
    except (ValueError, TypeError, IndexError) as exc:
        # prometheus-client quotes the whole offending line, which may be megabytes of garbage.
        detail = " ".join(str(exc).split())
        detail = detail if len(detail) <= 200 else f"{detail[:200]}..."
        raise MetricsError(f"/metrics is not valid Prometheus text: {detail}") from None
    engines = [labels for labels, _ in snap.samples.get(CACHE_CONFIG, [])]
    engines.sort(key=lambda labels: labels.get("engine", ""))
    snap.cache_config_engines = engines
    if engines:
        snap.cache_config = {k: v for k, v in engines[0].items() if k != "engine"}
    return snap


def counter_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """Counter increase over a window (vLLM counters are cumulative since server start)."""
    a, b = before.counters(), after.counters()
    return {name: b[name] - a.get(name, 0.0) for name in b}
