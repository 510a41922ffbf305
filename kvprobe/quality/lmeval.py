"""lm-eval as kvprobe's perplexity engine: rolling loglikelihood of one server over a task in tasks/.

lm-eval (`local-completions`) does the windowing, the payloads, the parsing and the metrics; this
module only chooses its settings and schedules its requests:
- `max_length` = the server's max_model_len (lm-eval's default 2048 cuts a long passage into
  windows that lose their context);
- a tokenizer that matches the server: the server's own (/tokenizer_info + /tokenize, lm-eval's
  "remote" backend), else a local one with lm-eval's "huggingface" backend: the path servers.toml
  gives, else the model folder /v1/models `root` names when it is on this machine's disk (see
  `choose_tokenizer`); a local one is checked against the server's /tokenize (`check_match`);
- one prefix token for every server, so every server scores the very same token positions;
- every rolling window of every passage in flight at once (`num_concurrent` of them): stock
  lm-eval sends one passage's windows at a time, which leaves a server idle between passages.

It is synchronous (lm-eval is): callers run `evaluate` in a thread, one per server.
Nothing is downloaded: the task reads local JSONL and every Hugging Face library is told to stay offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe import settings
from kvprobe.corpus import TASKS_DIR
from kvprobe.errors import ConfigError, Unreadable
from kvprobe.server.untrusted import LOGPROB_MAX, logprob, number

# Before lm-eval pulls in datasets / huggingface_hub / transformers / tqdm, which read these once.
settings.set_library_defaults()

WindowCallback = Callable[[int, int], None]  # (windows done, windows in all)


# What makes a folder a tokenizer transformers can load: tokenizer.json (fast tokenizers), or
# tokenizer_config.json (which names the vocabulary file of a slow / sentencepiece one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Tokenized by a local tokenizer and by the server's /tokenize to check they are the same one: words,
# code, an indentation run and digits, which a different vocabulary or merge list splits differently.
# It is the prompt of the /tokenize captures in tests/fixtures/vllm-cpu, so tests replay real answers.
CHECK_TEXT = "The quick brown fox jumps over the lazy dog. def main():\n    return 42\n"

_FIX = "start vLLM with --enable-tokenizer-info-endpoint, or set tokenizer = \"/path/to/model\""


@dataclass(frozen=True)
class Tokenizer:
    """Which tokenizer lm-eval uses for one server."""

    backend: str  # "remote" (the server's endpoints) or "huggingface" (a local path)
    path: str | None = None
    from_root: bool = False  # the path is the model root /v1/models reports, not servers.toml's

    def describe(self) -> str:
        """How perplexity.json and the events name it."""
        if self.backend == "remote":
            return "server /tokenize"
        return f"local {self.path}" + (" (model root from /v1/models)" if self.from_root else "")

    def origin(self) -> str:
        """Where a local path came from, for error messages."""
        return "the model root /v1/models reports" if self.from_root else "tokenizer in servers.toml"


def root_tokenizer_dir(root: str | None) -> tuple[Path | None, str]:
    """The model folder /v1/models `root` names, when it is on this machine's disk and holds tokenizer
    files (a shared disk, or a server on this machine); else None and why not, for the error."""
    if not root:
        return None, "/v1/models gives no model root"
    path = Path(root)
    if not path.is_absolute():
        # A hub id (org/name), or relative to the server's working directory: no folder to find here
        # (and kvprobe never downloads).
        return None, f"its model root {root!r} (/v1/models) is not a path on this machine"
    if not path.is_dir():
        return None, f"its model root {root} (/v1/models) is not on this machine's disk"
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return None, f"its model root {root} (/v1/models) holds no {' or '.join(TOKENIZER_FILES)}"
    return path, ""


def choose_tokenizer(server: str, has_tokenizer_info: bool, path: str | None, root: str | None = None,
                     has_tokenize: bool = True) -> Tokenizer:
    """In this order: the server's own tokenizer when it offers /tokenizer_info; the path servers.toml
    gives (the operator said which: it wins); the model's own files at its /v1/models root, the very
    files the server loaded, when they are on this disk and the server's /tokenize can vouch for them
    (`check_match`). lm-eval's "remote" backend cannot run on /tokenize alone (it refuses a server
    without /tokenizer_info, and takes the prefix token from it), so there is no fourth choice."""
    if has_tokenizer_info:
        return Tokenizer("remote")
    if path:
        if not Path(path).exists():
            raise ConfigError([f"servers.toml: server {server!r}: tokenizer path {path} does not exist"])
        return Tokenizer("huggingface", path)
    found, why_not = root_tokenizer_dir(root)
    if found is not None and not has_tokenize:
        # Same path, but maybe not the same files (another machine's disk): unchecked, it could
        # score the wrong token ids without a sign. The operator can vouch for it in servers.toml.
        found, why_not = None, f"its model root {root} (/v1/models) cannot be checked (no /tokenize)"
    if found is not None:
        return Tokenizer("huggingface", str(found), from_root=True)
    raise ConfigError([
        f"{server}: no /tokenizer_info endpoint, no tokenizer path, and {why_not}: {_FIX} for {server!r} "
        f"in servers.toml"])


def check_match(server: str, tokenizer: Tokenizer, local: list[int], remote: list[int]) -> None:
    """A local tokenizer must give the server's own ids (`CHECK_TEXT` through lm-eval here and through
    the server's /tokenize): with another one lm-eval would send ids the model reads as other text,
    and the perplexity would be wrong without any error."""
    if local == remote:
        return
    pairs = enumerate(zip(local, remote, strict=False))
    first = next((i for i, (a, b) in pairs if a != b), min(len(local), len(remote)))
    raise ConfigError([
        f"{server}: the tokenizer at {tokenizer.path} ({tokenizer.origin()}) is not the server's: a probe "
        f"string is {len(local)} tokens here, {len(remote)} on its /tokenize, first different at token "
        f"{first}: {_FIX} for {server!r} in servers.toml (the tokenizer of the model it serves)"])


@dataclass(frozen=True)
class Target:
    """One server as lm-eval sees it. `headers` may hold the API key: never log or store this object."""

    name: str
    url: str
    model: str
    max_length: int
    tokenizer: Tokenizer
    num_concurrent: int = 4
    timeout_s: float = 600.0
    api_key: str | None = field(default=None, repr=False)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    prefix_token_id: int | None = None


@dataclass
class Passage:
    index: int
    id: str
    text: str


@dataclass
class DocScore:
    """lm-eval's per-document result: what word/byte perplexity are aggregated from."""

    index: int
    loglikelihood: float
    words: int
    bytes: int


