"""A minimal OpenAI-compatible streaming server for client benchmarks (run it in its own process).

It answers /health, /v1/models, /tokenize (404, like a server without it) and streamed or plain
/v1/chat/completions and /v1/completions. Chunks look like vLLM 0.32's (role chunk, one token per
chunk, finish chunk, usage chunk, [DONE]) and go out with chunked transfer encoding.

Timing: with --ttft D1 --itl D2 the first token of a request leaves D1 after the request arrived,
then one token every D2, on an absolute schedule (lateness does not accumulate); each token's text
is the server's send time (the first also carries the request's arrival time), so a client's own
delay can be told from the server's lateness. Without them it
answers instantly: one "engine step" writes one token to every open stream, then yields, like a
real engine emitting a token per running request per step. GET /stats reports how late the server
itself was against its schedule, so a client's timing error can be told apart from the server's.

Raw asyncio protocol, no framework: the server must be far cheaper per token than any client.

    python benchmarks/mock_server.py --port 8999 [--ttft 0.1 --itl 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

MODEL = "mock"


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict) -> bytes:
    return _frame(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def _text_chunk(text: str, finish: str | None = None) -> dict:
    return {"id": "cmpl-mock", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


TOKEN = " tok"
CHAT_ROLE = _event(_chat_chunk({"role": "assistant", "content": ""}))
CHAT_TOKEN = _event(_chat_chunk({"content": TOKEN}))
CHAT_LAST = _event(_chat_chunk({"content": TOKEN}, "length"))
TEXT_TOKEN = _event(_text_chunk(TOKEN))
TEXT_LAST = _event(_text_chunk(TOKEN, "length"))
DONE = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def _usage(prompt: int, completion: int) -> bytes:
    return _event({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                   "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                            "total_tokens": prompt + completion}})


def _json_response(status: int, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(body), body))


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass
class Stream:
    proto: Protocol
    chat: bool
    tokens: int
    prompt_tokens: int
    t0: float
    sent: int = 0


@dataclass
class Engine:
    ttft: float
    itl: float
    burst: int = 16
    streams: list[Stream] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lateness: list[float] = field(default_factory=list)  # seconds behind schedule, per token written
    due: list[tuple[float, int, Stream]] = field(default_factory=list)  # paced mode: next token's time
    waiter: asyncio.Future[None] | None = None
    requests: int = 0

    def add(self, stream: Stream) -> None:
        self.requests += 1
        if self.ttft or self.itl:
            heapq.heappush(self.due, (stream.t0 + self.ttft, id(stream), stream))
            if self.waiter is not None:
                _wake(self.waiter)
        else:
            self.streams.append(stream)
        self.wake.set()

    def _write_tokens(self, s: Stream, n: int) -> None:
        """Write the next n tokens of s (one SSE chunk each) in one write."""
        tr = s.proto.transport
        if tr is None or tr.is_closing():
            s.sent = s.tokens
            return
        parts = []
        for _ in range(min(n, s.tokens - s.sent)):
            last = s.sent == s.tokens - 1
            if s.chat:
                if s.sent == 0:
                    parts.append(CHAT_ROLE)
                parts.append(CHAT_LAST if last else CHAT_TOKEN)
            else:
                parts.append(TEXT_LAST if last else TEXT_TOKEN)
            s.sent += 1
            if last:
                parts += [_usage(s.prompt_tokens, s.tokens), DONE]
        tr.write(b"".join(parts))

    def _write_stamped(self, s: Stream, due: float) -> None:
        """One token whose text is the server's send time (and, on the first, the request's arrival
        time): a client can then tell its own delay from the server's lateness."""
        tr = s.proto.transport
        now = time.perf_counter()
        self.lateness.append(now - due)
        if tr is None or tr.is_closing():
            s.sent = s.tokens
            return
        text = f" {s.t0:.7f}/{now:.7f}" if s.sent == 0 else f" {now:.7f}"
        last = s.sent == s.tokens - 1
        data = (CHAT_ROLE if s.sent == 0 and s.chat else b"") + _event(
            _chat_chunk({"content": text}, "length" if last else None) if s.chat
            else _text_chunk(text, "length" if last else None))
        s.sent += 1
        if last:
            data += _usage(s.prompt_tokens, s.tokens) + DONE
        tr.write(data)

    async def paced(self) -> None:
        """Paced mode: tokens leave on an absolute schedule (request arrival + ttft + k * itl)."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.due:
                self.wake.clear()
                await self.wake.wait()
                continue
            due = self.due[0][0]
            delay = due - time.perf_counter()
            if delay > 0:
                # Sleep until the next token is due, or until add() brings a stream that is due sooner.
                self.waiter = loop.create_future()
                timer = loop.call_later(delay, _wake, self.waiter)
                await self.waiter
                timer.cancel()
                continue
            _, _, s = heapq.heappop(self.due)
            self._write_stamped(s, due)
            if s.sent < s.tokens:
                heapq.heappush(self.due, (s.t0 + self.ttft + s.sent * self.itl, id(s), s))
            else:
                s.proto.done()

    async def run(self) -> None:
        """Instant mode: each step writes `burst` tokens (one chunk each) to every open stream, then
        yields: a server far faster than the client, as cheap per token as Python allows."""
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            for s in self.streams:
                self._write_tokens(s, self.burst)
            finished = [s for s in self.streams if s.sent >= s.tokens]
            if finished:
                self.streams = [s for s in self.streams if s.sent < s.tokens]
                for s in finished:
                    s.proto.done()
            await asyncio.sleep(0)

    def stats(self) -> dict:
        lat = sorted(self.lateness)
        n = len(lat)
        pick = (lambda q: lat[min(n - 1, int(q * n))]) if n else (lambda q: None)
        return {"requests": self.requests, "tokens": n, "lateness_p50_s": pick(0.5), "lateness_p99_s": pick(0.99),
                "lateness_max_s": lat[-1] if n else None}


_TIMESPEC = struct.Struct("@qq")
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class _StampedSocket:
    """The transport's socket, read with recvmsg so that each read keeps the kernel's arrival stamp
    of the request (the time it reached this host, not when this busy loop read it): the request's
    arrival is then what the server really did, and its own read lag is not counted as the client's.
    A benchmark-only shim over asyncio's transport (which reads with sock.recv)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.stamp_ns: int | None = None
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)

    def recv(self, size: int) -> bytes:
        data, ancillary, _, _ = self._sock.recvmsg(size, socket.CMSG_SPACE(_TIMESPEC.size))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                self.stamp_ns = sec * 1_000_000_000 + nsec
        return data

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def _perf_from_realtime(realtime_ns: int) -> float:
    a = time.perf_counter_ns()
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    b = time.perf_counter_ns()
    return (realtime_ns - (real - (a + b) // 2)) / 1e9


class Protocol(asyncio.Protocol):
    def __init__(self, engine: Engine):
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.stamped: _StampedSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        raw = getattr(transport, "_sock", None)
        if isinstance(raw, socket.socket) and (self.engine.ttft or self.engine.itl):
            self.stamped = _StampedSocket(raw)
            transport._sock = self.stamped  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        if self.stamped is not None and self.stamped.stamp_ns is not None:
            t = min(t, _perf_from_realtime(self.stamped.stamp_ns))
        self.buf += data
        self._next(t)

    def done(self) -> None:
        self.busy = False
        self._next(time.perf_counter())

    def _next(self, t: float) -> None:
        while not self.busy and self.transport is not None:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4: head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self._handle(method, path.split("?")[0], body, t)

    def _handle(self, method: str, path: str, body: bytes, t: float) -> None:
        assert self.transport is not None
        if method == "GET" and path == "/health":
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        elif method == "GET" and path == "/v1/models":
            self.transport.write(_json_response(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "root": MODEL, "max_model_len": 1 << 20, "owned_by": "mock"}]}))
        elif method == "GET" and path == "/stats":
            self.transport.write(_json_response(200, self.engine.stats()))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            req = json.loads(body or b"{}")
            tokens = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            chat = path.endswith("chat/completions")
            if chat:
                prompt_chars = sum(len(str(m.get("content", ""))) for m in req.get("messages", []))
            else:
                prompt_chars = len(str(req.get("prompt", "")))
            prompt_tokens = max(1, prompt_chars // 4)
            if not req.get("stream"):
                text = TOKEN * tokens
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if chat else {"index": 0, "text": text, "finish_reason": "length"})
                self.transport.write(_json_response(200, {
                    "id": "mock", "object": "chat.completion" if chat else "text_completion", "model": MODEL,
                    "choices": [choice], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                                   "total_tokens": prompt_tokens + tokens}}))
                return
            self.busy = True
            self.transport.write(SSE_HEAD)
            self.engine.add(Stream(self, chat, max(1, tokens), prompt_tokens, t))
        else:
            self.transport.write(_json_response(404, {"detail": "Not Found"}))


