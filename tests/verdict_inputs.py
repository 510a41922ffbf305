"""Hand-built measurement sets for the verdict tests: a run directory written the way the probes
write theirs (shapes from issues 2-5), so `gather` and `decide` are exercised together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprobe.run.store import RunDir

BARS = {"perplexity_delta_max": 0.01, "needle_recall_drop_max": 0.10, "capacity_gain_min": 0.05,
        "throughput_drop_max": 0.05, "p99_latency_rise_max": 0.10, "kl_mean_max": None,
        "top1_agreement_min": None, "truncation_rise_max": 0.10}
# A fixed pattern of per-passage spread (mean 0, sd about 1): deterministic, so every test's numbers are too.
SPREAD = [0.9, -1.2, 0.3, 1.5, -0.4, -0.9, 1.1, -1.6, 0.2, 0.6, -0.3, 1.0, -0.8, 0.4, -1.0, 0.2]


def perplexity_rows(rise: float, spread: float = 0.0005, n: int = 16, units: int = 1000) -> dict[str, Any]:
    """A candidate's per-passage numbers whose NLL per unit is `rise` above the reference's on average,
    `spread` apart passage to passage (perplexity.json's shape)."""
    rises = [rise + spread * SPREAD[i % len(SPREAD)] for i in range(n)]
    ref = reference_ll(n, units)
    return {"bits_per_byte": 1.0 + rise, "word_perplexity": 20.0, "passage_doc": list(range(n)),
            "passage_ll": [r - units * d for r, d in zip(ref, rises, strict=True)], "passage_units": [units] * n}


def reference_ll(n: int = 16, units: int = 1000) -> list[float]:
    return [-units * (0.7 + 0.01 * i) for i in range(n)]


def perplexity_summary(cands: dict[str, dict[str, Any]], n: int = 16, repeats: list[list[float]] | None = None
                       ) -> dict[str, Any]:
    ref = {"bits_per_byte": 1.0, "word_perplexity": 20.0, "passage_doc": list(range(n)),
           "passage_ll": reference_ll(n), "passage_units": [1000] * n,
           "repeat_ll": repeats if repeats is not None else [reference_ll(n)]}
    return {"reference": "ref", "unit": "byte", "servers": {"ref": ref, **cands}}


def agreement_rows(top1: float, kl: float, n: int = 8, positions: int = 500) -> dict[str, Any]:
    tops = [positions * min(1.0, top1 + 0.01 * SPREAD[i]) for i in range(n)]
    kls = [positions * max(0.0, kl * (1 + 0.1 * SPREAD[i])) for i in range(n)]
    return {"kl_mean": sum(kls) / (n * positions), "top1_agreement": sum(tops) / (n * positions),
            "positions": n * positions, "passages": n, "passage_kl_sum": kls, "passage_top1_sum": tops,
            "passage_positions": [positions] * n}


def inventory(name: str, role: str, tokens: int, *, status: str = "ok", error: str | None = None,
              dtype: str = "auto") -> dict[str, Any]:
    return {
        "name": name, "url": f"http://127.0.0.1/{name}", "role": role, "status": status, "error": error,
        "healthy": status == "ok", "version": "0.32.0", "model": "needle-llama", "model_root": "/m",
        "max_model_len": 8192, "cache_config": {"cache_dtype": dtype, "block_size": "16"},
        "capacity": {"kv_cache_tokens": tokens, "estimate": False, "max_concurrency": tokens / 8192,
                     "num_blocks": tokens // 16, "block_size": 16},
        "kv_usage": 0.0, "has_tokenize": True, "smoke": {"ok": status == "ok", "prompt_tokens": 4096},
        "warnings": [], "cache_dtype": dtype,
    }


def needle_cases(server: str, hits: int, n: int = 40, truncated: int = 0) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        status = "hit" if i < hits else ("truncated" if i < hits + truncated else "miss")
        out.append({"id": f"n{i:02d}", "length_tokens": 1024 + 100 * i, "depth_tokens": 50 * i, "server": server,
                    "status": status, "found_in": "reasoning,content" if status == "hit" else None})
    return out


def load_cases(tps: list[float], p99: list[float], agents: int = 4) -> list[dict[str, Any]]:
    return [{"agents": agents, "requests": 16, "errors": 0, "output_tokens_per_s": t, "ttft_p99_s": p,
             "itl_p99_s": p / 10, "e2e_p99_s": p * 4, "kv_usage_max": 0.1, "preemptions": 0}
            for t, p in zip(tps, p99, strict=True)]


class Measurements:
    """A passing two-server run by default (ref vs cand, cand at 2x capacity); tests edit it."""

    def __init__(self) -> None:
        self.bars = dict(BARS)
        self.probes_requested = ["capacity", "perplexity", "agreement", "needle", "load"]
        self.servers = [("ref", "reference", 100_000, "auto"), ("cand", "candidate", 200_000, "fp8")]
        self.status: dict[str, tuple[str, str | None]] = {}
        self.pin_differences: dict[str, list[dict[str, Any]]] = {}
        self.broken_events: list[tuple[str, str]] = []
        self.knob = "kv_cache_dtype"
        self.memmap: dict[str, Any] | None = None  # capacity.json's memory map (model_config set)
        self.perplexity: dict[str, Any] | None = perplexity_summary({"cand": perplexity_rows(0.001)})
        self.agreement: dict[str, Any] | None = {"cand": agreement_rows(0.98, 0.002)}
        self.needle: dict[str, Any] | None = {
            "reference": "ref",
            "servers": {"ref": {"hit": 40, "miss": 0, "truncated": 0, "error": 0, "recall": 1.0},
                        "cand": {"hit": 40, "miss": 0, "truncated": 0, "error": 0, "recall": 1.0}},
            "cases": needle_cases("ref", 40) + needle_cases("cand", 40),
            "settings": {"max_tokens": 1024}}
        self.load: dict[str, Any] | None = {
            "reference": "ref",
            "servers": {"ref": {"cases": load_cases([100, 101, 99, 100], [1.0, 1.01, 0.99, 1.0])},
                        "cand": {"cases": load_cases([104, 105, 103, 104], [0.97, 0.98, 0.96, 0.97])}}}

        self.tasks: dict[str, Any] | None = None  # tasks.json; set it and add "tasks" to probes_requested

    def write(self, path: Path) -> RunDir:
        run = RunDir.create(path)
        config = {"bars": self.bars,
                  "server": [{"name": n, "url": f"http://127.0.0.1/{n}", "role": r} for n, r, _, _ in self.servers]}
        run.write_json("run.json", {"kvprobe_version": "0.1.0", "started": "2026-01-01T00:00:00.000Z",
                                    "probes": self.probes_requested, "config": config})
        for name, role, tokens, dtype in self.servers:
            status, error = self.status.get(name, ("ok", None))
            run.write_json(f"inventory/{name}.json", inventory(name, role, tokens, status=status, error=error,
                                                               dtype=dtype))
            run.event("inventory", server=name, status=status)
        ref = self.servers[0][0]
        pin = {"valid": not any(self.pin_differences.values()),
               "differences": [d for ds in self.pin_differences.values() for d in ds],
               "by_candidate": {n: self.pin_differences.get(n, []) for n, r, _, _ in self.servers
                                if r == "candidate"},
               "unchecked": [], "knob": self.knob,
               "knob_values": {n: d for n, _, _, d in self.servers}}
        caps = {n: {"kv_cache_tokens": t, "ratio": t / self.servers[0][2], "cache_dtype": d, "estimate": False}
                for n, _, t, d in self.servers}
        if "capacity" in self.probes_requested:
            memmap = {"memmap": self.memmap} if self.memmap is not None else {}
            run.write_json("capacity.json", {"reference": ref, "servers": caps, "pin": pin, **memmap})
        run.event("pin", **pin)
        for name, error in self.broken_events:
            run.event("broken", server=name, error=error)
        for probe in ("perplexity", "agreement", "needle", "load", "tasks"):
            data = getattr(self, probe)
            if data is not None and probe in self.probes_requested:
                run.write_json(f"{probe}.json", data)
        return run


def tasks_summary(ref_scores: list[float], cand_scores: list[float], *, task: str = "qa",
                  truncated: tuple[int, ...] = (), ref_truncated: tuple[int, ...] = (),
                  higher_is_better: bool = True) -> dict[str, Any]:
    """tasks.json as the tasks probe writes it, from per-document scores (truncated / ref_truncated:
    documents the cap cut on the candidate / the reference), through the probe's own summarise."""
    from types import SimpleNamespace

    from kvprobe.probes.tasks import summarise
    from kvprobe.quality.task_eval import SampleRow, TaskInfo

    info = TaskInfo(task, "generate_until", "exact_match", higher_is_better, len(ref_scores), "d")
    rows = {("ref", task): [SampleRow(i, s, truncated=i in ref_truncated) for i, s in enumerate(ref_scores)],
            ("cand", task): [SampleRow(i, s, truncated=i in truncated) for i, s in enumerate(cand_scores)]}
    settings = SimpleNamespace(bootstrap_resamples=2000, seed=0, max_gen_toks=1024, limit=None)
    return summarise("ref", ["ref", "cand"], [info], rows, settings, {})
