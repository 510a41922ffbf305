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
    from kvprobe.server.client import Client

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
    from kvprobe.server.client import Client

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
        done, wall = _run(_run_streams(port, streams, requests, tokens, keep))
    ok = [d for d in done if d[0]]
    return {"tokens_per_s": sum(d[1] for d in ok) / wall, "wall_s": wall, "errors": len(done) - len(ok),
            "chunks_seen": sum(d[2] for d in ok)}


def _run(coro: Any) -> Any:
    """asyncio.run, or uvloop's loop when KVPROBE_BENCH_LOOP=uvloop (the candidate fast path)."""
    if os.environ.get("KVPROBE_BENCH_LOOP") == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def worker_timing(port: int, streams: int, per_stream: int, tokens: int, ttft: float, itl: float) -> dict[str, Any]:
    """Errors against the injected delays, and against what the server really did: each token's text
    is its send time (the first also the request's arrival), on the same monotonic clock."""
    from kvprobe.load.generator import quiet_gc  # as the load probe runs each case

    with quiet_gc():
        gens = _run(_steady_streams(port, streams, per_stream, tokens, ttft + (tokens - 1) * itl))
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


def timing_errors(gen: Any, row: dict[str, Any]) -> None:
    """A load row's |error| against what the mock server did (kvprobe.load.processes row_hook: runs in
    the worker process, from the stream's chunks, which the row itself does not keep)."""
    toks = [c for c in gen.chunks if c.content]
    if not gen.ok or not toks:
        return
    sent = [float(c.content.split("/")[-1]) for c in toks]
    arrived_at_server = float(toks[0].content.split("/")[0])
    row["ttft_err"] = abs(gen.ttft - (sent[0] - arrived_at_server))
    row["itl_err"] = [abs((toks[k].t - toks[k - 1].t) - (sent[k] - sent[k - 1])) for k in range(1, len(toks))]


def worker_processes(port: int, processes: int, streams: int, requests: int, tokens: int, ttft: float,
                     itl: float) -> dict[str, Any]:
    """One load case through kvprobe's own sharding (kvprobe.load.processes), as `[load] processes`
    runs it. Instant server (ttft 0): a closed loop of `streams` agents, tok/s. Paced server: an open
    loop at streams / request time (about `streams` in flight, starts spread as real arrivals are),
    |error| vs what the server did over the requests sent after one request time (warm connections)."""
    from kvprobe.config import LoadSettings, Server
    from kvprobe.load.processes import START_DELAY_S, ShardJob, Workers, read_rows
    from kvprobe.load.workload import Shape

    request_s = ttft + (tokens - 1) * itl
    paced = request_s > 0
    settings = LoadSettings(agents=[streams], turns=1, system_tokens=0, tokens_per_turn=1, max_output_tokens=tokens,
                            requests_per_case=requests, warmup=False, processes=processes,
                            **({"mode": "open", "rate": streams / request_s} if paced else {}))
    shape = Shape("bench", (streams,), 1, 0, 1, tokens)

    def jobs(tmp: str, name: str, case_settings: LoadSettings, agents: int = streams) -> list[ShardJob]:
        start = time.perf_counter() + START_DELAY_S
        return [ShardJob(Server(name="mock", url=f"http://127.0.0.1:{port}"), "mock", case_settings, shape, agents,
                         "0be1c4", 4.0, {}, k, processes, start, f"{tmp}/{name}-{k}.jsonl",
                         timing_errors if paced else None) for k in range(processes)]

    async def case(tmp: str) -> list[dict[str, Any]]:
        async with Workers(processes) as workers:
            # A warm-up as the probe's, with twice the streams: the open loop's in-flight count swings
            # above its mean, and a connection opened inside the case waits on the loop in its TTFT.
            warm_agents = 2 * streams if paced else streams
            warm = settings.model_copy(update={"mode": "closed", "requests_per_case": warm_agents})
            await workers.run(jobs(tmp, "warm", warm, warm_agents), lambda _shard: None)
            results = await workers.run(jobs(tmp, "case", settings), lambda _shard: None)
        cpu.extend(r.client["client_cpu_share"] for r in results)
        return [r for k in range(processes) for r in read_rows(f"{tmp}/case-{k}.jsonl")]

    cpu: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(case(tmp))
    ok = [r for r in rows if r["status"] == "ok"]
    wall = max(r["t0"] + r["e2e"] for r in ok) - min(r["t0"] for r in ok)
    out: dict[str, Any] = {"processes": processes, "streams": streams, "requests": len(rows),
                           "errors": len(rows) - len(ok), "tokens_per_s": sum(r["output_tokens"] for r in ok) / wall,
                           "wall_s": wall, "cpu_share_by_process": cpu}
    if paced:
        warm = [r for r in ok if r["t0"] >= request_s and "ttft_err" in r]
        out["ttft_client_err_ms"] = _pcts(sorted(r["ttft_err"] * 1000 for r in warm))
        out["itl_client_err_ms"] = _pcts(sorted(x * 1000 for r in warm for x in r["itl_err"]))
        out["measured_requests"] = len(warm)
    return out


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
    from kvprobe.testbed.launcher import free_port, healthy

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "mock_server.py"), "--port", str(port),
                             "--ttft", str(ttft), "--itl", str(itl), *(["--precise"] if precise else [])],
                            preexec_fn=lambda: _pin(SERVER_CPU))
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


