"""A kept-alive connection the server closes just as the next request goes out (uvicorn's 5 s
keep-alive timeout racing the send): the server never read the request, so the client sends it again
on a new connection, as Go's net/http does. Seen in a full test run: a needle request to a healthy vLLM failed
after 0.02 s with ReadError, and the candidate was called broken. A reset on a fresh connection
is not that race, and a generation request is still not retried then.

The fault is injected by a small loopback HTTP/1.1 server answering with a real captured chat
response; it resets (SO_LINGER 0) instead of answering where the test says."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable

import pytest
from replay import capture

from kvprobe.errors import Unreachable
from kvprobe.server.client import Client

# timing-sensitive: scripts/test runs these alone, after the parallel unit tests
pytestmark = pytest.mark.serial

ANSWER = capture("reasoning-deepseek_r1-8104", "chat")
Reset = Callable[[int, int], bool]  # (connection number, request number on it) -> reset instead of answering


class ResettingServer:
    def __init__(self, reset: Reset):
        self.reset = reset
        self.requests: list[tuple[int, int, bool]] = []  # (connection, request on it, answered)
        self._connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn, n = self._connections, 0
        self._connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if self.reset(conn, n):
                    self.requests.append((conn, n, False))
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                self.requests.append((conn, n, True))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
                await writer.drain()
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@contextlib.asynccontextmanager
async def serving(reset: Reset) -> AsyncIterator[tuple[ResettingServer, str]]:
    fake = ResettingServer(reset)
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    try:
        yield fake, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def second_resets(_conn: int, n: int) -> bool:
    """Each connection answers its first request and resets on the second."""
    return n == 1


CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8}


async def test_a_kept_alive_connection_closed_under_a_request_is_sent_again() -> None:
    async with serving(second_resets) as (fake, url), Client("srv", url, backoff_s=0) as client:
        first = await client.chat(CHAT)
        second = await client.chat(CHAT)  # goes out on the kept-alive connection, which resets
    assert first.ok and second.ok, second.error
    assert second.reasoning and second.content == first.content
    # the reset one was never answered; it went again on a new connection
    assert fake.requests == [(0, 0, True), (0, 1, False), (1, 0, True)]


async def test_a_reset_on_a_fresh_connection_is_not_retried_for_generation() -> None:
    async with serving(lambda _conn, _n: True) as (fake, url), Client("srv", url, backoff_s=0) as client:
        gen = await client.chat(CHAT)
        with pytest.raises(Unreachable, match="cannot reach"):
            await client.completions({"prompt": "x", "max_tokens": 1})
    assert not gen.ok and "cannot reach" in gen.error
    assert fake.requests == [(0, 0, False), (1, 0, False)]  # one each: the server may have seen them


async def test_a_kept_alive_reset_is_retried_once_not_forever() -> None:
    """The resend goes on a new connection; a server that resets that one too is not asked again."""
    reset = lambda conn, n: n == 1 or conn > 0  # noqa: E731
    async with serving(reset) as (fake, url), Client("srv", url, backoff_s=0) as client:
        assert (await client.chat(CHAT)).ok
        gen = await client.chat(CHAT)
    assert not gen.ok and "ReadError" in gen.error
    assert fake.requests == [(0, 0, True), (0, 1, False), (1, 0, False)]
