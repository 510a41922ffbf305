"""kvprobe's perplexity engine vs the lm-eval command line, on the same server and passages.

Both sides are fresh processes timed from start to exit, scoring the kvprobe_ppl task (tasks/).
The lm-eval side uses its command-line defaults (one request at a time, batch size 1) plus the two
settings a correct run needs: max_length = the server's max_model_len (its default 2048 would cut
every passage into windows that lose their context) and the server's own tokenizer.
kvprobe's side is kvprobe.quality.lmeval.evaluate, what the perplexity probe runs per server.

Prints both wall times, their ratio and both bits-per-byte values. Target: >= 3x faster, same numbers.
Concurrent requests are cut into prefill chunks differently from lone ones, which can move the last
digits; `--identity` also runs kvprobe with one request in flight, which must match lm-eval exactly.

    python benchmarks/perplexity_speed.py [--url http://127.0.0.1:8101 | --private] [--limit N] [--repeats 3]

--private starts a server of its own (the demo's flags, kv-cache-dtype auto, ~40 s, 3.4 GB) and
stops it after: on a server other clients use, their requests share prefill chunks with ours and
move the last digits of both sides, so only a private server can show identical numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = "kvprobe_ppl"

CHILD = """
import json, sys
from kvprobe.quality import lmeval
url, model, max_length, concurrent, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
target = lmeval.Target(name="bench", url=url, model=model, max_length=max_length,
                       tokenizer=lmeval.Tokenizer("remote"), num_concurrent=concurrent)
with lmeval.quiet():
    result = lmeval.evaluate(target, "kvprobe_ppl", int(limit) if limit != "all" else None)
print(json.dumps({"bits_per_byte": result.aggregate["bits_per_byte"], "docs": len(result.docs)}))
"""


def server_facts(url: str) -> tuple[str, int]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        model = json.load(resp)["data"][0]
    return model["id"], int(model["max_model_len"])


def run_kvprobe(url: str, model: str, max_length: int, concurrent: int, limit: int | None) -> tuple[float, float]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, url, model, str(max_length), str(concurrent),
                           str(limit or "all")], capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"kvprobe run failed:\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])["bits_per_byte"]


def run_lm_eval_cli(url: str, model: str, max_length: int, limit: int | None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
               "--model_args", f"base_url={url}/v1/completions", f"model={model}", "tokenizer_backend=remote",
               f"max_length={max_length}", "--tasks", TASK, "--include_path", str(ROOT / "tasks"),
               "--output_path", out]
        if limit:
            cmd += ["--limit", str(limit)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"lm-eval failed:\n{done.stderr[-2000:]}")
        (results,) = Path(out).rglob("results_*.json")
        return seconds, json.loads(results.read_text())["results"][TASK]["bits_per_byte,none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8101")
    parser.add_argument("--limit", type=int, default=None, help="passages (default: all 16)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; medians reported")
    parser.add_argument("--num-concurrent", type=int, default=None,
                        help="kvprobe's requests in flight (default: PerplexitySettings.num_concurrent)")
    parser.add_argument("--no-identity", action="store_true", help="skip the one-request-at-a-time kvprobe run")
    parser.add_argument("--private", action="store_true", help="start (and stop) a server of its own")
    args = parser.parse_args()
    if not args.private:
        bench(args, args.url)
        return
    from kvprobe.testbed.launcher import ServerSpec, free_port, start

    server = start(ServerSpec(port=free_port()), reuse=False)
    try:
        bench(args, server.url)
    finally:
        server.stop()


def bench(args: argparse.Namespace, url: str) -> None:
    args.url = url

    from kvprobe.config import PerplexitySettings

    concurrent = args.num_concurrent or PerplexitySettings().num_concurrent
    model, max_length = server_facts(args.url)
    print(f"server {args.url} model {model} max_model_len {max_length}; task {TASK}, "
          f"{args.limit or 'all'} passages; {args.repeats} alternating runs each", flush=True)
    kv_times, cli_times, kv_bpb, cli_bpb = [], [], [], []
    for i in range(args.repeats):
        s, b = run_kvprobe(args.url, model, max_length, concurrent, args.limit)
        kv_times.append(s)
        kv_bpb.append(b)
        print(f"  run {i + 1}: kvprobe {s:6.2f} s  bits/byte {b:.10f}", flush=True)
        s, b = run_lm_eval_cli(args.url, model, max_length, args.limit)
        cli_times.append(s)
        cli_bpb.append(b)
        print(f"  run {i + 1}: lm-eval {s:6.2f} s  bits/byte {b:.10f}", flush=True)
    kv, cli = statistics.median(kv_times), statistics.median(cli_times)
    ratio = cli / kv
    print(f"kvprobe (num_concurrent={concurrent}): {kv:.2f} s median wall time (min {min(kv_times):.2f})")
    print(f"lm-eval command line (defaults):   {cli:.2f} s median wall time (min {min(cli_times):.2f})")
    print(f"speed-up: {ratio:.2f}x (target >= 3x: {'met' if ratio >= 3 else 'NOT met'})")
    print(f"bits per byte: kvprobe {kv_bpb[0]:.10f}  lm-eval {cli_bpb[0]:.10f}  "
          f"relative difference {abs(kv_bpb[0] / cli_bpb[0] - 1):.2e}")
    print(f"run-to-run spread: kvprobe {max(kv_bpb) - min(kv_bpb):.2e}, lm-eval {max(cli_bpb) - min(cli_bpb):.2e}")
    if not args.no_identity:
        s, b = run_kvprobe(args.url, model, max_length, 1, args.limit)
        same = "identical" if b == cli_bpb[0] else f"differs by {abs(b / cli_bpb[0] - 1):.2e}"
        print(f"kvprobe with one request in flight: {s:.2f} s, bits per byte {b:.10f} ({same} to lm-eval's)")


if __name__ == "__main__":
    main()