# Server and client each on a core of their own: on a 2-core box they otherwise preempt each other,
# and a server preempted between stamping a token and sending it looks like a late client.
SERVER_CPU, CLIENT_CPU = 0, 1


def _pin(cpu: int) -> None:
    if (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _worker(*args: str, env: dict[str, str] | None = None, cpus: set[int] | None = None) -> dict[str, Any]:
    """A worker in a fresh process, on the client core (or on `cpus`, when the box has them)."""
    def place() -> None:
        if cpus is None:
            _pin(CLIENT_CPU)
        else:
            os.sched_setaffinity(0, cpus)

    done = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, preexec_fn=place)
    if done.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_bench(port: int, streams: int, requests: int, tokens: int) -> dict[str, Any]:
    from kvprobe.testbed.launcher import ensure_venv, home, staged_model

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


# Where a chunk's receive time comes from (kvprobe.server.streaming): the loop's read callback, or the
# kernel's stamp (kvprobe.server.rxstamp); on asyncio's loop or on uvloop when it is installed.
METHODS = (("loop", "asyncio"), ("kernel", "asyncio"), ("loop", "uvloop"), ("kernel", "uvloop"))
TARGET_STAMPED_MS = {256: 0.5, 1000: 1.0}


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def stamps_comparison(console: Any, args: Any, counts: list[int], same_rate: bool = True) -> list[dict[str, Any]]:
    """TTFT and ITL error vs what the server did, per stream count and receive-time source. Each
    run gets a fresh mock server: select()-timed (precise) up to 1000 sockets, epoll beyond.

    same_rate: the gap between tokens grows with the stream count (itl x streams / 256), so the
    aggregate token rate stays that of 256 streams: the one-core Python mock server falls 50-230 ms
    behind at 1000 streams x 50 tokens/s (measured), and its lateness would be counted as the client's."""
    rows = []
    methods = [m for m in METHODS if m[1] == "asyncio" or _has_uvloop()]
    for streams in counts:
        itl = args.itl * max(1.0, streams / 256) if same_rate else args.itl
        for stamps, loop in methods:
            with mock_server(args.ttft, itl, precise=streams < 1000) as port:
                got = _worker("timing", str(port), str(streams), "3", str(args.timing_tokens), str(args.ttft),
                              str(itl), env={"KVPROBE_STREAM_STAMPS": stamps, "KVPROBE_BENCH_LOOP": loop})
                server = json.loads(_get(f"http://127.0.0.1:{port}/stats"))
            rows.append({"streams": streams, "stamps": stamps, "loop": loop, "itl_s": itl, **got,
                         "tokens_per_s": streams / itl,
                         "server_lateness_p99_ms": (server.get("lateness_p99_s") or 0) * 1000})
            # not `itl`: that is the next method's gap between tokens (reusing it made the second
            # method's run take minutes, the "hang" met before at 1000 streams)
            ttft_err, itl_err = got["ttft_client_err_ms"]["p99"], got["itl_client_err_ms"]["p99"]
            console.print(f"  {streams} streams, {stamps} stamps on {loop}: TTFT p99 {ttft_err:.3f} ms, "
                          f"ITL p99 {itl_err:.3f} ms ({got['errors']} errors)")
    return rows


