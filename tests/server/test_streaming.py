"""The client's stream pool (kvprobe.server.streaming) over real sockets: keep-alive reuse, error bodies,
refused connections, a stale keep-alive connection, headers; bodies are real vLLM captures."""

from __future__ import annotations

import asyncio

import pytest
from replay import capture

from kvprobe.server.client import Client
from kvprobe.server.streaming import StreamPool

# timing-sensitive: scripts/test runs these alone, after the parallel unit tests
pytestmark = pytest.mark.serial

R1 = "reasoning-deepseek_r1-8104"


class Server:
    """Answers each request on a connection with the next canned response; records what came in."""

    def __init__(self, responses: list[bytes], close_after_each: bool = False):
        self.responses = list(responses)
        self.close_after_each = close_after_each
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                self.requests.append(head + await reader.readexactly(length))
                writer.write(self.responses.pop(0))
                await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def chunked_sse(body: bytes) -> bytes:
    frames = b"".join(b"%x\r\n%s\r\n" % (len(e + b"\n\n"), e + b"\n\n") for e in body.split(b"\n\n") if e)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" \
        + frames + b"0\r\n\r\n"


def json_answer(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status, len(body), body)


async def test_keep_alive_reuses_one_connection_and_sends_headers() -> None:
    sse = chunked_sse(capture(R1, "chat_stream"))
    srv = Server([sse, sse, sse])
    async with srv as url, Client("r1", url, api_key="sk-test", headers={"x-team": "infra"}) as client:
        gens = [await client.stream_chat({"messages": [], "max_tokens": 32}) for _ in range(3)]
    assert all(g.ok and g.usage["completion_tokens"] == 32 for g in gens)
    assert srv.connections == 1  # one keep-alive connection for three streams
    head = srv.requests[0].split(b"\r\n\r\n")[0].lower()
    assert b"post /v1/chat/completions http/1.1" in head
    assert b"authorization: bearer sk-test" in head and b"x-team: infra" in head
    assert b'"stream":true' in srv.requests[0] and b'"include_usage":true' in srv.requests[0]


async def test_error_status_keeps_the_servers_message() -> None:
    crash = capture("crash-seed-chunked-prefill", "response")  # the real 500 of a dying engine
    async with Server([json_answer(500, crash)]) as url, Client("c", url) as client:
        gen = await client.stream_chat({"messages": []})
    assert gen.status == 500 and not gen.ok and not gen.chunks
    assert "HTTP 500" in gen.error and "EngineCore encountered an issue" in gen.error


async def test_refused_connection_is_reported_as_unreachable() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with Client("gone", f"http://127.0.0.1:{port}") as client:
        gen = await client.stream_chat({"messages": []})
    assert not gen.ok and gen.status is None and not gen.chunks
    assert f"gone: cannot reach http://127.0.0.1:{port}/v1/chat/completions" in gen.error


async def test_a_keep_alive_connection_the_server_closed_is_replaced() -> None:
    sse = chunked_sse(capture(R1, "chat_stream"))
    srv = Server([sse, sse], close_after_each=True)  # the server drops every connection after one answer
    async with srv as url, Client("r1", url) as client:
        first = await client.stream_chat({"messages": []})
        await asyncio.sleep(0.05)
        second = await client.stream_chat({"messages": []})
    assert first.ok and second.ok and srv.connections == 2


async def test_a_load_case_raises_the_pool_to_its_agents() -> None:
    """512 connections by default: a case of more agents would queue turns in the client and count
    the wait as TTFT (measured: 10 s TTFT 'error' at 1000 streams before this)."""
    pool = StreamPool("http://127.0.0.1:1", {}, max_connections=2, timeout_s=1.0)
    sem = pool._bind_loop()
    for _ in range(2):
        await sem.acquire()
    assert sem.locked()
    pool.allow(1)  # never lowers it
    assert sem.locked() and pool.max_connections == 2
    pool.allow(4)
    for _ in range(2):
        await asyncio.wait_for(sem.acquire(), 0.1)
    assert sem.locked() and pool.max_connections == 4
