"""The fault proxy's slowed streams (tests/faultproxy.py), on a small upstream that sends server-sent events
at a known pace: the GPU speed runs' slowed twin depends on the stretch being per answer, not per event."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from faultproxy import Fault, FaultProxy

EVENTS, GAP_S = 20, 0.02


class _Events(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for k in range(EVENTS):
            time.sleep(GAP_S)
            self.wfile.write(f"data: {k}\n\n".encode())
            self.wfile.flush()


def _arrivals(url: str) -> list[float]:
    t0 = time.perf_counter()
    out = []
    with httpx.stream("POST", url + "/v1/chat/completions", content=b"{}", timeout=30) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:"):
                out.append(time.perf_counter() - t0)
    return out


def test_a_stretched_stream_keeps_its_pace_times_the_factor_and_does_not_compound() -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Events)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    try:
        direct = _arrivals(url)
        with FaultProxy(url, {"/v1/chat/completions": Fault(stretch=1.5)}) as slow:
            stretched = _arrivals(slow)
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert len(stretched) == len(direct) == EVENTS
    # the answer takes 1.5x as long, within scheduling slack; a stretch that compounded per event would take
    # 1.5^20 times the first gap
    assert 1.3 * direct[-1] < stretched[-1] < 1.5 * direct[-1] + 0.15
