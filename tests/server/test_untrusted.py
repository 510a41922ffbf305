"""Numbers a server sends are untrusted: inf, nan, negative, absurd, wrong type or missing each end as
one line naming the server and the field, never a traceback (real captures with one value garbled)."""

from __future__ import annotations

import asyncio
import json
import math
import re

import httpx
import pytest
from replay import Replay, capture

from kvprobe.errors import Unreadable
from kvprobe.load.stats import request_row
from kvprobe.quality.divergence import parse_prompt_logprobs
from kvprobe.server.client import Client
from kvprobe.server.inventory import take_inventory
from kvprobe.server.metrics import parse_metrics
from kvprobe.server.untrusted import count, number

GARBLED = [("inf", "not a finite number"), ("nan", "not a finite number"), ("-5", "below 1"),
           ("1e30", "absurdly large"), ("abc", "not a number")]


def metrics_with(label: str, value: str) -> str:
    text = capture("auto-8101", "metrics_fresh").decode()
    garbled, n = re.subn(rf'(?<![\w]){label}="[^"]*"', f'{label}="{value}"', text)
    assert n == 1
    return garbled


async def inventory_of(replay: Replay, **kw):
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport(), backoff_s=0) as client:
        return await take_inventory(client, **kw)


@pytest.mark.parametrize(("value", "what", "kw"), [
    (math.inf, "not a finite number", {}), (math.nan, "not a finite number", {}),
    (-1, "below 1", {"minimum": 1}), (1e30, "absurdly large", {"maximum": 10}),
    ("12", "not a number (a string)", {}), (True, "not a number", {}), (None, "missing", {}),
    (1.5, "not a whole number", {"integer": True}), ([1], "not a number", {}),
])
def test_number_refuses_what_is_not_a_sane_number(value, what, kw) -> None:
    with pytest.raises(Unreadable) as info:
        number(value, "srv: /x field", **kw)
    assert str(info.value).startswith("srv: /x field") and what in str(info.value)
    assert "\n" not in str(info.value)


def test_number_reads_sane_values_and_labels() -> None:
    assert number("1048576", "l", integer=True, text=True) == 1_048_576
    assert number("128.0", "l", integer=True, text=True) == 128 and type(number(8.0, "n", integer=True)) is int
    assert number("0.92", "l", text=True) == 0.92
    assert count(0, "c") == 0
    with pytest.raises(Unreadable):
        count(-1, "c")


@pytest.mark.parametrize(("value", "problem"), GARBLED)
def test_a_garbled_capacity_label_is_unreadable_not_an_estimate(value: str, problem: str) -> None:
    snap = parse_metrics(metrics_with("kv_cache_size_tokens", value))
    with pytest.raises(Unreadable) as info:
        snap.capacity()
    assert f"vllm:cache_config_info kv_cache_size_tokens {value!r}" in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(("label", "value"), [("num_gpu_blocks", "inf"), ("block_size", "-5"),
                                              ("kv_cache_max_concurrency", "nan")])
def test_every_capacity_label_is_checked(label: str, value: str) -> None:
    text = metrics_with(label, value)
    if label != "kv_cache_max_concurrency":  # the estimate path: no kv_cache_size_tokens label
        text = re.sub(r'kv_cache_size_tokens="\d+",', "", text)
    with pytest.raises(Unreadable, match=label):
        parse_metrics(text).capacity()


def test_a_nan_gauge_is_left_out_and_named() -> None:
    text = capture("auto-8101", "metrics_fresh").decode()
    text = re.sub(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+$", r"\1 NaN", text, flags=re.M)
    snap = parse_metrics(text)
    assert snap.kv_usage is None
    assert snap.unreadable == ["/metrics vllm:kv_cache_usage_perc nan is not a finite number"]


@pytest.mark.parametrize(("value", "problem"), GARBLED)
async def test_inventory_with_a_garbled_capacity_is_a_warning_and_no_capacity(value: str, problem: str) -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, text=metrics_with("kv_cache_size_tokens", value))
    inv = await inventory_of(replay, run_smoke=False)
    assert inv.status == "ok" and inv.capacity is None
    assert inv.cache_config["cache_dtype"] == "auto"  # what could be read is kept
    (line,) = inv.unreadable
    assert line in inv.warnings and "kv_cache_size_tokens" in line and problem in line
    assert line.endswith("KV capacity unreadable")


@pytest.mark.parametrize(("value", "problem"), [("x", "not a number (a string)"), (-1, "below 1"),
                                                (1e30, "absurdly large"), (8192.5, "not a whole number")])
async def test_inventory_with_a_garbled_max_model_len(value, problem: str) -> None:
    replay = Replay("auto-8101")
    models = json.loads(capture("auto-8101", "models"))
    models["data"][0]["max_model_len"] = value
    replay.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, json=models)
    inv = await inventory_of(replay)
    assert inv.max_model_len is None
    assert inv.unreadable == [f"/v1/models max_model_len {value!r} is {problem}" if problem != "absurdly large"
                              else "/v1/models max_model_len 1e+30 is absurdly large (over 100,000,000)"]
    assert inv.smoke.ok and inv.smoke.target_tokens == 2048  # the fallback, never a 5e29-token prompt
    assert not any("max_model_len unknown" in w for w in inv.warnings)  # one line, not two


