from __future__ import annotations

import json

import httpx
import pytest
from replay import Replay, capture

from kvprobe.errors import AuthError, ServerError, Unreachable
from kvprobe.server.client import Client

R1 = "reasoning-deepseek_r1-8104"


def sse_handler(server: str, name: str):
    body = capture(server, name)
    return lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def client_for(handler, **kw) -> Client:
    return Client("srv", "http://127.0.0.1:9", transport=httpx.MockTransport(handler), backoff_s=0, **kw)


async def test_stream_with_reasoning_and_content_split() -> None:
    async with client_for(sse_handler(R1, "chat_endthink_logitbias_stream")) as client:
        gen = await client.stream_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 64})
    full = json.loads(capture(R1, "chat_endthink_logitbias"))["choices"][0]["message"]
    assert gen.ok and gen.complete
    assert gen.reasoning == full["reasoning"] and gen.content == full["content"]  # stream == non-stream
    assert gen.finish_reason == "length"
    # usage comes from the final chunk (stream_options.include_usage); the </think> token carries no text
    assert gen.usage["completion_tokens"] == 48
    assert len([c for c in gen.chunks if c.reasoning or c.content]) == 46
    # TTFT is the first reasoning token, not the first content token
    first_reasoning = next(c.t for c in gen.chunks if c.reasoning)
    assert gen.ttft == pytest.approx(first_reasoning - gen.t_start)
    assert len(gen.itl) == len([c for c in gen.chunks if c.reasoning or c.content]) - 1


async def test_non_streaming_chat_reads_reasoning_field() -> None:
    body = capture(R1, "chat_endthink_logitbias")
    async with client_for(lambda r: httpx.Response(200, content=body)) as client:
        gen = await client.chat({"messages": []})
    message = json.loads(body)["choices"][0]["message"]
    assert gen.reasoning == message["reasoning"] and gen.content == message["content"]


async def test_legacy_reasoning_content_is_read() -> None:
    data = json.loads(capture(R1, "chat_endthink_logitbias"))
    msg = data["choices"][0]["message"]
    msg["reasoning_content"] = msg.pop("reasoning")
    async with client_for(lambda r: httpx.Response(200, json=data)) as client:
        gen = await client.chat({"messages": []})
    assert gen.reasoning == msg["reasoning_content"]


async def test_null_content_at_the_cap() -> None:
    data = json.loads(capture("reasoning-qwen3-8104", "chat"))
    assert data["choices"][0]["message"]["content"] is None  # real: qwen3 parser, cap hit while thinking
    async with client_for(lambda r: httpx.Response(200, json=data)) as client:
        gen = await client.chat({"messages": []})
    assert gen.content == "" and gen.reasoning and gen.finish_reason == "length"


async def test_stream_cut_midway_is_incomplete() -> None:
    body = capture(R1, "chat_stream")
    cut = body[: len(body) // 2].rsplit(b"\n\n", 1)[0] + b"\n\n"
    async with client_for(lambda r: httpx.Response(200, content=cut,
                                                   headers={"content-type": "text/event-stream"})) as client:
        gen = await client.stream_chat({"messages": []})
    assert not gen.ok and not gen.complete
    assert "stream ended before [DONE]" in gen.error
    assert gen.chunks  # what arrived is kept


async def test_refused_connection_is_unreachable_after_retries() -> None:
    calls = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("Connection refused", request=request)

    async with client_for(refuse) as client:
        with pytest.raises(Unreachable) as info:
            await client.health()
    assert len(calls) == 3
    assert "cannot reach http://127.0.0.1:9/health" in str(info.value)


async def test_a_request_that_stalls_says_no_response_not_cannot_reach() -> None:
    """Accepted, then nothing within timeout_s (httpx ReadTimeout): the server is up but stalled."""
    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with client_for(stall, timeout_s=42) as client:
        with pytest.raises(Unreachable) as info:
            await client.models()
        gen = await client.stream_chat({"messages": []})
        with pytest.raises(Unreachable) as generation:
            await client.completions({"prompt": "x"})
    assert str(info.value) == "srv: http://127.0.0.1:9/v1/models: no response within 42 s (ReadTimeout)"
    assert "cannot reach" not in gen.error and "no response within 42 s" in gen.error
    assert "no response within 42 s" in str(generation.value)


async def test_a_stream_that_never_answers_through_the_pool_says_no_response() -> None:
    import asyncio

    async def accept_then_stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(accept_then_stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, Client("srv", f"http://127.0.0.1:{port}", timeout_s=0.3) as client:
        gen = await client.stream_chat({"messages": []})
    assert gen.error.startswith(f"srv: http://127.0.0.1:{port}/v1/chat/completions: no response within 0.3 s")


async def test_a_connect_timeout_is_cannot_reach() -> None:
    def slow_connect(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    async with client_for(slow_connect) as client:
        with pytest.raises(Unreachable, match=r"cannot reach http://127\.0\.0\.1:9/health: timed out connecting"):
            await client.health()


async def test_401_is_an_auth_error_naming_the_key() -> None:
    async with client_for(lambda r: httpx.Response(401, json={"error": "Unauthorized"}), api_key="sk-x") as client:
        with pytest.raises(AuthError) as info:
            await client.models()
    assert "API key" in str(info.value) and "sk-x" not in str(info.value)


async def test_api_key_goes_in_the_authorization_header() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200)

    async with client_for(handler, api_key="sk-123") as client:
        await client.health()
    assert seen["auth"] == "Bearer sk-123"


async def test_get_retries_503_but_generation_never_retries_500() -> None:
    answers = iter([httpx.Response(503), httpx.Response(200, json={"version": "0.32.0"})])
    async with client_for(lambda r: next(answers)) as client:
        assert await client.version() == "0.32.0"

    posts = []
    crash = capture("crash-seed-chunked-prefill", "response")

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(1)
        return httpx.Response(500, content=crash)

    async with client_for(handler) as client:
        with pytest.raises(ServerError) as info:
            await client.completions({"prompt": "x"})
        gen = await client.chat({"messages": []})
    assert len(posts) == 2  # one each, no retry
    assert info.value.status == 500 and "EngineCore encountered an issue" in str(info.value)
    assert gen.error and gen.status == 500


async def test_tokenize_forms_and_real_answer() -> None:
    replay = Replay()
    sent = []
    base = replay.routes[("POST", "/tokenize")]

    def spy(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return base(request)

    replay.routes[("POST", "/tokenize")] = spy
    async with Client("a", "http://x:1", transport=replay.transport()) as client:
        ids = await client.tokenize(messages=[{"role": "user", "content": "Where is the needle?"}])
        await client.tokenize(prompt="hello world")
        with pytest.raises(ValueError):
            await client.tokenize()
    assert ids == json.loads(capture("auto-8101", "tokenize_chat"))["tokens"]
    assert sent[0]["add_generation_prompt"] is True and "messages" in sent[0]
    assert sent[1]["prompt"] == "hello world" and sent[1]["add_special_tokens"] is True


async def test_models_sets_default_model_for_requests() -> None:
    replay = Replay()
    async with Client("a", "http://x:1", transport=replay.transport()) as client:
        models = await client.models()
        assert client.model == models[0]["id"] == "/models/tiny-llama"
        data = await client.completions({"prompt": "hi", "max_tokens": 16})
    assert data["choices"][0]["text"]