async def serve(host: str, port: int, ttft: float, itl: float, burst: int = 16) -> None:
    engine = Engine(ttft, itl, burst)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Protocol(engine), host, port, backlog=4096)
    runner = loop.create_task(engine.paced() if ttft or itl else engine.run())
    try:
        async with server:
            await server.serve_forever()
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def run_server(host: str, port: int, ttft: float = 0.0, itl: float = 0.0, burst: int = 16,
               precise: bool = False) -> None:
    """Process entry point. precise: a select() loop, whose timeout is in microseconds; epoll's is in
    whole milliseconds (rounded up), which makes a paced server ~0.5 ms late at the median. select()
    takes at most ~1000 sockets, so precise mode is for a few hundred streams."""
    with contextlib.suppress(KeyboardInterrupt):
        if precise:
            loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
            try:
                loop.run_until_complete(serve(host, port, ttft, itl, burst))
            finally:
                loop.close()
        else:
            asyncio.run(serve(host, port, ttft, itl, burst))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8999)
    ap.add_argument("--ttft", type=float, default=0.0, help="seconds to the first token")
    ap.add_argument("--itl", type=float, default=0.0, help="seconds between tokens")
    ap.add_argument("--burst", type=int, default=16, help="instant mode: tokens per stream per step")
    ap.add_argument("--precise", action="store_true", help="microsecond timers (select loop, < ~1000 streams)")
    args = ap.parse_args()
    run_server(args.host, args.port, args.ttft, args.itl, args.burst, precise=args.precise)


if __name__ == "__main__":
    main()
