"""Load probe, unit level: arithmetic on known inputs, timing from real SSE captures, incomplete
streams, the probe's flow (resume, a server dying) on replayed real captures."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from replay import MultiReplay, Replay, capture
from rich.console import Console

from kvprobe.config import LoadSettings, Slo, parse_config
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.load.stats import combine_repeats, request_row, summarize_run
from kvprobe.load.workload import TextSource, conversation, request_body, shapes_of
from kvprobe.run.store import RunDir
from kvprobe.server.client import Client, Generation

R1 = "reasoning-deepseek_r1-8104"


def row(ttft: float, e2e: float, out: int, itl: list[float] | None = None, status: str = "ok") -> dict:
    r = {"status": status, "ttft": ttft, "e2e": e2e, "output_tokens": out, "prompt_tokens": 100,
         "itl": itl if itl is not None else [], "t0": 0.0}
    r["tpot"] = (e2e - ttft) / (out - 1) if out > 1 else None
    return r


# -- arithmetic ---------------------------------------------------------------------------------

def test_percentiles_throughput_and_goodput_on_known_inputs() -> None:
    # TTFT 0.1 .. 1.0 s, E2E = TTFT + 1 s, 11 output tokens each -> TPOT 0.1 s
    rows = [row(t / 10, t / 10 + 1.0, 11, itl=[0.1] * 10) for t in range(1, 11)]
    s = summarize_run(rows, duration_s=5.0, slo=Slo(ttft_s=0.5, tpot_s=0.2))
    assert s["requests"] == s["successes"] == 10 and s["errors"] == 0
    assert s["output_tokens"] == 110 and s["output_tokens_per_s"] == pytest.approx(22.0)
    assert s["requests_per_s"] == pytest.approx(2.0)
    # linear interpolation over 0.1..1.0: p50 0.55, p90 0.91, p99 0.991
    assert s["ttft_s"]["mean"] == pytest.approx(0.55)
    assert s["ttft_s"]["p50"] == pytest.approx(0.55)
    assert s["ttft_s"]["p90"] == pytest.approx(0.91)
    assert s["ttft_p99_s"] == pytest.approx(0.991)
    assert s["e2e_p99_s"] == pytest.approx(1.991)
    assert s["tpot_s"]["p50"] == pytest.approx(0.1) and s["itl_p99_s"] == pytest.approx(0.1)
    # goodput: TTFT <= 0.5 s (5 requests) and TPOT <= 0.2 s (all) -> 5 good over 5 s
    assert s["goodput_requests_per_s"] == pytest.approx(1.0) and s["good_fraction"] == pytest.approx(0.5)
    # a TPOT limit no request meets -> no goodput at all
    assert summarize_run(rows, 5.0, Slo(tpot_s=0.05))["goodput_requests_per_s"] == 0.0
    # no SLO set -> goodput not computed, not zero
    assert summarize_run(rows, 5.0, Slo())["goodput_requests_per_s"] is None


def test_failed_and_incomplete_requests_are_counted_apart_from_successes() -> None:
    rows = [row(0.1, 1.0, 10), row(0.2, 2.0, 10),
            row(0.3, 0.5, 3, status="incomplete"), row(None, 0.01, 0, status="error")]
    s = summarize_run(rows, 2.0, Slo(e2e_s=1.5))
    assert s["requests"] == 4 and s["successes"] == 2 and s["errors"] == 1 and s["incomplete"] == 1
    assert s["requests"] == s["successes"] + s["errors"] + s["incomplete"]  # counted apart, as the README says
    assert s["output_tokens"] == 20  # only finished requests count
    assert s["ttft_s"]["p50"] == pytest.approx(0.15)  # the incomplete one's 0.3 s is not a latency sample
    assert s["goodput_requests_per_s"] == pytest.approx(0.5)  # one success under 1.5 s, over 2 s
    assert s["good_fraction"] == pytest.approx(0.25)


def test_load_json_counts_incomplete_apart_from_errors_over_repeats() -> None:
    runs_rows = [[row(0.1, 1.0, 10), row(0.3, 0.5, 3, status="incomplete")],
                 [row(0.2, 1.0, 10), row(None, 0.01, 0, status="error"), row(0.3, 0.5, 2, status="incomplete")]]
    runs = [summarize_run(r, 1.0, Slo()) for r in runs_rows]
    assert [(r["errors"], r["incomplete"]) for r in runs] == [(0, 1), (1, 1)]
    case = combine_repeats(runs, [r for rs in runs_rows for r in rs], Slo())
    assert (case["requests"], case["successes"], case["errors"], case["incomplete"]) == (5, 2, 1, 2)


def test_repeats_combine_counts_and_pool_latencies() -> None:
    runs_rows = [[row(0.1, 1.0, 10), row(0.3, 1.0, 10)], [row(0.2, 1.0, 10)]]
    runs = [summarize_run(r, 1.0, Slo()) | {"metrics": {"kv_usage_max": kv, "deltas": {"preemptions": p}}}
            for r, kv, p in zip(runs_rows, (0.2, 0.5), (1, 2), strict=True)]
    case = combine_repeats(runs, [r for rs in runs_rows for r in rs], Slo())
    assert case["requests"] == 3 and case["errors"] == 0
    assert case["output_tokens_per_s"] == pytest.approx(15.0)  # mean of 20 and 10
    assert case["ttft_s"]["p50"] == pytest.approx(0.2)  # pooled over both runs
    assert case["kv_usage_max"] == 0.5 and case["preemptions"] == 3
    assert [r["output_tokens_per_s"] for r in case["repeats"]] == [20.0, 10.0]


# -- timing from real streams -------------------------------------------------------------------

def _paced_sse(body: bytes, first_delay: float, gap: float) -> httpx.MockTransport:
    """Serve a real SSE capture event by event: the first event after first_delay, then one every gap."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]

    async def stream():
        await asyncio.sleep(first_delay)
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(gap)
            yield event

    return httpx.MockTransport(lambda r: httpx.Response(200, content=stream(),
                                                        headers={"content-type": "text/event-stream"}))


