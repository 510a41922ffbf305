"""Fuzz the JSON bodies kvprobe reads: /v1/models, /version, /tokenize, /detokenize, /server_info,
completions with prompt logprobs (agreement) and with echo logprobs (lm-eval's perplexity). Real
captures, mutated, through the real client (httpx.MockTransport) and the readers after it: each
returns a sane value or raises kvprobe's own error with one line naming the server; never a traceback,
and what lands in the run directory stays JSON."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from hypothesis import example, given
from hypothesis import strategies as st
from mutate import DEV_FIXTURES, FIXTURES, dump, json_body, load, mutated_json, nested, one_line
from replay import Replay

from kvprobe.errors import ServerError, Unreadable
from kvprobe.quality.divergence import compare, parse_prompt_logprobs
from kvprobe.run.store import dumps
from kvprobe.server.client import Client
from kvprobe.server.inventory import engine_facts, take_inventory
from kvprobe.server.pin import check_pin
from kvprobe.server.platform import Platform, platform_from_system_env
from kvprobe.server.untrusted import check_logprobs

AUTO = FIXTURES / "auto-8101"


def _seed(name: str) -> Any:
    return load(AUTO / f"{name}.response.json")


async def _call(body: bytes, call: Callable[[Client], Awaitable[Any]], status: int = 200) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})

    async with Client("auto", "http://127.0.0.1:8101", transport=httpx.MockTransport(handler), backoff_s=0,
                      retries=1) as client:
        return await call(client)


def read_or_refuse(body: bytes, call: Callable[[Client], Awaitable[Any]], status: int = 200) -> Any:
    """The client's answer, or None when it refused with a ServerError naming the server."""
    try:
        return asyncio.run(_call(body, call, status))
    except ServerError as exc:
        one_line(exc, "auto")
        return None


DEEP = b"[" * 100_000  # Python's json recurses once per level: RecursionError, not ValueError
SURROGATE = b'{"version": "\\ud800"}'  # valid JSON, a str orjson cannot write back


# -- introspection endpoints -----------------------------------------------------------------

@given(json_body(_seed("models")) | json_body(load(FIXTURES / "hybrid-nemotronh" / "models-auto-maxlen512.json")))
@example(DEEP)
@example(b'{"data": [{"id": "\\ud800"}]}')
def test_models(body: bytes) -> None:
    models = read_or_refuse(body, lambda c: c.models())
    if models is not None:
        assert isinstance(models, list) and all(isinstance(m["id"], str) for m in models)
        dumps([m["id"] for m in models])


@given(json_body(_seed("version")))
@example(DEEP)
@example(SURROGATE)
def test_version(body: bytes) -> None:
    version = read_or_refuse(body, lambda c: c.version())
    assert version is None or isinstance(version, str)
    dumps(version)


@given(json_body(_seed("tokenize_prompt")) | json_body(_seed("tokenize_chat")))
@example(DEEP)
def test_tokenize(body: bytes) -> None:
    tokens = read_or_refuse(body, lambda c: c.tokenize(prompt="kvprobe"))
    if tokens is not None:
        assert all(type(t) is int and t >= 0 for t in tokens)
        dumps(tokens)


@given(json_body(_seed("detokenize")))
@example(DEEP)
def test_detokenize(body: bytes) -> None:
    text = read_or_refuse(body, lambda c: c.detokenize([1, 2]))
    assert text is None or isinstance(text, str)


@given(json_body(_seed("error_prompt_too_long")) | json_body(_seed("error_unknown_model")),
       st.sampled_from([400, 401, 404, 500, 503]))
@example(DEEP, 500)
@example(b"<html>\n<body>Bad Gateway</body>\n</html>", 500)  # a proxy's page: was a three-line error
@example(b'{"error": {"message": ' + b"[" * 1000 + b"]" * 1000 + b"}}", 400)  # str() of it recursed
def test_error_bodies(body: bytes, status: int) -> None:
    """An error answer's body is quoted in the error line: garbage there is still one line."""
    assert read_or_refuse(body, lambda c: c.completions({"prompt": "x"}), status) is None


# -- /server_info ------------------------------------------------------------------------------

SERVER_INFO = [load(DEV_FIXTURES / f"server_info-{name}.json") for name in ("auto", "fp8")]


@st.composite
def garbled_server_info(draw: st.DrawFn) -> Any:
    """A real /server_info with values in the sections kvprobe reads garbled (the whole tree is big:
    a random path would land in the pip list most of the time)."""
    info = json.loads(json.dumps(draw(st.sampled_from(SERVER_INFO))))
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from(["vllm_config", "vllm_env", "system_env", None]))
        if section is None:
            info = draw(mutated_json(info, max_mutations=1))
        elif isinstance(info, dict) and isinstance(info.get(section), dict):
            info[section] = draw(mutated_json(info[section]))
    return info


def read_server_info(info: Any) -> None:
    facts = engine_facts(info) if isinstance(info, dict) else {}
    platform = platform_from_system_env(info.get("system_env") if isinstance(info, dict) else None)
    dumps(facts)
    dumps(platform.to_dict())
    assert Platform.from_dict(platform.to_dict()) == platform


def _nested_dict(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"k": out}
    return out


@given(garbled_server_info())
@example({"vllm_config": {"a": nested(300)}})  # deeper than orjson writes (255)
@example({"vllm_env": {"VLLM_X": nested(300)}, "system_env": {"torch_version": nested(300)}})
def test_server_info_facts(info: Any) -> None:
    try:  # as the client hands it over: what orjson refuses (NaN, surrogates) never gets here
        info = orjson.loads(dump(info))
    except ValueError:
        return
    read_server_info(info)


