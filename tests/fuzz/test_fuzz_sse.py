"""Fuzz the SSE stream: real streamed chat and completion captures with events garbled, lines dropped
or cut, split across network reads at random points, through the SSE parser and the real client.
A stream is read, or ends as a Generation carrying one error line; never a traceback, and what the
load and needle probes record from it stays JSON."""

from __future__ import annotations

import asyncio
import json

import httpx
from hypothesis import example, given
from hypothesis import strategies as st
from mutate import FIXTURES, dump, garbage, mutated_bytes, mutated_json, mutated_lines, nested, one_line

from kvprobe.load.stats import request_row
from kvprobe.needle.scoring import score
from kvprobe.run.store import dumps
from kvprobe.server.client import Client, Generation, _SseFeed

CAPTURES = sorted(FIXTURES.glob("*/*.sse"))
SEEDS = [p.read_bytes() for p in CAPTURES]
assert len(SEEDS) >= 10, "the SSE captures moved"


def _events(body: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n") if line.strip()]


@st.composite
def garbled_events(draw: st.DrawFn, body: bytes) -> bytes:
    """A capture with a few of its JSON events mutated (values retyped, keys dropped, garbage nested)."""
    lines = _events(body)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        payload = lines[i].removeprefix(b"data:").strip()
        if payload == b"[DONE]":
            continue
        event = json.loads(payload)
        lines[i] = b"data: " + dump(draw(mutated_json(event)))
    return b"\n\n".join(lines) + b"\n\n"


seed = st.sampled_from(SEEDS)
stream_body = st.one_of(
    seed.flatmap(garbled_events),
    seed.flatmap(garbled_events).flatmap(mutated_bytes),
    seed.map(bytes.decode).flatmap(mutated_lines).map(str.encode),
    st.lists(garbage.map(lambda v: b"data: " + dump(v)), max_size=5).map(lambda e: b"\n\n".join([*e, b"data: [DONE]"])),
    st.binary(max_size=200),
)


@st.composite
def reads(draw: st.DrawFn, body: bytes) -> list[bytes]:
    """`body` as network reads: split at random points (inside a line, a UTF-8 character, a JSON token)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=8)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def check_generation(gen: Generation) -> None:
    """What the probes read from a Generation has the types they assume, and what they record dumps."""
    assert isinstance(gen.content, str) and isinstance(gen.reasoning, str)
    assert gen.finish_reason is None or isinstance(gen.finish_reason, str), gen.finish_reason
    assert gen.usage is None or isinstance(gen.usage, dict)
    assert gen.system_fingerprint is None or isinstance(gen.system_fingerprint, str)
    if gen.error is not None:
        one_line(Exception(gen.error))
    row = request_row(gen, gen.t_start, "auto")
    dumps(row)
    status, where = score(gen, "4417")
    dumps({"status": status, "found_in": where, "finish_reason": gen.finish_reason, "error": gen.error,
           "content": gen.content, "reasoning": gen.reasoning})


@given(stream_body.flatmap(reads))
@example([b'data: {"choices":[{"delta":{"content":"x"},"finish_reason":' + dump(nested(300)) + b"}]}\n\n"])
@example([b'data: {"error":{"message":' + dump(nested(1000)) + b"}}\n\n"])
def test_sse_feed_reads_or_says_why(chunks: list[bytes]) -> None:
    gen = Generation()
    feed = _SseFeed(gen, "auto: /v1/chat/completions")
    for i, chunk in enumerate(chunks):
        if feed.feed(chunk, float(i)):
            break
    feed.close()
    check_generation(gen)


async def _stream(body: bytes, chat: bool) -> Generation:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with Client("auto", "http://127.0.0.1:8101", transport=httpx.MockTransport(handler), backoff_s=0,
                      retries=1) as client:
        client.model = "/models/tiny-llama"
        if chat:
            return await client.stream_chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        return await client.stream_completions({"prompt": "hi", "max_tokens": 8})


@given(stream_body, st.booleans())
def test_client_stream_reads_or_says_why(body: bytes, chat: bool) -> None:
    """The client's own stream path (httpx transport): a garbled stream is an error on the Generation."""
    gen = asyncio.run(_stream(body, chat))
    assert gen.ok or gen.error
    check_generation(gen)
