"""Scoring on the real reasoning captures (deepseek_r1 and qwen3 parsers, streamed and not, the
enable_thinking=false and forced-</think> variants), with the value written into reasoning only,
content only, both, or neither, through the real client code path (httpx MockTransport)."""

from __future__ import annotations

import copy

import httpx
import pytest
from needle_fakes import capture_json, capture_sse, sse_bytes
from replay import FIXTURES

from kvprobe.needle.scoring import contains_value, found_in, score
from kvprobe.server.client import Client, Generation

VALUE = "2815901"
SERVERS = ("reasoning-deepseek_r1-8104", "reasoning-qwen3-8104")
CAPTURES = ("chat", "chat_nothink", "chat_endthink_logitbias",
            "chat_stream", "chat_nothink_stream", "chat_endthink_logitbias_stream")
PLACEMENTS = {"reasoning": ["reasoning"], "content": ["content"], "both": ["content", "reasoning"], "neither": []}


def _inject_json(data: dict, fields: list[str], rename: bool, finish: str | None) -> dict:
    data = copy.deepcopy(data)
    choice = data["choices"][0]
    message = choice["message"]
    for field in fields:
        message[field] = (message.get(field) or "") + f" is: {VALUE}.\n"
    if rename:  # the older shape: reasoning_content instead of reasoning
        message["reasoning_content"] = message.pop("reasoning")
    if finish:
        choice["finish_reason"] = finish
    return data


def _inject_sse(events: list[dict | None], fields: list[str], rename: bool, finish: str | None) -> list:
    events = copy.deepcopy(events)
    deltas = [i for i, e in enumerate(events) if e and e["choices"] and "delta" in e["choices"][0]]
    last = deltas[-1]  # carries finish_reason
    for field in fields:
        chunk = copy.deepcopy(events[deltas[1]])
        chunk["choices"][0]["delta"] = {field: f" is: {VALUE}.\n"}
        chunk["choices"][0]["finish_reason"] = None
        events.insert(last, chunk)
        last += 1
    if finish:
        events[last]["choices"][0]["finish_reason"] = finish
    if rename:
        for e in events:
            if e and e["choices"] and "reasoning" in e["choices"][0].get("delta", {}):
                e["choices"][0]["delta"]["reasoning_content"] = e["choices"][0]["delta"].pop("reasoning")
    return events


async def _generation(server: str, capture: str, fields: list[str], *, rename: bool = False,
                      finish: str | None = None) -> Generation:
    stream = capture.endswith("_stream")
    if stream:
        body = sse_bytes(_inject_sse(capture_sse(capture, server), fields, rename, finish))
        response = httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    else:
        response = httpx.Response(200, json=_inject_json(capture_json(capture, server), fields, rename, finish))
    transport = httpx.MockTransport(lambda request: response)
    async with Client("s", "http://127.0.0.1:8104", transport=transport) as client:
        request = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 32, "temperature": 0}
        return await (client.stream_chat(request) if stream else client.chat(request))


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
async def test_value_found_where_it_was_written(server: str, capture: str, placement: str) -> None:
    gen = await _generation(server, capture, PLACEMENTS[placement])
    assert gen.ok and gen.finish_reason == "length"  # every capture ran into its 32/48-token cap
    status, where = score(gen, VALUE)
    assert where == PLACEMENTS[placement]
    # at the cap without the value: truncated, not a retrieval failure
    assert status == ("hit" if PLACEMENTS[placement] else "truncated")


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("capture", ["chat", "chat_stream", "chat_endthink_logitbias",
                                     "chat_endthink_logitbias_stream"])
async def test_reasoning_content_field_counts_as_reasoning(server: str, capture: str) -> None:
    gen = await _generation(server, capture, ["reasoning"], rename=True)
    assert score(gen, VALUE) == ("hit", ["reasoning"])


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("capture", CAPTURES)
async def test_finished_without_the_value_is_a_miss(server: str, capture: str) -> None:
    gen = await _generation(server, capture, [], finish="stop")
    assert score(gen, VALUE) == ("miss", [])


async def test_null_content_at_the_cap() -> None:
    # The real deepseek_r1 answer stopped by max_tokens inside <think>: content is JSON null.
    raw = capture_json("chat", "reasoning-deepseek_r1-8104")
    assert raw["choices"][0]["message"]["content"] is None
    assert raw["choices"][0]["finish_reason"] == "length"
    assert score(await _generation("reasoning-deepseek_r1-8104", "chat", []), VALUE) == ("truncated", [])
    hit = await _generation("reasoning-deepseek_r1-8104", "chat", ["reasoning"])
    assert hit.content == ""
    assert score(hit, VALUE) == ("hit", ["reasoning"])


@pytest.mark.parametrize("server", SERVERS)
async def test_unmodified_captures_do_not_contain_the_prompted_number(server: str) -> None:
    # The random tiny model behind the captures was asked for 7341 and never said it.
    for capture in CAPTURES:
        gen = await _generation(server, capture, [])
        assert score(gen, "7341") == ("truncated", []), capture


async def test_server_failure_is_an_error() -> None:
    # The real 500 a dying vLLM CPU engine returned (crash-seed-chunked-prefill).
    body = (FIXTURES / "crash-seed-chunked-prefill" / "response.json").read_bytes()
    transport = httpx.MockTransport(lambda r: httpx.Response(500, content=body,
                                                             headers={"content-type": "application/json"}))
    async with Client("s", "http://127.0.0.1:8104", transport=transport) as client:
        gen = await client.chat({"messages": [{"role": "user", "content": "q"}], "max_tokens": 8})
    assert gen.status == 500 and "EngineCore" in (gen.error or "")
    assert score(gen, VALUE) == ("error", [])


async def test_cut_stream_is_an_error_even_after_the_value() -> None:
    events = _inject_sse(capture_sse("chat_stream"), ["content"], False, None)
    body = sse_bytes([e for e in events if e is not None][:-2])  # no finish, no usage, no [DONE]
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body,
                                                             headers={"content-type": "text/event-stream"}))
    async with Client("s", "http://127.0.0.1:8104", transport=transport) as client:
        gen = await client.stream_chat({"messages": [{"role": "user", "content": "q"}], "max_tokens": 8})
    assert gen.error and "before [DONE]" in gen.error
    assert VALUE in gen.content  # streamed before the cut, but a failed request is not an answer
    assert score(gen, VALUE) == ("error", [])


@pytest.mark.parametrize(("text", "expected"), [
    ("One of the special magic numbers for a-b is: 2815901.\n", True),
    ("\n\n2815901", True),
    ("2,815,901", True),
    ("2 815 901", True),
    ("2.815.901", True),
    ("28159012", False),  # a longer number is a different answer
    ("12815901", False),
    ("281590", False),
    ("281 5901", False),  # not a thousands grouping
    ("key-12 2815901", True),
    ("", False),
    (None, False),
])
def test_digits_normalised_matching(text: str | None, expected: bool) -> None:
    assert contains_value(text, VALUE) is expected


def test_non_numeric_values_match_case_and_space_insensitively() -> None:
    assert contains_value("The code is  Blue\nHorse.", "blue horse")
    assert not contains_value("blue-horse", "blue horse")


def test_found_in_reports_both_fields() -> None:
    gen = Generation(content="2815901", reasoning="is: 2815901.", finish_reason="stop", complete=True)
    assert found_in(gen, VALUE) == ["content", "reasoning"]