def stamps_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="timing error vs what the server did, by receive-time source (p99, p50 in brackets)",
                  header_style="bold", width=118)
    for col in ("streams", "tok/s", "stamps", "loop", "TTFT |error|", "ITL |error|", "server late p99", "target",
                "met"):
        table.add_column(col, justify="left" if col in ("stamps", "loop") else "right")
    for r in rows:
        target = TARGET_STAMPED_MS.get(r["streams"])
        worst = max(r["ttft_client_err_ms"]["p99"] or 0, r["itl_client_err_ms"]["p99"] or 0)
        met = "" if target is None else ("[green]yes[/green]" if worst < target else "[red]no[/red]")
        table.add_row(str(r["streams"]), f"{r['tokens_per_s']:,.0f}", r["stamps"], r["loop"],
                      f"{r['ttft_client_err_ms']['p99']:.3f} ({r['ttft_client_err_ms']['p50']:.3f})",
                      f"{r['itl_client_err_ms']['p99']:.3f} ({r['itl_client_err_ms']['p50']:.3f})",
                      f"{r['server_lateness_p99_ms']:.3f}", "report" if target is None else f"< {target:g} ms", met)
    return table


TARGET_PROCESSES_RATIO = 1.8


def processes_comparison(console: Any, args: Any) -> dict[str, list[dict[str, Any]]]:
    """kvprobe's own sharding (`[load] processes`) per process count. Throughput against the instant
    server, clients on the client core and then on every core (the only way this box gives two
    processes two cores: shared with the mock server); timing error against the paced server at each
    stream count (the same aggregate token rate, as in the timing phase), clients on the client core."""
    counts = [int(n) for n in args.processes.split(",")]
    all_cpus = set(range(os.cpu_count() or 1))
    placements: list[tuple[str, set[int] | None]] = [("client core", None)]  # _pin's: none on a 1-core box
    placements += [("all cores, shared", all_cpus)] if len(all_cpus) > 1 else []
    out: dict[str, list[dict[str, Any]]] = {"throughput": [], "timing": []}
    with mock_server() as port:
        for label, cpus in placements:
            for n in counts:
                runs = [_worker("processes", str(port), str(n), str(args.streams), str(args.requests),
                                str(args.tokens), "0", "0", cpus=cpus) for _ in range(args.rounds)]
                tps = statistics.median(r["tokens_per_s"] for r in runs)
                out["throughput"].append({"placement": label, "cpus": sorted(cpus or {CLIENT_CPU}), "processes": n,
                                          "tokens_per_s": tps, "runs": runs})
                console.print(f"  {n} process{'es' if n > 1 else ''} on {label}: {tps:,.0f} tok/s (median of "
                              f"{len(runs)}; CPU per process {runs[-1]['cpu_share_by_process']})")
    for streams in [int(n) for n in args.processes_streams.split(",")]:
        itl = args.itl * max(1.0, streams / 256)
        tokens = args.timing_tokens if streams <= 1000 else 16
        for n in counts:
            with mock_server(args.ttft, itl, precise=streams < 1000) as port:
                got = _worker("processes", str(port), str(n), str(streams), str(streams * 3), str(tokens),
                              str(args.ttft), str(itl))
                server = json.loads(_get(f"http://127.0.0.1:{port}/stats"))
            out["timing"].append({"streams": streams, "processes": n, "itl_s": itl, **got,
                                  "server_lateness_p99_ms": (server.get("lateness_p99_s") or 0) * 1000})
            ttft, itl_err = got["ttft_client_err_ms"]["p99"], got["itl_client_err_ms"]["p99"]
            console.print(f"  {streams} streams on {n} process{'es' if n > 1 else ''}: TTFT p99 {ttft:.3f} ms, "
                          f"ITL p99 {itl_err:.3f} ms ({got['errors']} errors, {got['tokens_per_s']:,.0f} tok/s)")
    return out


