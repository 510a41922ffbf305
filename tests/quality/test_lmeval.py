"""The lm-eval adapter without a server: windows, scheduling, per-document rows, tokenizer choice.

The HTTP layer of lm-eval (aiohttp) is replaced by a scorer that gives every predicted token a
logprob of -1, so every number that comes back is known in advance.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from replay import Replay, capture

from kvprobe.errors import ConfigError
from kvprobe.quality import lmeval
from kvprobe.quality.passages import rolling_windows
from kvprobe.server.client import Client
from kvprobe.testbed import NEEDLE_LLAMA

TOKENIZER = lmeval.Tokenizer("huggingface", str(NEEDLE_LLAMA))


class FakeScorer:
    """Stands in for TemplateAPI.amodel_call: records each request, scores -1 per predicted token."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[int], int]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, session: Any, sem: Any, messages: list[list[int]], *, generate: bool,
                       ctxlens: list[int], **_: Any) -> list[tuple[float, bool]]:
        import asyncio

        async with sem:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            await asyncio.sleep(0.001)
            self.in_flight -= 1
        (tokens,) = messages
        (ctxlen,) = ctxlens
        self.requests.append((tokens, ctxlen))
        # lm-eval scores token_logprobs[ctxlen:-1] of the echoed prompt plus one generated token.
        return [(-1.0 * (len(tokens) - ctxlen), False)]


@pytest.fixture
def scorer(monkeypatch: pytest.MonkeyPatch) -> FakeScorer:
    fake = FakeScorer()
    monkeypatch.setattr(lmeval._model_class(), "amodel_call", fake)
    return fake


def _target(max_length: int, **kw: Any) -> lmeval.Target:
    kw.setdefault("tokenizer", TOKENIZER)
    return lmeval.Target(name="t", url="http://127.0.0.1:9", model="needle-llama", max_length=max_length,
                         num_concurrent=3, **kw)


def _requests(texts: list[str]) -> list[Any]:
    from lm_eval.api.instance import Instance

    return [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]


def test_long_passage_is_scored_in_windows_every_token_once(scorer: FakeScorer):
    passages = lmeval.task_passages("kvprobe_ppl", limit=3)
    lm = lmeval.make_model(_target(1024))
    n_tokens = [len(lm.tok_encode(p.text)) for p in passages]
    totals = lm.loglikelihood_rolling(_requests([p.text for p in passages]))
    # Every token of every passage scored exactly once, even though each is longer than a request.
    assert totals == [-float(n) for n in n_tokens]
    expected_windows = sum(len(rolling_windows(n, 1024)) for n in n_tokens)
    assert len(scorer.requests) == lm.windows_sent == expected_windows > len(passages)
    assert all(len(tokens) <= 1024 - 1 for tokens, _ in scorer.requests)  # + 1 generated token fits
    # Windows of different passages were in flight together, never more than num_concurrent.
    assert 1 < scorer.max_in_flight <= 3


def test_prefix_token_is_the_one_we_set(scorer: FakeScorer):
    lm = lmeval.make_model(_target(8192, prefix_token_id=2))
    assert lm.prefix_token_id == 2
    lm.loglikelihood_rolling(_requests(["hello world, hello kvprobe"]))
    (tokens, ctxlen), = scorer.requests
    assert tokens[0] == 2 and ctxlen == 1


def test_evaluate_returns_per_document_rows_and_lm_eval_aggregates(scorer: FakeScorer):
    """The whole lm-eval path (task YAML, local dataset, simple_evaluate, logged samples), offline."""
    calls: list[tuple[int, int]] = []
    with lmeval.quiet():
        result = lmeval.evaluate(_target(8192), "kvprobe_ppl", 2, on_window=lambda d, t: calls.append((d, t)))
    passages = lmeval.task_passages("kvprobe_ppl", limit=2)
    lm = lmeval.make_model(_target(8192))
    n_tokens = [len(lm.tok_encode(p.text)) for p in passages]
    assert [d.index for d in result.docs] == [0, 1]
    assert [d.loglikelihood for d in result.docs] == [-float(n) for n in n_tokens]
    assert [d.bytes for d in result.docs] == [len(p.text.encode()) for p in passages]
    assert [d.words for d in result.docs] == [len(re.split(r"\s+", p.text)) for p in passages]  # lm-eval's count
    nbytes = sum(d.bytes for d in result.docs)
    assert result.aggregate["bits_per_byte"] == pytest.approx(sum(n_tokens) / nbytes / math.log(2))
    assert result.windows == 2 and calls[-1] == (2, 2)