async def test_ttft_is_the_first_reasoning_chunk_of_a_real_stream() -> None:
    body = capture(R1, "chat_stream")
    first = json.loads(body.split(b"\n\n")[0][len("data: "):])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # real: an empty role chunk first
    second = json.loads(body.split(b"\n\n")[1][len("data: "):])
    assert second["choices"][0]["delta"]["reasoning"] and "content" not in second["choices"][0]["delta"]
    # the role chunk arrives at 50 ms, the first reasoning token 30 ms later, then one every 30 ms
    client = Client("r1", "http://127.0.0.1:9", transport=_paced_sse(body, 0.05, 0.03))
    async with client:
        gen = await client.stream_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 32})
    r = request_row(gen, gen.t_start)
    assert r["status"] == "ok" and gen.content == "" and len(gen.reasoning) > 0
    assert r["ttft"] == pytest.approx(gen.chunks[1].t - gen.t_start, abs=1e-6)  # the reasoning chunk, not the role
    assert 0.075 <= r["ttft"] < 0.2
    assert r["output_tokens"] == 32 and r["output_tokens_from_usage"]  # from usage (include_usage)
    assert len(r["itl"]) == 31 and min(r["itl"]) >= 0.025
    assert r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / 31, rel=1e-3)


async def test_stream_cut_midway_counts_as_incomplete_not_success() -> None:
    body = capture(R1, "chat_stream")
    cut = body[: len(body) // 2].rsplit(b"\n\n", 1)[0] + b"\n\n"
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=cut,
                                                             headers={"content-type": "text/event-stream"}))
    async with Client("r1", "http://127.0.0.1:9", transport=transport) as client:
        gen = await client.stream_chat({"messages": []})
    r = request_row(gen, gen.t_start)
    assert r["status"] == "incomplete" and "before [DONE]" in r["error"]
    assert r["ttft"] is not None  # it did stream: the partial timing is kept in the row
    s = summarize_run([r, row(0.1, 1.0, 10)], 1.0, Slo())
    assert s["successes"] == 1 and s["incomplete"] == 1 and s["errors"] == 0


