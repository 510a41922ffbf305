"""Perplexity against a real vLLM server started as operators start it: without
--enable-tokenizer-info-endpoint (vLLM's default), so /tokenizer_info answers 404 and lm-eval's
"remote" tokenizer cannot be used. The server runs on this machine, so its /v1/models `root` (the
launcher's staged copy of needle-llama) is on this disk: kvprobe loads those files with lm-eval's
"huggingface" backend after checking them against the server's /tokenize. Reference and candidate
are the same server: the comparison itself must come out at zero."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.errors import EXIT_OK
from kvprobe.evaluate.orchestrate import run_eval_sync
from kvprobe.quality import lmeval
from kvprobe.run.store import RunDir
from kvprobe.testbed import LocalServer, ServerSpec, start, stop
from kvprobe.testbed.launcher import free_port

pytestmark = pytest.mark.integration

NAMES = ("reference", "candidate")


@pytest.fixture(scope="module")
def default_server() -> Iterator[LocalServer]:
    spec = ServerSpec(port=free_port(), tokenizer_info=False)
    try:
        yield start(spec, reuse=False)
    finally:
        stop(spec.port)  # also after a failed start: nothing is left running on the port


def _tokens(url: str, text: str) -> list[int]:
    """The server's own ids for `text`, as lm-eval asks for them (no special tokens)."""
    body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
    request = urllib.request.Request(f"{url}/tokenize", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())["tokens"]


def test_perplexity_on_a_server_without_tokenizer_info(default_server: LocalServer, tmp_path: Path) -> None:
    url = default_server.url
    # The situation under test: the endpoint really is off.
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{url}/tokenizer_info", timeout=30)
    assert err.value.code == 404

    config = parse_config({"server": [{"name": "reference", "url": url, "role": "reference"},
                                      {"name": "candidate", "url": url}],
                           "perplexity": {"limit": 2}})
    run = RunDir.create(tmp_path / "run")
    outcome = run_eval_sync(config, run, ["perplexity"], Console(stderr=True, width=160))
    assert outcome.exit_code == EXIT_OK, outcome.messages
    assert outcome.ctx.broken == {}

    root = outcome.ctx.inventories["reference"].model_root
    assert root and Path(root).is_dir()
    described = f"local {root} (model root from /v1/models)"
    ppl = run.read_json("perplexity.json")
    assert ppl["tokenizers"] == dict.fromkeys(NAMES, described)
    assert {e["tokenizer"] for e in run.events("perplexity_run")} == {described}
    assert len(ppl["passages"]) == 2

    # The local files gave the server's own ids: every passage has as many tokens as its /tokenize says.
    passages = lmeval.task_passages(config.perplexity.task, limit=2)
    assert [p["tokens"] for p in ppl["passages"]] == [len(_tokens(url, p.text)) for p in passages]

    for name in NAMES:
        entry = ppl["servers"][name]
        assert entry["bits_per_byte"] > 0 and entry["bits_per_byte"] == pytest.approx(
            entry["lm_eval"]["bits_per_byte"], rel=1e-12)
    # One server against itself: zero up to how concurrent requests were cut into prefill chunks.
    verdict = run.read_json("verdict.json")
    check = next(c for c in verdict["decisions"]["candidate"]["checks"] if c["id"] == "perplexity.delta")
    assert abs(check["value"]) < 1e-3  # 2 passages: too few to pass the bar, whatever the delta
    assert check["outcome"] == "inconclusive" and "2 passages: a pass needs at least 8" in check["text"]