@dataclass
class EvalResult:
    docs: list[DocScore]
    aggregate: dict[str, float]  # lm-eval's own word_perplexity, byte_perplexity, bits_per_byte
    seconds: float
    windows: int


def passages_digest(passages: list[Passage]) -> str:
    h = hashlib.sha256()
    for p in passages:
        h.update(p.text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def prepare() -> None:
    """Import lm-eval and what it loads lazily, once, before servers are evaluated in threads: a
    module half-imported by one thread looks complete to another (datasets then fails on
    `transformers.PreTrainedTokenizerBase` while a local tokenizer is being loaded elsewhere)."""
    import datasets  # noqa: F401
    import lm_eval  # noqa: F401
    import transformers
    from lm_eval.models import openai_completions  # noqa: F401

    _ = transformers.PreTrainedTokenizerBase, transformers.AutoTokenizer


def _task_manager(tasks_dir: Path) -> Any:
    from lm_eval.tasks import TaskManager

    # Only our folder: indexing lm-eval's thousands of built-in YAMLs takes seconds and adds nothing.
    return TaskManager(include_path=str(tasks_dir), include_defaults=False)


def task_passages(task: str, limit: int | None = None, tasks_dir: Path = TASKS_DIR) -> list[Passage]:
    """The documents lm-eval will score, in lm-eval's order (its `limit` takes the first N)."""
    prepare()
    manager = _task_manager(tasks_dir)
    try:
        obj = manager.load([task])["tasks"][task]
    except (KeyError, ValueError) as exc:
        raise ConfigError([f"perplexity.task: no lm-eval task {task!r} in {tasks_dir} ({exc})"]) from None
    docs = list(obj.eval_docs)
    if limit is not None:
        docs = docs[:limit]
    out = []
    for i, doc in enumerate(docs):
        ident = doc.get("id") if isinstance(doc, dict) else None
        out.append(Passage(i, str(ident if ident is not None else i), obj.doc_to_target(doc)))
    if not out:
        raise ConfigError([f"perplexity.task: task {task!r} has no documents"])
    return out


def check_logprobs(server: str, outputs: Any, ctxlens: list[int]) -> None:
    """Unreadable unless `outputs` has the shape lm-eval's parse_logprobs reads, with finite logprobs
    at the positions it sums (each choice's token_logprobs[ctxlen:-1])."""
    where = f"{server}: /v1/completions"
    for out in outputs if isinstance(outputs, list) else [outputs]:
        choices = out.get("choices") if isinstance(out, dict) else None
        if not isinstance(choices, list) or not all(
                isinstance(c, dict) and type(c.get("index")) is int and isinstance(c.get("logprobs"), dict)
                for c in choices):
            raise Unreadable(f"{where}: the answer has no choices with an index and logprobs", server=server)
        for choice, ctxlen in zip(sorted(choices, key=lambda c: c["index"]), ctxlens, strict=False):
            logprobs = choice["logprobs"]
            token_logprobs, top = logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
            if not isinstance(token_logprobs, list) or not isinstance(top, list):
                raise Unreadable(f"{where}: logprobs has no token_logprobs and top_logprobs lists", server=server)
            for i in range(ctxlen, len(token_logprobs) - 1):
                logprob(token_logprobs[i], f"{where} logprobs.token_logprobs[{i}]")
            # lm-eval compares each token's logprob with max(top.values()): an empty entry or a
            # string among the values is a ValueError or TypeError inside it.
            for i, entry in enumerate(top[ctxlen:-1], ctxlen):
                if not isinstance(entry, dict) or not entry:
                    raise Unreadable(f"{where}: logprobs.top_logprobs[{i}] is not an object of token logprobs",
                                     server=server)
                for token, value in entry.items():
                    logprob(value, f"{where} logprobs.top_logprobs[{i}][{token[:40]!r}]")


def _model_class() -> type:
    """Built on first use, so importing kvprobe never imports lm-eval."""
    global _MODEL_CLASS
    if _MODEL_CLASS is not None:
        return _MODEL_CLASS
    from lm_eval import utils as lm_utils
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    class KvprobeCompletions(LocalCompletionsAPI):
        """lm-eval's local-completions with all windows of all passages scheduled together."""

        def __init__(self, *, on_window: WindowCallback | None = None, server: str = "server", **kwargs: Any):
            super().__init__(**kwargs)
            self.on_window = on_window
            self.server = server
            self.windows_sent = 0

        def parse_logprobs(self, outputs: Any, tokens: Any = None, ctxlens: list[int] | None = None,
                           **kwargs: Any) -> list[tuple[float, bool]]:
            """lm-eval's own reading, once what it sums is checked: a NaN logprob would give a NaN
            perplexity, a string one a TypeError deep in lm-eval."""
            check_logprobs(self.server, outputs, ctxlens or [])
            return super().parse_logprobs(outputs, tokens, ctxlens, **kwargs)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            windows: list[tuple[None, list[int], list[int]]] = []
            owners: list[int] = []
            for i, request in enumerate(requests):
                (string,) = request.args
                rolling = lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 1, context_len=1)
                for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                    windows.append((None, context, continuation))
                    owners.append(i)
            inputs, ctxlens, _ = self.batch_loglikelihood_requests([windows])
            self.windows_sent = len(inputs)
            scores = asyncio.run(self._score_all(inputs, ctxlens))
            per_doc: list[list[float]] = [[] for _ in requests]
            for owner, (loglikelihood, _greedy) in zip(owners, scores, strict=True):
                per_doc[owner].append(loglikelihood)
            totals = [sum(parts) for parts in per_doc]  # window order, as lm-eval sums them
            for request, total in zip(requests, totals, strict=True):
                self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
            return totals

        async def _score_all(self, inputs: list[list[int]], ctxlens: list[int]) -> list[tuple[float, bool]]:
            from aiohttp import ClientSession, ClientTimeout, TCPConnector
            from tenacity import retry, stop_after_attempt, wait_exponential

            call = retry(stop=stop_after_attempt(self.max_retries), reraise=True,
                         wait=wait_exponential(multiplier=0.5, min=1, max=10))(self.amodel_call)
            sem = asyncio.Semaphore(self._concurrent)
            done = 0

            async def one(session: ClientSession, inp: list[int], ctxlen: int) -> tuple[float, bool]:
                nonlocal done
                (score,) = await call(session=session, sem=sem, messages=[inp], generate=False, ctxlens=[ctxlen])
                done += 1
                if self.on_window:
                    self.on_window(done, len(inputs))
                return score

            # Longest first, as lm-eval orders them: the long prefills start while short ones fill gaps.
            order = sorted(range(len(inputs)), key=lambda k: -len(inputs[k]))
            async with ClientSession(connector=TCPConnector(limit=self._concurrent, ssl=self.verify_certificate),
                                     timeout=ClientTimeout(total=self.timeout)) as session:
                results = await asyncio.gather(*(one(session, inputs[k], ctxlens[k]) for k in order))
            scores: list[tuple[float, bool]] = [(0.0, False)] * len(inputs)
            for k, score in zip(order, results, strict=True):
                scores[k] = score
            return scores

    _MODEL_CLASS = KvprobeCompletions
    return _MODEL_CLASS


