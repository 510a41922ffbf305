"""A small fault-injecting HTTP proxy in front of a real server, for faults a real vLLM server
won't produce on demand: answer health but fail prefill, delay, drop the connection, cut a stream.

    with FaultProxy("http://127.0.0.1:8101", {"/v1/completions": Fault(status=500, body=...)}) as url:
        ...  # talk to url; everything else is forwarded unchanged

`choose(method, path, body)` picks a fault per request instead (benchmarks/soak.py: random faults
at a rate); a Fault's `fired` says whether it happened (a cut past the body's end does not).

As a program it fronts one server with every streamed answer's time line stretched, a candidate made
slower on purpose (the GPU speed runs): `python tests/faultproxy.py --stretch 1.3 --port 8105
http://127.0.0.1:8102`.
"""

from __future__ import annotations

import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


@dataclass
class Fault:
    status: int | None = None        # answer with this status instead of forwarding
    body: bytes = b""
    delay_s: float = 0.0             # wait before answering
    drop: bool = False               # close the connection without answering
    cut_after_bytes: int | None = None  # forward, but stop the body after this many bytes
    reset: bool = False              # close with a TCP RST (SO_LINGER 0) instead of answering
    event_delay_s: float = 0.0       # forward, but hold each server-sent event this long (a slower server)
    stretch: float = 1.0             # forward each server-sent event at t0 + stretch * (its arrival - t0)
    fired: bool = False              # set by the proxy once the fault happened


Chooser = Callable[[str, str, bytes], Fault | None]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up (timed out) is expected
            super().handle_error(request, client_address)


class FaultProxy:
    def __init__(self, upstream: str, faults: dict[str, Fault] | None = None, choose: Chooser | None = None):
        self.upstream = upstream.rstrip("/")
        self.faults = dict(faults or {})
        self.choose = choose
        self.hits: list[str] = []
        self.authorization: list[str | None] = []  # what each request carried, to check keys are sent
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                path = self.path.split("?")[0]
                proxy.hits.append(f"{self.command} {path}")
                proxy.authorization.append(self.headers.get("authorization"))
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy.faults.get(path)
                if fault is None and proxy.choose is not None:
                    fault = proxy.choose(self.command, path, body)
                t0 = time.perf_counter()
                if fault and (fault.delay_s or fault.drop or fault.reset or fault.status is not None):
                    fault.fired = True
                if fault and fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault and fault.reset:
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                if fault and fault.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault and fault.status is not None:
                    self.send_response(fault.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(fault.body)))
                    self.end_headers()
                    self.wfile.write(fault.body)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                with httpx.Client(timeout=600) as client, client.stream(
                        self.command, proxy.upstream + self.path, content=body, headers=headers) as resp:
                    self.send_response(resp.status_code)
                    for key, value in resp.headers.items():
                        if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                            self.send_header(key, value)
                    self.send_header("connection", "close")
                    self.end_headers()
                    sent = 0
                    if fault and (fault.event_delay_s or fault.stretch != 1.0):
                        fault.fired = True
                        self._slowly(resp, fault.event_delay_s, t0, fault.stretch)
                        self.close_connection = True
                        return
                    for chunk in resp.iter_raw():
                        if fault and fault.cut_after_bytes is not None and sent + len(chunk) > fault.cut_after_bytes:
                            self.wfile.write(chunk[: fault.cut_after_bytes - sent])
                            self.wfile.flush()
                            fault.fired = True
                            break
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        sent += len(chunk)
                    self.close_connection = True

            def _slowly(self, resp: httpx.Response, delay_s: float, t0: float, stretch: float) -> None:
                """Each event (up to its blank line) held delay_s, so the tokens arrive that much apart at
                least, and sent no sooner than its arrival's time since the request, times `stretch`. A
                reader thread stamps the upstream bytes as they come: stamped after this thread's own
                sleeps, each stretch would compound on the last (1.3x per event, not per answer)."""
                arrivals: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

                def read() -> None:
                    try:
                        for chunk in resp.iter_raw():
                            arrivals.put((time.perf_counter(), chunk))
                    finally:
                        arrivals.put(None)

                threading.Thread(target=read, daemon=True).start()
                pending = b""
                while (item := arrivals.get()) is not None:
                    arrived, chunk = item
                    pending += chunk
                    while b"\n\n" in pending:
                        event, pending = pending.split(b"\n\n", 1)
                        time.sleep(max(delay_s, t0 + stretch * (arrived - t0) - time.perf_counter()))
                        self.wfile.write(event + b"\n\n")
                        self.wfile.flush()
                if pending:
                    self.wfile.write(pending)
                    self.wfile.flush()

            do_GET = do_POST = _handle

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="front one server, every streamed answer slowed")
    parser.add_argument("upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stretch", type=float, default=1.0, help="time line factor of each streamed answer")
    args = parser.parse_args()
    slow = Fault(stretch=args.stretch)
    proxy = FaultProxy(args.upstream, choose=lambda method, path, body: slow if path.endswith("/completions") else None)
    proxy.server.server_close()
    proxy.server = _Server(("127.0.0.1", args.port), proxy.server.RequestHandlerClass)
    proxy.server.daemon_threads = True
    print(f"stretch {args.stretch}x: 127.0.0.1:{args.port} -> {args.upstream}", flush=True)
    proxy.server.serve_forever()


if __name__ == "__main__":
    main()