def test_passages_digest_changes_with_the_text():
    a = lmeval.task_passages("kvprobe_ppl", limit=2)
    b = [lmeval.Passage(p.index, p.id, p.text + " ") for p in a]
    assert lmeval.passages_digest(a) != lmeval.passages_digest(b)


def test_unknown_task_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"perplexity\.task: no lm-eval task 'nope'"):
        lmeval.task_passages("nope")


def test_tokenizer_choice():
    assert lmeval.choose_tokenizer("a", True, None) == lmeval.Tokenizer("remote")
    assert lmeval.choose_tokenizer("a", False, str(NEEDLE_LLAMA)) == TOKENIZER
    with pytest.raises(ConfigError) as err:
        lmeval.choose_tokenizer("fp8", False, None)
    (line,) = err.value.problems
    assert "--enable-tokenizer-info-endpoint" in line and "tokenizer = " in line and "'fp8'" in line
    with pytest.raises(ConfigError, match="does not exist"):
        lmeval.choose_tokenizer("fp8", False, "/no/such/tokenizer")


def test_no_tokenizer_info_uses_the_model_root_on_disk():
    """vLLM's default (no --enable-tokenizer-info-endpoint): the files the server loaded, at its root."""
    chosen = lmeval.choose_tokenizer("fp8", False, None, str(NEEDLE_LLAMA))
    assert chosen == lmeval.Tokenizer("huggingface", str(NEEDLE_LLAMA), from_root=True)
    assert chosen.describe() == f"local {NEEDLE_LLAMA} (model root from /v1/models)"
    # The server's own tokenizer still comes first when it is offered.
    assert lmeval.choose_tokenizer("fp8", True, None, str(NEEDLE_LLAMA)) == lmeval.Tokenizer("remote")


def test_explicit_tokenizer_path_wins_over_the_model_root(tmp_path: Path):
    assert lmeval.choose_tokenizer("fp8", False, str(NEEDLE_LLAMA), str(tmp_path)) == TOKENIZER
    assert TOKENIZER.describe() == f"local {NEEDLE_LLAMA}"
    # A wrong explicit path is its own error, even with a usable root: the operator's word is not overridden.
    with pytest.raises(ConfigError) as err:
        lmeval.choose_tokenizer("fp8", False, "/no/such/tokenizer", str(NEEDLE_LLAMA))
    assert err.value.problems == ["servers.toml: server 'fp8': tokenizer path /no/such/tokenizer does not exist"]


@pytest.mark.parametrize(("root", "why"), [
    ("/models/tiny-llama-elsewhere", "its model root /models/tiny-llama-elsewhere (/v1/models) is not on this "
                                     "machine's disk"),
    ("org/tiny-llama", "its model root 'org/tiny-llama' (/v1/models) is not a path on this machine"),
    (None, "/v1/models gives no model root"),
])
def test_root_not_on_disk_is_one_line_naming_the_server_the_root_and_the_fix(root: str | None, why: str):
    with pytest.raises(ConfigError) as err:
        lmeval.choose_tokenizer("fp8", False, None, root)
    (line,) = err.value.problems
    assert line.startswith("fp8: no /tokenizer_info endpoint, no tokenizer path, and ")
    assert why in line
    assert "--enable-tokenizer-info-endpoint" in line and "tokenizer = \"/path/to/model\" for 'fp8'" in line
    assert line.endswith("in servers.toml")


