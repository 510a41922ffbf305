"""Streamed POSTs over a small HTTP/1.1 keep-alive pool: httptools (llhttp, the C parser uvicorn uses)
parses, and body bytes go to a sink with the time they arrived.

Why not httpx or aiohttp for streams: httpx parses HTTP in pure Python (h11), and aiohttp's stream
reader does several Python calls per chunked-encoding frame (vLLM sends one frame per token), so
at a few hundred streams either client used more CPU than the server it measured
(benchmarks/client_overhead.py). Here a read costs one Python call: parse, hand over, done.

Arrival times (chosen by measurement, benchmarks/client_overhead.py, AVX-512 box, client
and mock server each pinned to a core, error vs what the server sent, p99):
- the loop's time in the read callback: 256 streams TTFT 1.0-2.3 ms, ITL 2.1-2.7 ms; 1000 streams
  TTFT 1.6-3.6 ms, ITL 7.5-8.5 ms. When many streams' chunks land at once the loop reads them one
  after another and the later ones are stamped late;
- uvloop with the loop's time: 256 streams TTFT 1.5-2.2 ms, ITL 1.7-2.0 ms: a faster loop, the same
  queue, so no fix (and not a dependency);
- kernel receive stamps (kvprobe.server.rxstamp, SO_TIMESTAMPNS) with each read planned to end where a
  chunk ends (a peek at the chunked framing before each read; tried, then removed): 256 streams TTFT
  0.17-0.45 ms, ITL 0.03-0.06 ms; 1000 streams TTFT 0.14-0.17 ms, ITL 0.04-0.06 ms; but a peek per
  read halves the client's throughput (140k tok/s at 256 streams);
- kernel stamps on greedy reads (the default): 256 streams 0.25 / 0.11 ms, 1000 streams 0.19 /
  0.06 ms, at 293k tok/s (the loop-timed client's speed). The kernel merges packets that queue on
  one socket (newest stamp) whatever the read size, so framing buys little. Chosen: plain-http
  connections (_StampedConn) use kernel stamps with greedy reads.
TLS connections keep an asyncio transport and the loop's time (_LoopConn), as does a kernel that
gives no stamps; `StreamPool.stamps` says which. KVPROBE_STREAM_STAMPS=loop forces the loop's time.

Scope: plain http and https to the server itself (no proxies: the client uses httpx when a proxy
applies), request bodies sent whole, responses chunked, sized or closed by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import httptools

from kvprobe import settings
from kvprobe.server import rxstamp

Sink = Callable[[bytes, float], object]  # (body bytes of one read, perf_counter when it arrived)
LagSink = Callable[[float], object]  # seconds between a read's arrival and the loop reading it


def proxied(url: str) -> bool:
    """Would the environment send requests to `url` through a proxy?"""
    parts = urlsplit(url)
    proxies = getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not proxy_bypass(parts.hostname or "")


class NoResponse(TimeoutError):
    """Connected and sent, then nothing for timeout_s: the server took the request and stalled."""


class _Response:
    """One response at a time on one connection: httptools parses, body bytes go to the sink with
    the time they arrived. The connection kinds below differ only in how bytes come in."""

    def __init__(self) -> None:
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

    def take(self, data: bytes, arrived: float, now: float) -> None:
        """`data` reached this host at `arrived` and is read at `now` (both perf_counter)."""
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
                self.sink(body, arrived)
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

    def _finish(self, exc: BaseException | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(exc)

    def _lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._finish(exc or ConnectionResetError("the server closed the connection"))

    def _begin(self, sink: Sink) -> asyncio.Future[BaseException | None]:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.complete, self.keep_alive, self.got_bytes = 0, False, False, False
        self.error_body, self.pending, self.sink = [], [], sink
        self.last = time.perf_counter()
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def reusable(self) -> bool:
        return not self.closed and self.complete and self.keep_alive


class _LoopConn(asyncio.Protocol, _Response):
    """An asyncio transport (TLS, or no kernel stamps here): a read is timed when the loop runs it."""

    stamps = "loop"

    def __init__(self) -> None:
        _Response.__init__(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.take(data, now, now)

    async def begin(self, request: bytes, sink: Sink) -> asyncio.Future[BaseException | None]:
        done = self._begin(sink)
        assert self.transport is not None
        self.transport.write(request)
        return done

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


# One recvmsg of whatever waits (up to this much), the kernel's stamp on it: reads planned to end at
# each chunk were a little more precise but halved the client's throughput (module docstring).
_READ_SIZE = 65536


class _StampedConn(_Response):
    """A plain socket read with recvmsg from the loop's reader callback: every read carries the
    kernel's arrival stamp (greedy reads: the newest packet's, see the module docstring)."""

    stamps = "kernel"

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, clock: rxstamp.Clock,
                 pool: StreamPool | None = None) -> None:
        super().__init__()
        self.sock, self.loop, self.clock, self.pool = sock, loop, clock, pool
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock, clock = self.sock, self.clock
        try:
            while not self.closed:
                data, stamp = rxstamp.recv(sock, _READ_SIZE, clock)
                if not data:
                    self.close()
                    self._lost(None)
                    return
                now = time.perf_counter()
                if stamp is None:
                    stamp = now
                elif self.pool is not None and self.pool.lag is not None:
                    self.pool.lag(now - stamp)
                if self.complete:  # bytes after a whole response: not ours to parse
                    continue
                self.take(data, stamp, now)
        except BlockingIOError:
            return
        except OSError as exc:
            self.close()
            self._lost(exc)

    async def begin(self, request: bytes, sink: Sink) -> asyncio.Future[BaseException | None]:
        done = self._begin(sink)
        try:
            await self.loop.sock_sendall(self.sock, request)
        except OSError as exc:
            self.close()
            self._lost(exc)
        return done

    def close(self) -> None:
        self.closed = True
        if self.sock.fileno() >= 0:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


_Conn = _LoopConn | _StampedConn


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
        # Kernel receive stamps on plain http (KVPROBE_STREAM_STAMPS=loop turns them off, to compare).
        self.stamps = "loop" if self.ssl or settings.stream_stamps_loop() else "kernel"
        self._clock: rxstamp.Clock | None = None
        self.lag: LagSink | None = None  # told each kernel-stamped read's lag (kvprobe.load)
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _request(self, path: str, payload: bytes) -> bytes:
        return (b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n"
                % ((self.prefix + path).encode(), self._headers, len(payload))) + payload

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        if self.stamps == "kernel":
            conn = await asyncio.wait_for(self._connect_stamped(loop), self.connect_timeout_s)
            if conn is not None:
                return conn
            self.stamps = "loop"  # this kernel gives no receive stamps
        if self.ssl and self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        _, conn = await asyncio.wait_for(
            loop.create_connection(_LoopConn, self.host, self.port, ssl=self._ssl_context,
                                   server_hostname=self.host if self.ssl else None),
            self.connect_timeout_s)
        return conn

    async def _connect_stamped(self, loop: asyncio.AbstractEventLoop) -> _StampedConn | None:
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        error: OSError | None = None
        for family, kind, proto, _name, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if not rxstamp.enable(sock):
                sock.close()
                return None
            self._clock = self._clock or rxstamp.Clock()
            return _StampedConn(sock, loop, self._clock, self)
        raise error or OSError(f"cannot resolve {self.host}")

    def allow(self, connections: int) -> None:
        """At least this many at once (a load case's agents: a smaller pool would queue their turns
        in the client and count the wait as the server's TTFT)."""
        extra = connections - self.max_connections
        if extra <= 0:
            return
        self.max_connections = connections
        if self._sem is not None:
            for _ in range(extra):
                self._sem.release()

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
                    exc = await self._wait(conn, await conn.begin(request, sink))
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
