"""Agreement probe pieces with replayed vLLM answers: windows, the logprobs cap, summaries, bars."""

from __future__ import annotations

import json

import httpx
import pytest
from replay import Replay, capture

from kvprobe.errors import ConfigError
from kvprobe.probes.agreement import fetch_positions, summarise_server
from kvprobe.quality.divergence import Comparison
from kvprobe.server.client import Client


def _echo_prompt_logprobs(requests: list[list[int]]):
    """A /v1/completions that answers like vLLM (shape from the real capture): null for the first
    prompt token, then {token_id: {logprob, rank, decoded_token}} per position."""
    real = json.loads(capture("auto-8101", "completions_prompt_logprobs1_max1"))

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = body["prompt"]
        requests.append(prompt)
        entries = [None] + [{str(t): {"logprob": -1.0, "rank": 1, "decoded_token": "x"}} for t in prompt[1:]]
        choice = {**real["choices"][0], "prompt_logprobs": entries}
        return httpx.Response(200, json={**real, "choices": [choice]})

    return handler


async def test_a_passage_too_long_for_one_request_is_fetched_in_windows():
    sent: list[list[int]] = []
    replay = Replay()
    replay.routes[("POST", "/v1/completions")] = _echo_prompt_logprobs(sent)
    ids = list(range(100, 100 + 2500))
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport()) as client:
        positions = await fetch_positions(client, prefix=2, ids=ids, max_model_len=1024, top_k=20)
    assert len(positions) == len(ids)  # one per passage token: none lost, none doubled
    assert [len(p) for p in sent] == [1023, 1023, 457]  # prefix + window; + 1 generated token fits
    assert all(p[0] == 2 for p in sent)
    assert [t for p in sent for t in p[1:]] == ids
    assert all(isinstance(p, dict) for p in positions)


async def test_top_k_over_the_server_cap_is_a_config_error():
    replay = Replay()
    replay.routes[("POST", "/v1/completions")] = lambda r: httpx.Response(
        400, content=capture("extra-probes-8101", "logprobs_21"), headers={"content-type": "application/json"})
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport()) as client:
        with pytest.raises(ConfigError) as err:
            await fetch_positions(client, prefix=2, ids=[5, 6, 7], max_model_len=8192, top_k=21)
    (line,) = err.value.problems
    assert "max allowed: 20" in line and "agreement.top_k" in line


def test_summary_pools_positions_over_passages_and_keeps_per_passage_sums():
    docs = [Comparison([0.0, 0.1, 0.2], [True, True, False], [0.0, 0.5, 1.0]),
            Comparison([0.3], [False], [2.0])]
    s = summarise_server(docs)
    assert s["positions"] == 4 and s["passages"] == 2
    assert s["kl_mean"] == pytest.approx(0.15) and s["kl_median"] == pytest.approx(0.15)
    assert s["kl_max"] == pytest.approx(0.3) and s["top1_agreement"] == 0.5
    assert s["logprob_diff_max"] == 2.0 and s["logprob_diff_median"] == pytest.approx(0.75)
    assert s["kl_p99"] == pytest.approx(0.297)
    # what the checks judge from (a t interval over passages), and nothing judged here
    assert s["passage_kl_sum"] == pytest.approx([0.3, 0.3]) and s["passage_top1_sum"] == [2.0, 0.0]
    assert s["passage_positions"] == [3, 1]
    assert not any(k.endswith("ci95") or k == "outcome" for k in s)