def test_server_info_deeper_than_python_recurses() -> None:
    """A found case kept outside @example: hypothesis itself cannot print an argument this deep."""
    body = b'{"vllm_config": ' + b'{"k": ' * 1000 + b"{}" + b"}" * 1001
    info = read_or_refuse(body, lambda c: c.server_info())
    assert info is not None  # orjson reads 1000 levels; engine_facts used to recurse once per level
    read_server_info(info)


@given(garbled_server_info().map(dump).flatmap(lambda b: st.sampled_from([b, b[: len(b) // 2], DEEP])))
@example(b'{"vllm_config": {"k": "\\ud800"}}')  # the stdlib decoder took it; orjson cannot write it
@example(b'{"vllm_config": {"k": 1' + b"0" * 30 + b"}}")  # past 64 bits: orjson writes no such int
@example(b'{"vllm_config": {"k": NaN}}')
def test_server_info_through_client(body: bytes) -> None:
    info = read_or_refuse(body, lambda c: c.server_info())
    if info is not None:
        read_server_info(info)


# -- completions with logprobs --------------------------------------------------------------

PROMPT_LOGPROBS = [load(FIXTURES / server / f"completions_prompt_logprobs{k}_max1.response.json")
                   for server in ("auto-8101", "fp8-8102") for k in (0, 1)]


@given(st.sampled_from(PROMPT_LOGPROBS).flatmap(json_body))
@example(b'{"choices": [{"prompt_logprobs": [null, {"5": {"logprob": -1' + b"0" * 400 + b"}}]}]}")
@example(b'{"choices": [{"prompt_logprobs": [null, {}]}]}')
def test_prompt_logprobs(body: bytes) -> None:
    """The agreement probe's reading: the client, parse_prompt_logprobs, then compare() against the real
    capture of the same length (both ways) and against itself."""
    data = read_or_refuse(body, lambda c: c.completions({"prompt": [1, 2], "prompt_logprobs": 1}))
    if data is None:
        return
    try:
        got = parse_prompt_logprobs(data, "auto")
    except Unreadable as exc:
        one_line(exc, "auto")
        return
    for other in [got, *(parse_prompt_logprobs(p, "auto") for p in PROMPT_LOGPROBS)]:
        if len(other) == len(got):
            for result in (compare(got, other), compare(other, got)):
                assert all(math.isfinite(k) and k >= 0 for k in result.kl)  # an inf KL poisons every mean
                dumps({"kl": result.kl, "top1": result.top1, "diff": result.diff})


ECHO = [_seed("completions_echo_logprobs1_max0_str"), _seed("completions_echo_logprobs1_max0_ids_batch"),
        _seed("completions_echo_logprobs1_max1_ids"),
        load(FIXTURES / "extra-probes-8101" / "logprobs_21.response.json")]


def _lm_eval_parse(outputs: Any, ctxlens: list[int]) -> list[tuple[float, bool]]:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI.parse_logprobs(outputs, None, ctxlens)


@given(st.sampled_from(ECHO).flatmap(mutated_json), st.lists(st.integers(1, 6), min_size=1, max_size=3))
@example({"choices": [{"index": 0, "logprobs": {"token_logprobs": [None, -1.0, -2.0],
                                                 "top_logprobs": [None, {}, {"a": -2.0}]}}]}, [1])
@example({"choices": [{"index": 0, "logprobs": {"token_logprobs": [None, -1.0, -2.0],
                                                 "top_logprobs": [None, {"a": "x"}, {"a": -2.0}]}}]}, [1])
def test_echo_logprobs_for_lm_eval(outputs: Any, ctxlens: list[int]) -> None:
    """Perplexity: once check_logprobs lets an answer through, lm-eval's own parse_logprobs reads it."""
    try:
        check_logprobs("auto", outputs, ctxlens)
    except Unreadable as exc:
        one_line(exc, "auto")
        return
    for loglikelihood, greedy in _lm_eval_parse(outputs, ctxlens):
        assert isinstance(loglikelihood, float | int) and isinstance(greedy, bool)


# -- the whole inventory ----------------------------------------------------------------------

ROUTES = {("GET", "/version"): "version", ("GET", "/v1/models"): "models", ("POST", "/tokenize"): "tokenize_prompt",
          ("POST", "/v1/completions"): "completions_gen16"}


@st.composite
def garbled_server(draw: st.DrawFn) -> dict[tuple[str, str], bytes]:
    """One or two of a server's endpoints answering garbage; the rest as captured."""
    routes = draw(st.lists(st.sampled_from(sorted(ROUTES)), min_size=1, max_size=2, unique=True))
    return {route: draw(json_body(_seed(ROUTES[route]))) for route in routes}


async def _inventories(garbled: dict[tuple[str, str], bytes], info: Any) -> tuple[Any, Any]:
    out = []
    for routes in ({}, garbled):
        replay = Replay("auto-8101")
        for route, body in routes.items():
            replay.routes[route] = lambda r, body=body: httpx.Response(200, content=body)
        sent_info = SERVER_INFO[0] if not routes else info
        replay.routes[("GET", "/server_info")] = lambda r, sent=sent_info: httpx.Response(200, content=dump(sent))
        async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport(), backoff_s=0,
                          retries=1) as client:
            out.append(await take_inventory(client, smoke_max_tokens=4))
    return out[0], out[1]


@given(garbled_server(), garbled_server_info())
def test_inventory_of_a_garbling_server(garbled: dict[tuple[str, str], bytes], info: Any) -> None:
    """take_inventory never raises for what a server sends; the inventory and the one-knob check against
    a sane reference are written as JSON."""
    ref, inv = asyncio.run(_inventories(garbled, info))
    assert ref.status == "ok", ref.error
    if inv.error is not None:
        one_line(Exception(inv.error), "auto")
    dumps(inv.to_dict())
    dumps(check_pin(ref, [inv]).to_dict())