_MODEL_CLASS: type | None = None


def make_model(target: Target, on_window: WindowCallback | None = None) -> Any:
    """An lm-eval LM for one server (talks to the server: /tokenizer_info with the remote backend)."""
    kwargs: dict[str, Any] = {
        "base_url": f"{target.url}/v1/completions",
        "model": target.model,
        "tokenizer_backend": target.tokenizer.backend,
        "max_length": target.max_length,
        "num_concurrent": target.num_concurrent,
        "timeout": int(target.timeout_s),
        "tokenized_requests": True,
        # A non-empty header dict stops lm-eval from sending $OPENAI_API_KEY to our servers.
        "header": {"Content-Type": "application/json", **target.headers}
        | ({"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}),
        "auth_token": target.api_key,
        "custom_prefix_token_id": target.prefix_token_id,
        "on_window": on_window,
        "server": target.name,
    }
    if target.tokenizer.backend == "huggingface":
        kwargs["tokenizer"] = target.tokenizer.path
    return _model_class()(**kwargs)


def encode(target: Target, text: str) -> list[int]:
    """`text` as lm-eval encodes a passage for this server (its tok_encode: no special tokens).
    Needs no server with a local tokenizer."""
    prepare()
    return make_model(target).tok_encode(text)


def tokenize(target: Target, passages: list[Passage]) -> tuple[int, list[list[int]]]:
    """lm-eval's prefix token and the token ids of each passage, as lm-eval will score them."""
    lm = make_model(target)
    return lm.prefix_token_id, [lm.tok_encode(p.text) for p in passages]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """lm-eval logs every setting at INFO, warns about our custom dataset, and logs a failed request
    with the repr of aiohttp's error, which carries the request headers (the API key). kvprobe
    reports failures itself, in one line without headers, so lm-eval's log stays shut."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def evaluate(target: Target, task: str, limit: int | None, on_window: WindowCallback | None = None,
             tasks_dir: Path = TASKS_DIR) -> EvalResult:
    """One full lm-eval run of `task` on one server, with per-document loglikelihoods."""
    import lm_eval
    from lm_eval.api.task import ConfigurableTask

    t0 = time.perf_counter()
    lm = make_model(target, on_window)
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=_task_manager(tasks_dir), limit=limit,
                                  log_samples=True, bootstrap_iters=0)
    seconds = time.perf_counter() - t0
    docs = []
    for sample in sorted(out["samples"][task], key=lambda s: s["doc_id"]):
        resp = sample["filtered_resps"][0]
        loglikelihood = number(resp[0] if isinstance(resp, list | tuple) else resp,
                               f"{target.name}: passage {sample['doc_id']} log-likelihood", maximum=LOGPROB_MAX)
        target_text = sample["target"]
        words = sample["word_perplexity"][1] if "word_perplexity" in sample else \
            ConfigurableTask.count_words(target_text)
        nbytes = sample["byte_perplexity"][1] if "byte_perplexity" in sample else \
            ConfigurableTask.count_bytes(target_text)
        docs.append(DocScore(int(sample["doc_id"]), loglikelihood, int(words), int(nbytes)))
    metrics = out["results"][task]
    aggregate = {k.split(",")[0]: float(v) for k, v in metrics.items()
                 if k.split(",")[0] in ("word_perplexity", "byte_perplexity", "bits_per_byte")}
    return EvalResult(docs, aggregate, seconds, lm.windows_sent)
