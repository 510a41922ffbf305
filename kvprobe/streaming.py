"""Streamed POSTs over a small HTTP/1.1 keep-alive pool: asyncio protocols and httptools (llhttp, the
C parser uvicorn uses), with body bytes handed to a sink as each network read arrives.

Why not httpx or aiohttp for streams: httpx parses HTTP in pure Python (h11), and aiohttp's stream
reader does several Python calls per chunked-encoding frame (vLLM sends one frame per token), so
at a few hundred streams either client used more CPU than the server it measured
(benchmarks/client_overhead.py). Here a read costs one Python call: parse, hand over, done.

Scope: plain http and https to the server itself (no proxies: the client uses httpx when a proxy
applies), request bodies sent whole, responses chunked, sized or closed by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import httptools

Sink = Callable[[bytes, float], object]  # (body bytes of one read, perf_counter when it arrived)


def proxied(url: str) -> bool:
    """Would the environment send requests to `url` through a proxy?"""
    parts = urlsplit(url)
    proxies = getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not proxy_bypass(parts.hostname or "")


class NoResponse(TimeoutError):
    """Connected and sent, then nothing for timeout_s: the server took the request and stalled."""


class _Conn(asyncio.Protocol):
    """One connection; one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.sink: Sink | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.error_body: list[bytes] = []
        self.pending: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.last = 0.0
        self.done: asyncio.Future[BaseException | None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(exc or ConnectionResetError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.last, self.got_bytes = now, True
        if self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)
            return
        if self.pending:
            body = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
            self.pending.clear()
            if self.sink is not None:
                self.sink(body, now)
        if self.complete:
            self._finish(None)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        (self.error_body if self.status >= 400 else self.pending).append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once feed_data returns

    # ours
    def _finish(self, exc: BaseException | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(exc)

    def begin(self, request: bytes, sink: Sink) -> asyncio.Future[BaseException | None]:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.complete, self.keep_alive, self.got_bytes = 0, False, False, False
        self.error_body, self.pending, self.sink = [], [], sink
        self.last = time.perf_counter()
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def reusable(self) -> bool:
        return not self.closed and self.complete and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class StreamPool:
    """Keep-alive connections to one server, at most `max_connections` at a time."""

    def __init__(self, url: str, headers: dict[str, str], *, max_connections: int, timeout_s: float,
                 connect_timeout_s: float = 10.0):
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.ssl = parts.scheme == "https"
        self.port = parts.port or (443 if self.ssl else 80)
        self._ssl_context: ssl.SSLContext | None = None  # built on first connect: loading CAs costs ~20 ms
        self.prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        lines = [f"host: {host_header}", "accept: text/event-stream", "content-type: application/json",
                 "user-agent: kvprobe"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-type")]
        self._headers = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _request(self, path: str, payload: bytes) -> bytes:
        return (b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n"
                % ((self.prefix + path).encode(), self._headers, len(payload))) + payload

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        if self.ssl and self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Conn, self.host, self.port, ssl=self._ssl_context,
                                   server_hostname=self.host if self.ssl else None),
            self.connect_timeout_s)
        return conn

    def _bind_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:  # connections belong to one loop
            self._idle, self._loop = [], loop
            self._sem = asyncio.Semaphore(self.max_connections)
        return self._sem

    async def post(self, path: str, payload: bytes, sink: Sink) -> tuple[int, bytes]:
        """Send one POST; body bytes of a 2xx/3xx answer go to `sink` as they arrive. Returns the
        status and, for >= 400, the error body. Raises OSError, TimeoutError or HttpParserError."""
        sem = self._bind_loop()
        if sem.locked():  # all connections busy: wait for one, at most timeout_s (as httpx's pool timeout)
            await asyncio.wait_for(sem.acquire(), self.timeout_s)
        else:
            await sem.acquire()
        try:
            request = self._request(path, payload)
            while True:
                conn, reused = self._idle_conn(), True
                if conn is None:
                    conn, reused = await self._connect(), False
                try:
                    exc = await self._wait(conn, conn.begin(request, sink))
                except BaseException:
                    conn.close()  # cancelled or timed out mid-response: never reuse it
                    raise
                if exc is not None and reused and not conn.got_bytes:
                    conn.close()  # an idle connection the server had closed: the request never arrived
                    continue
                if conn.reusable():
                    self._idle.append(conn)
                else:
                    conn.close()
                if exc is not None and not conn.complete:
                    raise exc  # cut mid-response (or a parse error): the caller says what arrived
                return conn.status, b"".join(conn.error_body)
        finally:
            sem.release()

    def _idle_conn(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _wait(self, conn: _Conn, done: asyncio.Future[BaseException | None]) -> BaseException | None:
        """Wait for the response to end; TimeoutError after timeout_s without a byte. Reads only stamp
        conn.last: the timer is re-armed once per timeout, not once per read."""
        while True:
            idle = time.perf_counter() - conn.last
            if idle >= self.timeout_s:
                raise NoResponse(f"no data for {self.timeout_s:g} s")
            finished, _ = await asyncio.wait({done}, timeout=self.timeout_s - idle)
            if finished:
                return done.result()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports close