def test_root_without_tokenizer_files_or_unchecked_is_not_used(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")  # weights and config, but no tokenizer
    with pytest.raises(ConfigError, match=r"fp8: .*holds no tokenizer\.json or tokenizer_config\.json"):
        lmeval.choose_tokenizer("fp8", False, None, str(tmp_path))
    # Without /tokenize nothing can vouch that the same path holds the same files here.
    with pytest.raises(ConfigError, match=r"fp8: .*cannot be checked \(no /tokenize\)"):
        lmeval.choose_tokenizer("fp8", False, None, str(NEEDLE_LLAMA), has_tokenize=False)
    # The operator's path is used as before on such a server.
    assert lmeval.choose_tokenizer("fp8", False, str(NEEDLE_LLAMA), None, has_tokenize=False) == TOKENIZER


def test_local_encoding_is_the_servers_on_the_check_text():
    """needle-llama's tokenizer gives exactly what real vLLM's /tokenize answered for CHECK_TEXT."""
    request = json.loads(capture("auto-8101", "tokenize_prompt_nospecial.request"))["body"]
    assert request["prompt"] == lmeval.CHECK_TEXT and request["add_special_tokens"] is False
    served = json.loads(capture("auto-8101", "tokenize_prompt_nospecial"))["tokens"]
    root = lmeval.Tokenizer("huggingface", str(NEEDLE_LLAMA), from_root=True)
    local = lmeval.encode(_target(8192, tokenizer=root), lmeval.CHECK_TEXT)
    assert local == served
    lmeval.check_match("fp8", root, local, served)  # no error


def test_mismatch_is_one_line_naming_the_server_and_the_tokenizer():
    root = lmeval.Tokenizer("huggingface", "/models/other", from_root=True)
    with pytest.raises(ConfigError) as err:
        lmeval.check_match("fp8", root, [1, 2, 3, 4], [1, 2, 9])
    (line,) = err.value.problems
    assert line.startswith("fp8: the tokenizer at /models/other (the model root /v1/models reports) is not the "
                           "server's: a probe string is 4 tokens here, 3 on its /tokenize, first different at token 2")
    assert "--enable-tokenizer-info-endpoint" in line and "for 'fp8' in servers.toml" in line
    with pytest.raises(ConfigError, match=r"fp8: the tokenizer at /t \(tokenizer in servers.toml\).*at token 2"):
        lmeval.check_match("fp8", lmeval.Tokenizer("huggingface", "/t"), [1, 2], [1, 2, 3])


async def test_tokenizer_info_absent_is_none_present_is_a_dict():
    replay = Replay()  # the captures were taken without --enable-tokenizer-info-endpoint: 404
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport()) as client:
        assert await client.tokenizer_info() is None
    replay.routes[("GET", "/tokenizer_info")] = lambda r: httpx.Response(
        200, json={"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    async with Client("auto", "http://127.0.0.1:8101", transport=replay.transport()) as client:
        assert (await client.tokenizer_info())["eos_token"] == "<|im_end|>"


def test_secrets_stay_out_of_the_target_repr():
    target = _target(8192, api_key="sk-very-secret", headers={"X-Team": "a"})
    assert "sk-very-secret" not in repr(target)


def test_no_git_noise_outside_a_git_checkout(scorer: FakeScorer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    """lm-eval runs `git describe` in the working directory for every task it evaluates; outside a checkout (the
    project copied to a GPU host without .git) git printed `fatal: not a git repository` on the terminal, once
    per server. The perplexity path, run from such a directory (two servers at once, as the probe runs them),
    prints none of it, and lm-eval's own lookup is back afterwards."""
    from lm_eval import evaluator

    if shutil.which("git") is None:
        pytest.skip("no git on this machine: lm-eval's lookup cannot print anything")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git looks no higher than tmp_path
    monkeypatch.chdir(tmp_path)
    bare = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True)
    assert "not a git repository" in bare.stderr  # what lm-eval's subprocess would print here
    own = evaluator.get_git_commit_hash
    lmeval.prepare()  # as the probe does before its threads: lm-eval's lazy imports, once
    capfd.readouterr()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: lmeval.evaluate(_target(8192), "kvprobe_ppl", 1), range(2)))
    err = capfd.readouterr().err
    assert "fatal: not a git repository" not in err and "not a git repository" not in err
    assert [len(r.docs) for r in results] == [1, 1]
    assert evaluator.get_git_commit_hash is own
