"""Is kvprobe's client ever the bottleneck? Figures against targets, in one run.

A minimal OpenAI-compatible streaming server (benchmarks/mock_server.py) runs in its own process on
127.0.0.1; each client measurement runs in a fresh process too, so none shares an interpreter:

1. sustained streamed tokens/s at 256 concurrent streams against an instant server, kvprobe vs
   `vllm bench serve` (the vLLM CPU venv kvprobe's launcher installs), alternating, several rounds;
   target: kvprobe >= 2.0x vllm bench serve (ratio of medians).
2. TTFT and ITL error at 256 streams against a server that sends the first token D1 after the
   request and then one every D2: target p99 |error| < 1 ms. Measured two ways: against the
   injected D1/D2 (includes the mock server's own lateness: a Python event loop wakes with ~1 ms
   granularity), and against what the server really did (each token carries its send time on the
   same monotonic clock), which is the error kvprobe itself adds.
3. peak RSS of the client process at 1000 concurrent streams: target < 300 MB.

    .venv/bin/python benchmarks/client_overhead.py            # all three, ~1-2 minutes
    .venv/bin/python benchmarks/client_overhead.py --skip-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TARGET_RATIO = 2.0
TARGET_ERROR_MS = 1.0
TARGET_RSS_MB = 300.0


# -- workers (run in their own process: `client_overhead.py --worker KIND ...`) --------------------

async def _run_streams(port: int, streams: int, requests: int, tokens: int,
                       keep: Callable[[Any], Any] = lambda g: g) -> tuple[list[Any], float]:
    """`requests` requests, at most `streams` at once (what `vllm bench serve --max-concurrency` does);
    `keep` reduces each finished Generation to what the caller needs, as the load probe does."""
    from kvprobe.client import Client

    client = Client("mock", f"http://127.0.0.1:{port}", max_connections=streams)
    client.model = "mock"
    sem = asyncio.Semaphore(streams)
    body = {"messages": [{"role": "user", "content": "Say something long."}], "max_tokens": tokens}

    async def one() -> Any:
        async with sem:
            return keep(await client.stream_chat(body))

    t0 = time.perf_counter()
    gens = await asyncio.gather(*(one() for _ in range(requests)))
    wall = time.perf_counter() - t0
    await client.aclose()
    return gens, wall


async def _steady_streams(port: int, streams: int, per_stream: int, tokens: int, request_s: float) -> list[Any]:
    """`streams` workers, each sending `per_stream` requests back to back, over warm connections and
    with start times spread over one request's duration: a sustained load, not a synchronized burst
    (a burst of new connections measures connection setup, not streaming)."""
    from kvprobe.client import Client

    client = Client("mock", f"http://127.0.0.1:{port}", max_connections=streams)
    client.model = "mock"
    warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    await asyncio.gather(*(client.stream_chat(warm) for _ in range(streams)))
    body = {"messages": [{"role": "user", "content": "Say something long."}], "max_tokens": tokens}

    async def worker(i: int) -> list[Any]:
        await asyncio.sleep(request_s * i / streams)
        return [await client.stream_chat(body) for _ in range(per_stream)]

    results = await asyncio.gather(*(worker(i) for i in range(streams)))
    await client.aclose()
    return [g for r in results for g in r]


def worker_throughput(port: int, streams: int, requests: int, tokens: int) -> dict[str, Any]:
    from kvprobe.load.generator import quiet_gc  # as the load probe runs each case

    def keep(g: Any) -> tuple[bool, int, int]:
        return g.ok, (g.usage or {}).get("completion_tokens", 0), len(g.chunks)

    with quiet_gc():
        done, wall = asyncio.run(_run_streams(port, streams, requests, tokens, keep))
    ok = [d for d in done if d[0]]
    return {"tokens_per_s": sum(d[1] for d in ok) / wall, "wall_s": wall, "errors": len(done) - len(ok),
            "chunks_seen": sum(d[2] for d in ok)}


def worker_timing(port: int, streams: int, per_stream: int, tokens: int, ttft: float, itl: float) -> dict[str, Any]:
    """Errors against the injected delays, and against what the server really did: each token's text
    is its send time (the first also the request's arrival), on the same monotonic clock."""
    from kvprobe.load.generator import quiet_gc  # as the load probe runs each case

    with quiet_gc():
        gens = asyncio.run(_steady_streams(port, streams, per_stream, tokens, ttft + (tokens - 1) * itl))
    ok = [g for g in gens if g.ok]
    ttft_err, itl_err, ttft_client, itl_client = [], [], [], []
    for g in ok:
        toks = [c for c in g.chunks if c.content]
        sent = [float(c.content.split("/")[-1]) for c in toks]
        arrived_at_server = float(toks[0].content.split("/")[0])
        ttft_err.append(abs(g.ttft - ttft))
        ttft_client.append(abs(g.ttft - (sent[0] - arrived_at_server)))
        for k in range(1, len(toks)):
            gap = toks[k].t - toks[k - 1].t
            itl_err.append(abs(gap - itl))
            itl_client.append(abs(gap - (sent[k] - sent[k - 1])))
    ms = [sorted(x * 1000 for x in v) for v in (ttft_err, itl_err, ttft_client, itl_client)]
    return {"errors": len(gens) - len(ok), "ttft_err_ms": _pcts(ms[0]), "itl_err_ms": _pcts(ms[1]),
            "ttft_client_err_ms": _pcts(ms[2]), "itl_client_err_ms": _pcts(ms[3]), "itl_gaps": len(ms[1])}


def worker_rss(port: int, streams: int, tokens: int) -> dict[str, Any]:
    from kvprobe.load.generator import quiet_gc  # as the load probe runs each case

    with quiet_gc():
        gens, wall = asyncio.run(_run_streams(port, streams, streams, tokens))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_rss_mb": peak_kb / 1024, "errors": sum(1 for g in gens if not g.ok), "wall_s": wall,
            "streams": streams}


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    n = len(values)
    return {"p50": values[n // 2], "p99": values[min(n - 1, int(0.99 * n))], "max": values[-1]}


# -- orchestration --------------------------------------------------------------------------------

def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read()


@contextmanager
def mock_server(ttft: float = 0.0, itl: float = 0.0, precise: bool = False):
    from kvprobe.servers.launcher import free_port, healthy

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "mock_server.py"), "--port", str(port),
                             "--ttft", str(ttft), "--itl", str(itl), *(["--precise"] if precise else [])])
    try:
        deadline = time.monotonic() + 20
        while not healthy(f"http://127.0.0.1:{port}"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("mock server did not start")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _worker(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_bench(port: int, streams: int, requests: int, tokens: int) -> dict[str, Any]:
    from kvprobe.servers.launcher import ensure_venv, home, staged_model

    python = ensure_venv()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(python), str(home() / "vllm_cli.py"), "bench", "serve", "--backend", "openai-chat",
               "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions",
               "--model", "mock", "--tokenizer", staged_model(), "--dataset-name", "random",
               "--input-len", "16", "--output-len", str(tokens), "--num-prompts", str(requests),
               "--max-concurrency", str(streams), "--num-warmups", "0", "--disable-tqdm",
               "--save-result", "--result-dir", tmp, "--result-filename", "vb.json"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        path = Path(tmp) / "vb.json"
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"vllm bench serve failed: {(done.stderr or done.stdout).strip()[-1500:]}")
        data = json.loads(path.read_text())
    return {"tokens_per_s": data["output_throughput"], "completed": data["completed"],
            "failed": data.get("failed", 0), "wall_s": data["duration"]}


def main() -> None:
    ap = argparse.ArgumentParser(description="kvprobe client overhead: figures against targets")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request (throughput)")
    ap.add_argument("--requests", type=int, default=2048, help="requests per throughput run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating kvprobe / vllm bench rounds")
    ap.add_argument("--ttft", type=float, default=0.1, help="injected time to first token, s")
    ap.add_argument("--itl", type=float, default=0.02, help="injected time between tokens, s")
    ap.add_argument("--timing-tokens", type=int, default=64)
    ap.add_argument("--rss-streams", type=int, default=1000)
    ap.add_argument("--skip-vllm", action="store_true", help="no vllm bench serve comparison")
    ap.add_argument("--precise-server", action="store_true",
                    help="timing phase: mock server on a select() loop (microsecond timers, less late at the "
                         "median, but more CPU: on 2 cores its p99 was worse)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    figures: dict[str, Any] = {"load_avg_before": os.getloadavg()}
    with mock_server() as port:
        console.print(f"[bold]1/3 throughput[/bold]: {args.streams} streams x {args.tokens} tokens, "
                      f"{args.requests} requests, instant server on :{port}, {args.rounds} alternating rounds")
        ours, theirs = [], []
        for k in range(args.rounds):
            ours.append(_worker("throughput", str(port), str(args.streams), str(args.requests), str(args.tokens)))
            console.print(f"  round {k + 1}: kvprobe {ours[-1]['tokens_per_s']:,.0f} tok/s "
                          f"({ours[-1]['errors']} errors)")
            if not args.skip_vllm:
                theirs.append(vllm_bench(port, args.streams, args.requests, args.tokens))
                console.print(f"  round {k + 1}: vllm bench serve {theirs[-1]['tokens_per_s']:,.0f} tok/s "
                              f"({theirs[-1]['failed']} failed)")
        figures["kvprobe_runs"], figures["vllm_runs"] = ours, theirs
    with mock_server(args.ttft, args.itl, precise=args.precise_server) as port:
        console.print(f"[bold]2/3 timing[/bold]: {args.streams} streams x 3 requests each (warm connections, "
                      f"staggered starts), first token after {args.ttft * 1000:.0f} ms then one every "
                      f"{args.itl * 1000:.0f} ms, {args.timing_tokens} tokens")
        timing = _worker("timing", str(port), str(args.streams), "3", str(args.timing_tokens),
                         str(args.ttft), str(args.itl))
        server_stats = json.loads(_get(f"http://127.0.0.1:{port}/stats"))
        figures["timing"], figures["timing_server"] = timing, server_stats
    with mock_server(0.1, 0.05) as port:
        console.print(f"[bold]3/3 memory[/bold]: {args.rss_streams} concurrent streams")
        figures["rss"] = _worker("rss", str(port), str(args.rss_streams), "64")
    figures["load_avg_after"] = os.getloadavg()

    ours_tps = statistics.median(r["tokens_per_s"] for r in ours)
    rows: list[tuple[str, str, str, bool | None]] = [
        (f"kvprobe tok/s @{args.streams} streams (median)", f"{ours_tps:,.0f}", "", None)]
    if theirs:
        theirs_tps = statistics.median(r["tokens_per_s"] for r in theirs)
        ratio = ours_tps / theirs_tps
        figures["ratio"] = ratio
        rows += [(f"vllm bench serve tok/s @{args.streams} (median)", f"{theirs_tps:,.0f}", "", None),
                 ("ratio kvprobe / vllm bench serve", f"{ratio:.2f}x", f">= {TARGET_RATIO:.1f}x",
                  ratio >= TARGET_RATIO)]
    t = figures["timing"]
    lat = figures["timing_server"]
    def err(key: str) -> str:
        return f"{t[key]['p99']:.3f} ms ({t[key]['p50']:.3f})"

    rows += [
        ("TTFT |error| p99 (p50) vs injected", err("ttft_err_ms"), f"< {TARGET_ERROR_MS:.0f} ms",
         t["ttft_err_ms"]["p99"] < TARGET_ERROR_MS),
        ("ITL |error| p99 (p50) vs injected", err("itl_err_ms"), f"< {TARGET_ERROR_MS:.0f} ms",
         t["itl_err_ms"]["p99"] < TARGET_ERROR_MS),
        ("  mock server's own lateness p99 (p50)",
         f"{(lat['lateness_p99_s'] or 0) * 1000:.3f} ms ({(lat['lateness_p50_s'] or 0) * 1000:.3f})", "", None),
        ("TTFT |error| p99 (p50) vs what the server did", err("ttft_client_err_ms"), f"< {TARGET_ERROR_MS:.0f} ms",
         t["ttft_client_err_ms"]["p99"] < TARGET_ERROR_MS),
        ("ITL |error| p99 (p50) vs what the server did", err("itl_client_err_ms"), f"< {TARGET_ERROR_MS:.0f} ms",
         t["itl_client_err_ms"]["p99"] < TARGET_ERROR_MS),
        (f"peak RSS @{figures['rss']['streams']} streams", f"{figures['rss']['peak_rss_mb']:.0f} MB",
         f"< {TARGET_RSS_MB:.0f} MB", figures["rss"]["peak_rss_mb"] < TARGET_RSS_MB),
    ]
    table = Table(title="kvprobe client overhead", header_style="bold", width=110)
    for col in ("figure", "measured", "target", "met"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for name, value, target, met in rows:
        table.add_row(name, value, target, "" if met is None else ("[green]yes[/green]" if met else "[red]no[/red]"))
    console.print(table)
    errors = sum(r["errors"] for r in ours) + t["errors"] + figures["rss"]["errors"]
    console.print(f"client errors: {errors}; load average before/after: "
                  f"{figures['load_avg_before'][0]:.1f} / {figures['load_avg_after'][0]:.1f} on {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        kind, *rest = sys.argv[2:]
        if kind == "throughput":
            result = worker_throughput(*map(int, rest))
        elif kind == "timing":
            port, streams, requests, tokens = map(int, rest[:4])
            result = worker_timing(port, streams, requests, tokens, float(rest[4]), float(rest[5]))
        else:
            result = worker_rss(*map(int, rest))
        print(json.dumps(result))
    else:
        main()