# -- the aiohttp stream path over a real socket -------------------------------------------------

async def _raw_server(payload: bytes, close_after: int | None = None, stall: bool = False):
    """A socket server that answers any request with the SSE payload in chunked encoding, or cuts
    the connection after close_after bytes of it (no terminating chunk)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        # whole events, or a cut mid-event, as when the server process dies
        pieces = ([e + b"\n\n" for e in payload.split(b"\n\n") if e] if close_after is None
                  else [payload[:close_after]])
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        if stall:  # alive but silent, like a hung engine
            await asyncio.sleep(30)
        if close_after is None:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_aiohttp_stream_path_on_a_real_capture_and_a_cut() -> None:
    body = capture(R1, "chat_stream")
    server = await _raw_server(body)
    port = server.sockets[0].getsockname()[1]
    async with server, Client("r1", f"http://127.0.0.1:{port}") as client:
        gen = await client.stream_chat({"messages": []})
    assert gen.ok and gen.usage["completion_tokens"] == 32 and gen.finish_reason == "length"
    via_httpx = Client("r1", "http://127.0.0.1:9", transport=_paced_sse(body, 0, 0))
    async with via_httpx:
        ref = await via_httpx.stream_chat({"messages": []})
    assert gen.reasoning == ref.reasoning and len(gen.chunks) == len(ref.chunks)  # both paths parse alike

    server = await _raw_server(body, close_after=len(body) // 2)
    port = server.sockets[0].getsockname()[1]
    async with server, Client("r1", f"http://127.0.0.1:{port}") as client:
        gen = await client.stream_chat({"messages": []})
    assert not gen.ok and gen.chunks and request_row(gen, gen.t_start)["status"] == "incomplete"
    assert "stream cut" in gen.error or "before [DONE]" in gen.error

    # A server that stops sending mid-stream: the idle timeout (timeout_s between reads) ends it.
    server = await _raw_server(body, close_after=len(body) // 2, stall=True)
    port = server.sockets[0].getsockname()[1]
    async with server, Client("r1", f"http://127.0.0.1:{port}", timeout_s=0.3) as client:
        gen = await client.stream_chat({"messages": []})
    assert not gen.ok and gen.chunks and "stream stalled" in gen.error and "no data within 0.3 s" in gen.error
    assert 0.3 <= gen.e2e < 2.0


# -- workload -----------------------------------------------------------------------------------

def test_conversations_grow_and_are_identical_for_every_server() -> None:
    settings = LoadSettings(turns=3, system_tokens=100, tokens_per_turn=50, max_output_tokens=20)
    shape = shapes_of(settings)[0]
    source = TextSource(4.0)
    a = conversation(source, shape, "abc123", agent=1)
    b = conversation(source, shape, "abc123", agent=1)
    assert a == b  # same nonce, same agent: byte-identical prompts on every server
    assert conversation(source, shape, "abc124", agent=1).system != a.system  # a new case is uncached
    assert conversation(source, shape, "abc123", agent=2).system == a.system  # agents share the system prompt
    bodies = [request_body(a, t, settings, shape) for t in range(3)]
    assert [len(b["messages"]) for b in bodies] == [2, 4, 6]
    assert bodies[2]["messages"][:4] == bodies[1]["messages"]  # the history is carried over verbatim
    assert bodies[0]["max_tokens"] == 20 and bodies[0]["ignore_eos"] is True and bodies[0]["temperature"] == 0
    wrapper = len("Tool output (agent 1, call 0.0):\n\n\nQuestion: what does this output say, in one sentence?")
    assert len(a.users[0]) - wrapper == 50 * 4  # tokens_per_turn x chars per token
    assert len(a.replies[0]) == 20 * 4  # the stand-in reply is the size of a real one
    crash = request_body(a, 0, settings, shape, {"seed": 1, "temperature": 0.7})
    assert crash["seed"] == 1 and crash["temperature"] == 0.7


def test_shapes_take_load_values_unless_set() -> None:
    settings = LoadSettings(agents=[1, 4], shapes=[{"name": "short"}, {"name": "long", "system_tokens": 7000,
                                                                      "turns": 1, "agents": [2]}])
    short, long = shapes_of(settings)
    assert short.agents == (1, 4) and short.system_tokens == 512 and short.turns == 4
    assert long.agents == (2,) and long.system_tokens == 7000 and long.turns == 1


def test_open_loop_needs_a_rate() -> None:
    from kvprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="needs rate"):
        parse_config({"server": [{"name": "a", "url": "http://x:1", "role": "reference"}], "load": {"mode": "open"}})


# -- the probe on replayed real captures --------------------------------------------------------

def _config(extra: dict | None = None):
    load = {"agents": [1, 2], "turns": 2, "repeats": 2, "system_tokens": 64, "tokens_per_turn": 32,
            "metrics_interval_s": 0.05, "warmup": False, "settle_s": 0} | (extra or {})
    return parse_config({"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                                    {"name": "fp8", "url": "http://127.0.0.1:8102"}], "load": load})


def _chat_posts(replay: Replay) -> int:
    return sum(1 for call in replay.calls if call == ("POST", "/v1/chat/completions"))


async def test_probe_writes_load_json_and_resume_skips_finished_units(tmp_path: Path) -> None:
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    multi = MultiReplay({"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=200)
    outcome = await run_eval(_config({"warmup": True}), run, ["load"], console, transport=multi.transport())
    assert outcome.exit_code in (0, 1) and not outcome.messages  # 1: the verdict lacks the quality probes
    # the verdict reads load.json: one throughput check and three p99 checks per case
    checks = [c for c in outcome.ctx.results["verdict"]["decisions"]["fp8"]["checks"] if c.get("case")]
    assert sorted({c["case"] for c in checks}) == ["shape=default agents=1", "shape=default agents=2"]
    assert sorted(c["bar"] for c in checks).count("p99_latency_rise_max") == 6
    warm = list(run.events("load_warmup"))
    assert [(w["server"], w["agents"]) for w in warm] == [("auto", 2), ("fp8", 2)]  # largest sweep point, unrecorded
    # A fixed design ([load] repeats = 2) runs exactly its 2 blocks, even where the client was the limit of
    # each (replayed answers arrive at once): the verdict then says the blocks were dropped.
    blocks = 2
    assert [e["why"] for e in run.events("load_stop")] == ["the design's 2 blocks run"]
    assert _chat_posts(auto) == 2 * 2 + (1 + 2) * 2 * blocks  # warm-up (2 agents x 2 turns) + measured
    data = json.loads((run.path / "load.json").read_text())
    assert data["reference"] == "auto"
    for name in ("auto", "fp8"):
        cases = data["servers"][name]["cases"]
        assert [c["agents"] for c in cases] == [1, 2]
        for case in cases:
            keys = {"agents", "requests", "errors", "output_tokens_per_s", "ttft_p99_s", "itl_p99_s", "e2e_p99_s",
                    "kv_usage_max", "preemptions"}
            assert keys <= set(case)
            assert case["requests"] == case["agents"] * 2 * blocks and case["errors"] == 0  # turns x blocks
            assert case["output_tokens_per_s"] > 0 and len(case["repeats"]) == blocks
        assert "VLLM_SERVER_DEV_MODE=1" in data["servers"][name]["prefix_cache"]  # the replay has no reset
    assert "comparisons" not in data  # the probe records; the checks judge
    verdict = json.loads((run.path / "verdict.json").read_text())
    load_checks = [c for c in verdict["decisions"]["fp8"]["checks"] if c["probe"] == "load"]
    assert load_checks[0]["id"] == "load.endpoint.throughput_drop"  # the one primary endpoint, then guardrails
    assert {c["case"] for c in load_checks[1:]} == {"shape=default agents=1", "shape=default agents=2"}
    rows = list(run.events("load_request"))
    assert len(rows) == 2 * (1 + 2) * 2 * blocks and all(r["status"] == "ok" for r in rows)
    assert "load: fp8 throughput drop, sweep mean" in console.file.getvalue()  # the line the probe ends with

    # Blocks: every case on both servers back to back, the servers' order alternating block by block (a
    # Williams design) and the cases rotated, so drift and position hit both alike.
    order = [(e["server"], e["agents"], e["repeat"]) for e in run.events("load_case")]
    assert order == [("auto", 1, 0), ("fp8", 1, 0), ("auto", 2, 0), ("fp8", 2, 0),
                     ("fp8", 2, 1), ("auto", 2, 1), ("fp8", 1, 1), ("auto", 1, 1)]

    before = _chat_posts(auto) + _chat_posts(fp8)
    again = await run_eval(_config({"warmup": True}), RunDir.open(run.path), ["load"], console,
                           transport=multi.transport(), resume=True)
    assert again.exit_code == outcome.exit_code
    assert _chat_posts(auto) + _chat_posts(fp8) == before  # every unit was already done
    assert json.loads((run.path / "load.json").read_text())["servers"] == data["servers"]

    # Other settings are another measurement: nothing is reused.
    await run_eval(_config({"warmup": True, "max_output_tokens": 8}), RunDir.open(run.path), ["load"], console,
                   transport=multi.transport(), resume=True)
    assert _chat_posts(auto) + _chat_posts(fp8) > before


async def test_a_server_dying_under_load_is_marked_broken_and_the_others_go_on(tmp_path: Path) -> None:
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    crash = capture("crash-seed-chunked-prefill", "response")  # the real 500 before the engine died
    dead = {"yes": False}

    def crash_chat(request: httpx.Request) -> httpx.Response:
        dead["yes"] = True
        return httpx.Response(500, content=crash, headers={"content-type": "application/json"})

    def health(request: httpx.Request) -> httpx.Response:
        if dead["yes"]:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        return httpx.Response(200)

    fp8.routes[("POST", "/v1/chat/completions")] = crash_chat
    fp8.routes[("GET", "/health")] = health
    multi = MultiReplay({"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config(), run, ["load"], Console(file=io.StringIO()), transport=multi.transport())
    assert outcome.exit_code == 4  # a server broke during the run
    assert "EngineCore encountered an issue" in outcome.ctx.broken["fp8"]
    assert _chat_posts(fp8) == 1  # nothing more after it died
    data = json.loads((run.path / "load.json").read_text())
    assert data["servers"]["fp8"]["broken"] and data["servers"]["fp8"]["cases"] == []
    assert [c["agents"] for c in data["servers"]["auto"]["cases"]] == [1, 2]  # the reference went on
    assert all(c["errors"] == 0 for c in data["servers"]["auto"]["cases"])
    aborted = list(run.events("load_aborted", server="fp8"))
    assert len(aborted) == 1 and aborted[0]["summary"]["errors"] == 1


@pytest.mark.parametrize("warmup", [False, True])
async def test_a_server_failing_every_load_request_while_healthy_is_broken(tmp_path: Path, warmup: bool) -> None:
    # Healthy is not serving: /health answers, yet every chat request gets the real 500 of an engine fault.
    # Its blocks would carry a throughput of 0, which no paired block can use: unmarked, the speed endpoint
    # said "0 paired blocks ... inconclusive" and the verdict never named the failures.
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    crash = capture("crash-seed-chunked-prefill", "response")
    fp8.routes[("POST", "/v1/chat/completions")] = lambda request: httpx.Response(
        500, content=crash, headers={"content-type": "application/json"})
    multi = MultiReplay({"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config({"warmup": warmup}), run, ["load"], Console(file=io.StringIO()),
                             transport=multi.transport())
    assert outcome.exit_code == 4  # a server broke during the run
    where = "the warm-up" if warmup else "block 1 at 1 agent"
    why = outcome.ctx.broken["fp8"]
    assert why.startswith(f"every one of its {4 if warmup else 2} load requests failed in {where} while /health "
                          "answered (the first: fp8: HTTP 500")
    assert "EngineCore encountered an issue" in why
    assert _chat_posts(fp8) == (4 if warmup else 2)  # nothing more once it was shown not to serve
    data = json.loads((run.path / "load.json").read_text())
    assert data["servers"]["fp8"]["cases"] == [] and data["servers"]["fp8"]["broken"] == why
    assert [c["agents"] for c in data["servers"]["auto"]["cases"]] == [1, 2]  # the reference went on
    assert len(list(run.events("load_aborted", server="fp8"))) == (0 if warmup else 1)
    decision = outcome.ctx.results["verdict"]["decisions"]["fp8"]
    assert decision["decision"] == "broken"
    assert any(why in reason for reason in decision["reasons"])


def _fp8_failing_every_third(failure) -> MultiReplay:
    """The replayed pair, fp8 answering every third chat request with `failure()` and the rest as captured."""
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    served = fp8.routes[("POST", "/v1/chat/completions")]
    posts = {"n": 0}

    def every_third_fails(request: httpx.Request) -> httpx.Response:
        posts["n"] += 1
        return failure() if posts["n"] % 3 == 0 else served(request)

    fp8.routes[("POST", "/v1/chat/completions")] = every_third_fails
    return MultiReplay({"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})


async def test_a_server_erring_on_some_load_requests_while_healthy_is_broken(tmp_path: Path) -> None:
    # The real EngineCore 500 on every third chat request: counted only as lost throughput, a third of a block is
    # a clear speed loss, but an error on 2% of requests would pass a 5% bar. A server error is the server's
    # fault whatever the throughput: the candidate is broken, the count and the first error named.
    crash = capture("crash-seed-chunked-prefill", "response")
    multi = _fp8_failing_every_third(lambda: httpx.Response(500, content=crash,
                                                            headers={"content-type": "application/json"}))
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config({"agents": [3], "repeats": 1}), run, ["load"], Console(file=io.StringIO()),
                             transport=multi.transport())
    assert outcome.exit_code == 4
    why = outcome.ctx.broken["fp8"]
    assert why.startswith("2 of its 6 load requests in block 1 at 3 agents got a server error while /health "
                          "answered (the first: fp8: HTTP 500"), why
    assert "EngineCore encountered an issue" in why
    (aborted,) = run.events("load_aborted", server="fp8")
    assert aborted["summary"]["errors"] == 2 and aborted["summary"]["requests"] == 6
    decision = outcome.ctx.results["verdict"]["decisions"]["fp8"]
    assert decision["decision"] == "broken" and any(why in reason for reason in decision["reasons"])
    assert "auto" not in outcome.ctx.broken


def _stream_failing_midway(body: bytes) -> bytes:
    """A real stream's first events, then what vLLM 0.32 sends when generation fails after HTTP 200
    (serving.py: GenerationError -> create_streaming_error_response -> ErrorResponse.model_dump()), then [DONE]."""
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: {")]
    error = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
    return b"".join(e + b"\n\n" for e in events[:3]) + b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n"


async def test_an_error_event_in_a_stream_is_a_server_error_with_its_code() -> None:
    body = _stream_failing_midway(capture(R1, "chat_stream"))
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body,
                                                             headers={"content-type": "text/event-stream"}))
    async with Client("fp8", "http://127.0.0.1:9", transport=transport) as client:
        gen = await client.stream_chat({"messages": []})
    r = request_row(gen, gen.t_start)
    assert gen.status is None and gen.chunks  # the status line said 200 and tokens had streamed
    assert r["status"] == "error" and r["stream_error_code"] == 500
    assert r["error"] == ("fp8: /v1/chat/completions: an error event in the stream (code 500): Internal server "
                          "error"), r["error"]
    plain = request_row(Generation(t_start=0.0, t_end=1.0, complete=True), 0.0)
    assert "stream_error_code" not in plain  # the key is written only when there is one


async def test_a_server_failing_midstream_on_some_load_requests_is_broken(tmp_path: Path) -> None:
    # vLLM answers an engine failure after the stream began with HTTP 200 and a 500 error event: the status line
    # alone would count it as lost throughput only.
    failing = _stream_failing_midway(capture("fp8-8102", "chat_stream"))
    multi = _fp8_failing_every_third(lambda: httpx.Response(200, content=failing,
                                                            headers={"content-type": "text/event-stream"}))
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config({"agents": [3], "repeats": 1}), run, ["load"], Console(file=io.StringIO()),
                             transport=multi.transport())
    assert outcome.exit_code == 4
    why = outcome.ctx.broken["fp8"]
    assert why.startswith("2 of its 6 load requests in block 1 at 3 agents got a server error while /health "
                          "answered (the first: fp8: /v1/chat/completions: an error event in the stream "
                          "(code 500)"), why
    assert "auto" not in outcome.ctx.broken


def test_not_serving_names_a_case_with_no_success_or_any_server_error() -> None:
    from kvprobe.probes.load import not_serving

    ok = {"status": "ok", "error": None, "http_status": None}
    cut = {"status": "incomplete", "error": None, "http_status": None}
    refused = {"status": "error", "error": "fp8: connection refused", "http_status": None}
    too_long = {"status": "error", "error": "fp8: HTTP 400: prompt too long", "http_status": 400}
    fault = {"status": "error", "error": "fp8: HTTP 503: overloaded", "http_status": 503}
    in_stream = {"status": "error", "error": "fp8: an error event in the stream (code 500)", "http_status": None,
                 "stream_error_code": 500}
    bad_request = {"status": "error", "error": "fp8: an error event in the stream (code 400)", "http_status": None,
                   "stream_error_code": 400}
    assert not_serving([], "block 1 at 1 agent") is None  # nothing sent: nothing shown
    # something served, and no failure the server's own: lost throughput, judged by the speed checks
    assert not_serving([cut, ok, refused, too_long, bad_request], "block 1 at 1 agent") is None
    assert not_serving([cut, refused], "block 2 at 4 agents") == (
        "every one of its 2 load requests failed in block 2 at 4 agents while /health answered (the first: "
        "a stream cut before its end)")
    assert "(the first: fp8: connection refused)" in not_serving([refused, cut], "the warm-up")
    assert not_serving([ok, ok, too_long, fault, ok], "block 3 at 2 agents") == (
        "1 of its 5 load requests in block 3 at 2 agents got a server error while /health answered (the first: "
        "fp8: HTTP 503: overloaded)")
    assert not_serving([ok, in_stream, ok], "block 4 at 2 agents") == (
        "1 of its 3 load requests in block 4 at 2 agents got a server error while /health answered (the first: "
        "fp8: an error event in the stream (code 500))")


async def test_budgets_and_open_loop_poisson_arrivals(tmp_path: Path) -> None:
    multi = MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")})
    console = Console(file=io.StringIO())
    # closed loop with a request budget: agents start new conversations until it is spent
    run = RunDir.create(tmp_path / "closed")
    await run_eval(_config({"agents": [2], "repeats": 1, "requests_per_case": 7}), run, ["load"], console,
                   transport=multi.transport())
    rows = list(run.events("load_request", server="auto", repeat=0))
    assert len(rows) == 7 and {r["conversation"] for r in rows} >= {0, 1}
    # open loop: Poisson arrivals at 40/s, the same schedule on every server
    run = RunDir.create(tmp_path / "open")
    outcome = await run_eval(_config({"agents": [3], "repeats": 1, "mode": "open", "rate": 40.0}), run, ["load"],
                             console, transport=multi.transport())
    assert outcome.exit_code in (0, 1) and not outcome.messages
    starts = {name: sorted(r["t0"] for r in run.events("load_request", server=name, repeat=0))
              for name in ("auto", "fp8")}
    assert len(starts["auto"]) == 3 * 2  # agents x turns, sent without waiting for answers
    assert starts["auto"] == pytest.approx(starts["fp8"], abs=0.1)  # same seeded schedule (loose: a busy CI box)
    gaps = [b - a for a, b in zip(starts["auto"], starts["auto"][1:], strict=False)]
    assert len(set(round(g, 2) for g in gaps)) > 1  # exponential gaps, not a fixed period
    # The schedule is drawn from the case nonce, so the test can draw it too: each request goes out
    # at its due time, never before it (a bound on the sum of 5 random gaps would itself be flaky).
    (case,) = run.events("load_case", server="auto", repeat=0)
    rng = np.random.default_rng(int(case["nonce"], 16) ^ 0)  # [load] seed defaults to 0
    due = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / 40.0, size=5))])
    assert all(d - 0.002 <= t < d + 0.5 for t, d in zip(starts["auto"], due, strict=True))
    data = json.loads((run.path / "load.json").read_text())
    assert data["servers"]["fp8"]["cases"][0]["mode"] == "open" and data["servers"]["fp8"]["cases"][0]["rate"] == 40.0


async def test_a_resumed_run_warms_a_server_before_its_first_block_with_work_left() -> None:
    """A block whose units are all recorded measures nothing: it must not count as the server's warm-up,
    or the first block measured after a resume runs on a cold server."""
    from types import SimpleNamespace

    from kvprobe.load.workload import Shape
    from kvprobe.probes.load import _warm_up_first

    shape = Shape("default", (1, 2), turns=2, system_tokens=10, tokens_per_turn=10, max_output_tokens=4)
    block0 = {(name, "default", agents, 0) for name in ("ref", "cand") for agents in (1, 2)}
    ctx = SimpleNamespace(active=lambda: ["ref", "cand"])
    warmed: set[str] = set()
    calls: list[tuple[str, int]] = []

    async def warm(name: str, sh: Shape) -> None:
        calls.append((name, block))

    for block in (0, 1):
        await _warm_up_first(ctx, ["ref", "cand"], block, [shape], block0, warmed, warm)
    assert calls == [("ref", 1), ("cand", 1)] and warmed == {"ref", "cand"}


def test_a_look_is_said_once_when_the_usable_blocks_reach_it() -> None:
    """The standing is said at a planned look of usable blocks, once, for a candidate open before the block (the
    look that settles it included). Said at the block count instead, a run that dropped client-limited blocks
    printed only '7 blocks is not a planned look: no decision there' (the Xeon demo of 2026-12-07, at blocks 8,
    12 and 16)."""
    import copy

    from rich.progress import Progress

    from kvprobe.probes.load import _say_looks

    verdict = json.loads((Path(__file__).parents[1] / "fixtures" / "runs" / "xeon-amx-rules6" /
                          "verdict.json").read_text())
    at = next(c for c in verdict["decisions"]["fp8"]["checks"] if c["id"] == "load.endpoint.throughput_drop")
    assert at["sequential"]["look"]["at_look"] and at["sequential"]["dropped_client_limited"] >= 1
    off = copy.deepcopy(at)
    off["sequential"]["look"].update(at_look=False, n=at["sequential"]["look"]["n"] + 1)
    console = Console(file=io.StringIO(), width=400)
    said: set = set()
    with Progress(console=console) as progress:
        _say_looks({"fp8": [off]}, ["fp8"], said, progress)
        assert console.file.getvalue() == ""
        for _ in range(2):
            _say_looks({"fp8": [at]}, ["fp8"], said, progress)
        _say_looks({"twin": [at]}, [], said, progress)  # not open before the block: nothing said
    assert [line for line in console.file.getvalue().splitlines() if line.strip()] == [f"  fp8 {at['text']}"]