async def test_smoke_usage_counts_that_are_strings() -> None:
    replay = Replay("auto-8101")
    answer = json.loads(capture("auto-8101", "completions_gen16"))
    answer["usage"] = {"prompt_tokens": "30", "completion_tokens": "16"}
    replay.routes[("POST", "/v1/completions")] = lambda r: httpx.Response(200, json=answer)
    inv = await inventory_of(replay)
    assert inv.smoke.ok and inv.smoke.prompt_tokens is None  # it generated text; the count is unreadable
    assert inv.unreadable == ["/v1/completions usage.prompt_tokens '30' is not a number (a string)",
                              "/v1/completions usage.completion_tokens '16' is not a number (a string)"]


@pytest.mark.parametrize("body", [{"data": "x"}, {"data": [{"id": 5}]}, [1, 2]])
async def test_a_models_list_that_is_not_one_is_unreadable(body) -> None:
    replay = Replay("auto-8101")
    replay.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, json=body)
    inv = await inventory_of(replay)
    assert inv.status == "unreadable" and inv.error.startswith("auto: /v1/models")


async def test_tokenize_answering_strings_is_unreadable() -> None:
    replay = Replay("auto-8101")
    replay.routes[("POST", "/tokenize")] = lambda r: httpx.Response(200, json={"tokens": ["a", "b"], "count": 2})
    inv = await inventory_of(replay)
    assert inv.status == "unreadable" and inv.error == "auto: /tokenize did not answer a list of token ids"


def _sse(events: list[bytes]) -> httpx.MockTransport:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    headers = {"content-type": "text/event-stream"}
    return httpx.MockTransport(lambda r: httpx.Response(200, content=body, headers=headers))


@pytest.mark.parametrize("event", [b"{not json", b"5", b'{"choices": [{"delta": {"content": 7}}]}',
                                   b'{"choices": "x"}'])
async def test_a_garbled_stream_event_is_a_failed_request_not_a_traceback(event: bytes) -> None:
    first = b'{"choices": [{"delta": {"content": "hi"}}]}'
    async with Client("srv", "http://127.0.0.1:9", transport=_sse([first, event, b"[DONE]"])) as client:
        gen = await client.stream_chat({"messages": []})
    assert not gen.ok and gen.error.startswith("srv: /v1/chat/completions: unreadable stream event")
    assert request_row(gen, gen.t_start, "srv")["status"] == "incomplete"  # it streamed, then garbage


async def test_a_garbled_stream_event_through_the_stream_pool() -> None:
    """The pool feeds the parser inside the socket's callback: an exception there would hang the request."""
    payload = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: {garbage\n\n'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(payload), payload))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, Client("srv", f"http://127.0.0.1:{port}", timeout_s=5) as client:
        gen = await asyncio.wait_for(client.stream_chat({"messages": []}), 5)
    assert not gen.ok and "unreadable stream event b'{garbage'" in gen.error


async def test_load_rows_with_string_usage_count_the_stream_and_say_so() -> None:
    usage = b'{"choices": [], "usage": {"prompt_tokens": "10", "completion_tokens": "abc"}}'
    events = [b'{"choices": [{"delta": {"content": "a"}}]}', b'{"choices": [{"delta": {"content": "b"}}]}', usage,
              b"[DONE]"]
    async with Client("srv", "http://127.0.0.1:9", transport=_sse(events)) as client:
        gen = await client.stream_chat({"messages": []})
    row = request_row(gen, gen.t_start, "srv")
    assert row["status"] == "ok" and row["output_tokens"] == 2 and not row["output_tokens_from_usage"]
    assert row["prompt_tokens"] is None
    assert row["unreadable"] == ("srv: usage.completion_tokens 'abc' is not a number (a string); "
                                 "srv: usage.prompt_tokens '10' is not a number (a string)")


@pytest.mark.parametrize(("logprob", "problem"), [(math.nan, "not a finite number"), ("x", "not a number"),
                                                  (3.0, "absurdly large"), (None, "missing"),
                                                  (-1e308, "below -10,000")])
def test_prompt_logprobs_are_checked(logprob, problem: str) -> None:
    answer = json.loads(capture("auto-8101", "completions_prompt_logprobs1_max1"))
    entry = answer["choices"][0]["prompt_logprobs"][2]
    entry[next(iter(entry))]["logprob"] = logprob
    with pytest.raises(Unreadable) as info:
        parse_prompt_logprobs(answer, "fp8")
    assert str(info.value).startswith("fp8: /v1/completions prompt_logprobs[2]") and problem in str(info.value)


def test_logprobs_lm_eval_sums_are_checked() -> None:
    from kvprobe.server.untrusted import check_logprobs

    answer = json.loads(capture("auto-8101", "completions_echo_logprobs1_max1_ids"))
    check_logprobs("fp8", answer, [1])  # the real capture is fine
    answer["choices"][0]["logprobs"]["token_logprobs"][2] = math.inf
    with pytest.raises(Unreadable, match=r"fp8: /v1/completions logprobs.token_logprobs\[2\] inf is not a finite"):
        check_logprobs("fp8", answer, [1])
    # vLLM's floor is -9999.0; two of -1e308 would sum to -inf
    answer["choices"][0]["logprobs"]["token_logprobs"][2] = -9999.0
    check_logprobs("fp8", answer, [1])
    answer["choices"][0]["logprobs"]["token_logprobs"][2] = -1e308
    with pytest.raises(Unreadable, match=r"token_logprobs\[2\] -1e\+308 is below -10,000"):
        check_logprobs("fp8", answer, [1])
    with pytest.raises(Unreadable, match="no choices"):
        check_logprobs("fp8", {"choices": "x"}, [1])