def processes_tables(figures: dict[str, list[dict[str, Any]]]) -> list[Any]:
    from rich.table import Table

    thr = Table(title="kvprobe tok/s with N processes vs 1 (\\[load] processes; median of rounds)",
                header_style="bold", width=118)
    for col in ("placement", "processes", "tok/s", "vs 1 process", "CPU per process", "target", "met"):
        thr.add_column(col, justify="left" if col == "placement" else "right")
    base = {r["placement"]: r["tokens_per_s"] for r in figures["throughput"] if r["processes"] == 1}
    for r in figures["throughput"]:
        ratio = r["tokens_per_s"] / base[r["placement"]] if r["placement"] in base else None
        target = r["processes"] == 2
        met = "" if not target or ratio is None else (
            "[green]yes[/green]" if ratio >= TARGET_PROCESSES_RATIO else "[red]no[/red]")
        cpu = ", ".join(f"{c:.0%}" for c in r["runs"][-1]["cpu_share_by_process"])
        thr.add_row(f"{r['placement']} {r['cpus']}", str(r["processes"]), f"{r['tokens_per_s']:,.0f}",
                    "" if ratio is None else f"{ratio:.2f}x", cpu,
                    f">= {TARGET_PROCESSES_RATIO}x" if target else "", met)
    timing = Table(title="timing error vs what the server did, by process count (p99, p50 in brackets)",
                   header_style="bold", width=118)
    for col in ("streams", "processes", "tok/s", "TTFT |error|", "ITL |error|", "server late p99", "target", "met"):
        timing.add_column(col, justify="right")
    for r in figures["timing"]:
        target = TARGET_STAMPED_MS.get(r["streams"])
        worst = max(r["ttft_client_err_ms"]["p99"] or 0, r["itl_client_err_ms"]["p99"] or 0)
        met = "" if target is None else ("[green]yes[/green]" if worst < target else "[red]no[/red]")
        timing.add_row(str(r["streams"]), str(r["processes"]), f"{r['tokens_per_s']:,.0f}",
                       f"{r['ttft_client_err_ms']['p99']:.3f} ({r['ttft_client_err_ms']['p50']:.3f})",
                       f"{r['itl_client_err_ms']['p99']:.3f} ({r['itl_client_err_ms']['p50']:.3f})",
                       f"{r['server_lateness_p99_ms']:.3f}", "report" if target is None else f"< {target:g} ms", met)
    return [thr, timing]


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
    ap.add_argument("--stamps-streams", default="256,1000,4096",
                    help="timing by receive-time source: stream counts (each against a fresh mock server)")
    ap.add_argument("--skip-stamps", action="store_true", help="no timing comparison by receive-time source")
    ap.add_argument("--processes", default="1,2", help="process counts for [load] processes (throughput, timing)")
    ap.add_argument("--processes-streams", default="256,1000,4096", help="timing by process count: stream counts")
    ap.add_argument("--skip-processes", action="store_true", help="no comparison by process count")
    ap.add_argument("--stamps-same-itl", action="store_true",
                    help="every stream count at --itl (default: the aggregate token rate of 256 streams)")
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
    if not args.skip_stamps:
        figures["stamps"] = stamps_comparison(console, args, [int(n) for n in args.stamps_streams.split(",")],
                                              same_rate=not args.stamps_same_itl)
    if not args.skip_processes:
        console.print(f"[bold]processes[/bold]: the load probe's sharding, {args.processes} processes")
        figures["processes"] = processes_comparison(console, args)
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
    for r in (figures.get("processes") or {}).get("throughput", []):
        one = next(b for b in figures["processes"]["throughput"]
                   if b["placement"] == r["placement"] and b["processes"] == 1)
        if r["processes"] > 1:
            ratio = r["tokens_per_s"] / one["tokens_per_s"]
            rows.append((f"kvprobe tok/s with {r['processes']} processes vs 1 ({r['placement']})", f"{ratio:.2f}x",
                         f">= {TARGET_PROCESSES_RATIO}x" if r["processes"] == 2 else "",
                         ratio >= TARGET_PROCESSES_RATIO if r["processes"] == 2 else None))
    table = Table(title="kvprobe client overhead", header_style="bold", width=110)
    for col in ("figure", "measured", "target", "met"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for name, value, target, met in rows:
        table.add_row(name, value, target, "" if met is None else ("[green]yes[/green]" if met else "[red]no[/red]"))
    console.print(table)
    if figures.get("stamps"):
        console.print(stamps_table(figures["stamps"]))
    if figures.get("processes"):
        for table in processes_tables(figures["processes"]):
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
        elif kind == "processes":
            port, processes, streams, requests, tokens = map(int, rest[:5])
            result = worker_processes(port, processes, streams, requests, tokens, float(rest[5]), float(rest[6]))
        elif kind == "timing":
            port, streams, requests, tokens = map(int, rest[:4])
            result = worker_timing(port, streams, requests, tokens, float(rest[4]), float(rest[5]))
        else:
            result = worker_rss(*map(int, rest))
        print(json.dumps(result))
    else:
        main()
