"""The fill probe on replayed servers: one that holds its claimed pool, one whose kernel overruns its
buffer and dies past half of it (the int8_per_token_head failure, with the real crash body)."""

from __future__ import annotations

import io
import json

import httpx
from replay import MultiReplay, Replay, capture
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.errors import EXIT_BROKEN
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.run.store import RunDir

CLAIMED = 1_048_576  # tiny-llama auto capture: kv_cache_size_tokens


def server(real_tokens: int | None) -> Replay:
    """A replayed auto server whose /v1/completions counts new tokens and, past `real_tokens`, answers
    the real crash 500 once and then refuses connections, as a dead vLLM does."""
    replay = Replay("auto-8101")
    state = {"served": 0, "dead": False, "prompts": []}
    crash = capture("crash-seed-chunked-prefill", "response")
    smoke = replay.routes[("POST", "/v1/completions")]

    def completions(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("max_tokens") != 1:
            return smoke(request)  # the inventory's smoke
        if state["dead"]:
            raise httpx.ConnectError("Connection refused", request=request)
        if len(body["prompt"]) + body["max_tokens"] > 8192:  # the capture's max_model_len; vLLM's 400
            return httpx.Response(400, json={"error": {"message": "This model's maximum context length is 8192"
                                                       " tokens.", "type": "BadRequestError", "code": 400}})
        state["prompts"].append(body["prompt"][:8])
        state["served"] += len(body["prompt"]) + 1
        if real_tokens is not None and state["served"] > real_tokens:
            state["dead"] = True
            return httpx.Response(500, content=crash)
        return httpx.Response(200, json={"choices": [{"text": "x", "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}})

    replay.routes[("POST", "/v1/completions")] = completions
    replay.state = state  # type: ignore[attr-defined]
    return replay


def config(fraction: float = 0.05, prompt_tokens: int | None = 4096):
    # A 5% fill of the 1M-token capture keeps the test fast; the overrunning server dies at 2%.
    fill = {"fraction": fraction, "concurrency": 2} | ({"prompt_tokens": prompt_tokens} if prompt_tokens else {})
    return parse_config({"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                                    {"name": "int8", "url": "http://127.0.0.1:8103"}], "fill": fill})


async def test_overrunning_server_is_broken_and_the_healthy_one_holds(tmp_path) -> None:
    good, bad = server(None), server(CLAIMED // 50)
    multi = MultiReplay({"127.0.0.1:8101": good, "127.0.0.1:8103": bad})
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=120)
    outcome = await run_eval(config(), run, ["capacity", "fill"], console, transport=multi.transport())
    assert outcome.exit_code == EXIT_BROKEN
    fill = run.read_json("fill.json")
    auto, int8 = fill["servers"]["auto"], fill["servers"]["int8"]
    assert auto["survived"] is True and auto["served_tokens"] >= 0.05 * CLAIMED
    assert auto["served_tokens"] < 0.05 * CLAIMED + 2 * 4097  # stops once the target is reached
    assert int8["survived"] is False and "EngineCore encountered an issue" in int8["error"]
    assert int8["served_tokens"] + 4097 * 2 >= CLAIMED // 50
    assert int8["fraction_of_claimed"] < 0.03
    assert "fill: failed after serving" in outcome.ctx.broken["int8"]
    verdict = run.read_json("verdict.json")
    assert verdict["decisions"]["int8"]["decision"] == "broken"
    # the report's Fill table: the one that held and the one that died, with its error
    from kvprobe.report.tables import all_tables

    table = next(t for t in all_tables(verdict) if t.title.startswith("Fill:"))
    rows = {row[0]: row for row in table.rows}
    assert rows["auto"][-1] == "held" and rows["auto"][3] == "5%"
    assert rows["int8"][-1].startswith("died: ") and "EngineCore encountered an issue" in rows["int8"][-1]
    assert table.tags[list(rows).index("int8")] == "broken"
    # every request is new to the prefix cache: its first tokens are random
    prompts = [tuple(p) for p in good.state["prompts"]]
    assert len(set(prompts)) == len(prompts)


async def test_fill_is_opt_in_and_resumes_without_refilling(tmp_path) -> None:
    good, other = server(None), server(None)
    multi = MultiReplay({"127.0.0.1:8101": good, "127.0.0.1:8103": other})
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=120)
    await run_eval(config(0.01), run, ["capacity", "fill"], console, transport=multi.transport())
    served = good.state["served"]
    assert served >= 0.01 * CLAIMED
    await run_eval(config(0.01), RunDir.open(run.path), ["capacity", "fill"], console, transport=multi.transport())
    assert good.state["served"] == served  # recorded: not filled again

    from kvprobe.probes import default_probes

    assert "fill" not in default_probes()


async def test_default_prompts_fill_max_model_len_and_a_refusal_is_not_a_crash(tmp_path) -> None:
    good, refusing = server(None), server(None)
    refusing.routes[("POST", "/v1/completions")] = lambda request: (
        Replay("auto-8101").routes[("POST", "/v1/completions")](request)
        if json.loads(request.content).get("max_tokens") != 1
        else httpx.Response(400, json={"error": {"message": "max_tokens must be at least 1, got 0.", "code": 400}}))
    multi = MultiReplay({"127.0.0.1:8101": good, "127.0.0.1:8103": refusing})
    run = RunDir.create(tmp_path / "run")
    console = Console(file=io.StringIO(), width=120)
    outcome = await run_eval(config(0.02, prompt_tokens=None), run, ["capacity", "fill"], console,
                             transport=multi.transport())
    fill = run.read_json("fill.json")["servers"]
    assert fill["auto"]["survived"] is True
    assert good.state["served"] >= 0.02 * CLAIMED
    assert fill["auto"]["served_tokens"] // fill["auto"]["requests"] == 8192  # prompt + 1 token = max_model_len
    assert fill["int8"]["survived"] is None and "max_tokens must be at least 1" in fill["int8"]["rejected"]
    assert "int8" not in outcome.ctx.broken
    assert "not tested" in console.file.getvalue()
