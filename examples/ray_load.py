"""One load case sharded over Ray tasks on a local one-node Ray cluster: the way past one host that
the README's design note chooses (an existing engine, as llmperf uses Ray), shown on one host.

    .venv/bin/pip install -e '.[ray]'
    .venv/bin/python examples/ray_load.py --url http://127.0.0.1:8101 --agents 8 --shards 2

Each shard is kvprobe's own (kvprobe.load.processes.run_shard: its agents, its own client and event
loop), run in a Ray task instead of a `[load] processes` worker. Its rows come back through ray.get,
as they would from another host. Two things differ from one host's worker processes:
- no shared clock: a start time on one host's CLOCK_MONOTONIC means nothing on another, so each
  shard starts when its task does, and its TTFT / ITL are its own host's;
- so only throughput is combined over shards (tokens over the union of their spans, which on one
  node here share a clock; across hosts it would be each host's tokens over a wall-clock window).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvprobe.config import LoadSettings, Server
from kvprobe.load.processes import ShardJob, read_rows, run_shard
from kvprobe.load.stats import summarize_run
from kvprobe.load.workload import shapes_of


def shard_task(job: ShardJob) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Runs on a Ray worker: the shard, then its rows from that worker's own disk."""
    import dataclasses

    with tempfile.TemporaryDirectory() as tmp:
        job = dataclasses.replace(job, rows_path=str(Path(tmp) / f"{job.shard}.jsonl"))
        result = run_shard(job)
        return dataclasses.asdict(result), read_rows(job.rows_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a vLLM OpenAI-compatible server")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-output-tokens", type=int, default=32)
    args = ap.parse_args()

    import ray

    with urllib.request.urlopen(f"{args.url}/v1/models", timeout=10) as resp:
        model = json.load(resp)["data"][0]["id"]
    settings = LoadSettings(agents=[args.agents], turns=args.turns, system_tokens=64, tokens_per_turn=64,
                            max_output_tokens=args.max_output_tokens, warmup=False)
    shape = shapes_of(settings)[0]
    server = Server(name="ray", url=args.url)
    jobs = [ShardJob(server, model, settings, shape, args.agents, "0a1b2c", 4.0, {}, k, args.shards, None, "")
            for k in range(args.shards)]

    ray.init(num_cpus=args.shards, include_dashboard=False, log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        print(f"ray {ray.__version__}: a local cluster of {len(nodes)} node, {ray.cluster_resources().get('CPU')} CPUs")
        t0 = time.perf_counter()
        remote = ray.remote(num_cpus=1)(shard_task)
        answers = ray.get([remote.remote(job) for job in jobs])
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()

    rows_all = []
    for result, rows in answers:
        duration = max(r["t0"] + (r["e2e"] or 0) for r in rows) - min(r["t0"] for r in rows)
        s = summarize_run(rows, duration, settings.slo)
        print(f"shard {result['shard']} (pid {result['pid']}): {s['requests']} requests, {s['errors']} errors, "
              f"agents {sorted({r['agent'] for r in rows})}, {s['output_tokens_per_s']:.0f} tok/s, "
              f"TTFT p99 {s['ttft_p99_s'] * 1000:.1f} ms, ITL p99 {s['itl_p99_s'] * 1000:.1f} ms, "
              f"client {result['client']['client_stamps']} stamps, CPU {result['client']['client_cpu_share']:.0%}")
        rows_all += [r | {"shard": result["shard"]} for r in rows]
    # One node, one clock: each shard's t0 is against its own start, so the spans are put on the wall
    # clock by their starts (t_start), which share CLOCK_MONOTONIC here.
    starts = {result["shard"]: result["t_start"] for result, _ in answers}
    spans = [(starts[r["shard"]] + r["t0"], starts[r["shard"]] + r["t0"] + (r["e2e"] or 0)) for r in rows_all]
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    tokens = sum(r["output_tokens"] for r in rows_all if r["status"] == "ok")
    print(f"all shards: {len(rows_all)} requests, {tokens / window:.0f} tok/s over {window:.2f} s "
          f"(ray.get round trip {wall:.2f} s)")


if __name__ == "__main__":
    main()
