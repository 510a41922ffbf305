"""lm-eval as kvprobe's task-accuracy engine: any lm-eval task on one server, per-sample scores kept.

Each task goes through the lm-eval model its requests need: `local-chat-completions` (through the
server's own chat template) for generate_until, `local-completions` with the server's tokenizer
(kvprobe.quality.lmeval) for loglikelihood and multiple choice. Every server gets identical
requests: greedy, no seed, and generate_until answers capped at `max_gen_toks` (1024 by default, so a
reasoning model has room to think and then answer). A chat answer the cap cut (finish_reason
"length") is marked truncated: the probe counts it apart, never as a wrong answer.

Synchronous, like lm-eval: callers run `evaluate_task` in a thread, one per server.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvprobe import settings
from kvprobe.disk import json_digest
from kvprobe.errors import ConfigError, Unreadable, one_line
from kvprobe.quality import lmeval  # also puts every Hugging Face library offline
from kvprobe.server.untrusted import number

GENERATE = "generate_until"
SCORED = ("loglikelihood", "multiple_choice", GENERATE)


@dataclass(frozen=True)
class TaskInfo:
    """What kvprobe needs to know of a task before it asks any server."""

    name: str
    output_type: str
    metric: str
    higher_is_better: bool
    documents: int  # after `limit`
    digest: str  # of those documents: a rerun resumes only a task whose documents are unchanged

    @property
    def chat(self) -> bool:
        return self.output_type == GENERATE


@dataclass(frozen=True)
class SampleRow:
    """One document's result on one server."""

    doc: int
    score: float
    truncated: bool = False
    finish_reason: str | None = None
    answer: str = ""  # the filtered answer, cut to ANSWER_CHARS for the record


ANSWER_CHARS = 200


def task_manager(tasks_dir: Path, registry: bool) -> Any:
    from lm_eval.tasks import TaskManager

    # lm-eval's own registry only when asked: indexing its thousands of YAMLs takes seconds.
    return TaskManager(include_path=str(tasks_dir), include_defaults=registry)


@functools.cache
def load_task(task: str, tasks_dir: Path, registry: bool, metric: str | None, limit: int | None) -> TaskInfo:
    """Cached: eval checks each task before any server is asked (preflight), then the probe uses it.
    The task's output type and the metric the bar is on (its first, unless servers.toml names one);
    ConfigError when the task is unknown, has no documents, or is of a kind kvprobe cannot pair."""
    lmeval.prepare()
    where = f"tasks: {task!r}"
    try:
        with lmeval.quiet():
            obj = task_manager(tasks_dir, registry).load([task])["tasks"][task]
    except (KeyError, ValueError) as exc:
        more = "" if registry else " (set [tasks] registry = true for lm-eval's own tasks)"
        raise ConfigError([f"{where}: no such lm-eval task in {tasks_dir}{more}: {one_line(exc, 200)}"]) from None
    except Exception as exc:  # a dataset that is not on disk, a broken YAML: lm-eval's own error, one line
        raise ConfigError([f"{where}: lm-eval cannot load it: {one_line(exc, 200)}"]) from None
    kind = obj.config.output_type
    if kind not in SCORED:
        raise ConfigError([f"{where}: output_type {kind} has no per-sample accuracy: give a generate_until, "
                           "loglikelihood or multiple_choice task"])
    metrics = list(obj.higher_is_better())
    if not metrics:
        raise ConfigError([f"{where}: the task has no metrics"])
    chosen = metric or metrics[0]
    if chosen not in metrics:
        raise ConfigError([f"{where}: metric {chosen!r} is not one of its metrics ({', '.join(metrics)})"])
    docs = list(obj.eval_docs)[:limit]
    if not docs:
        raise ConfigError([f"{where}: the task has no documents"])
    digest = json_digest(docs, 16, default=str)
    return TaskInfo(task, kind, chosen, bool(obj.higher_is_better()[chosen]), len(docs), digest)


def prompt_key(messages: Any) -> str:
    """The same chat prompt gives the same key, whether seen as the payload or as lm-eval's sample."""
    return json_digest(messages, 16)


# The prompt of the request being answered, per asyncio task: lm-eval builds a request's payload
# and parses its answer in the same task, so parse_generations can say which prompt was cut.
_PROMPT: contextvars.ContextVar[str] = contextvars.ContextVar("kvprobe_prompt", default="")


def _chat_class() -> type:
    global _CHAT_CLASS
    if _CHAT_CLASS is not None:
        return _CHAT_CLASS
    from lm_eval.models.openai_completions import LocalChatCompletion

    class KvprobeChat(LocalChatCompletion):
        """local-chat-completions that records each answer's finish_reason and sends no seed."""

        def __init__(self, *, server: str = "server", on_answer: Callable[[], None] | None = None,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.server = server
            self.on_answer = on_answer
            self.finish: dict[str, str | None] = {}

        def _create_payload(self, messages: Any, generate: bool = False, gen_kwargs: dict | None = None,
                            seed: int = 1234, eos: Any = None, **kwargs: Any) -> dict:
            payload = super()._create_payload(messages, generate=generate, gen_kwargs=gen_kwargs, seed=seed,
                                              eos=eos, **kwargs)
            # Greedy needs no seed, and a seeded request takes vLLM's per-request sampler path.
            payload.pop("seed", None)
            _PROMPT.set(prompt_key(payload["messages"]))
            return payload

        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
            outs = outputs if isinstance(outputs, list) else [outputs]
            texts: list[str] = []
            for out in outs:
                choices = out.get("choices") if isinstance(out, dict) else None
                if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                    raise Unreadable(f"{self.server}: /v1/chat/completions: the answer has no choices",
                                     server=self.server)
                choice = choices[0]
                message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
                content = message.get("content")
                reason = choice.get("finish_reason")
                self.finish[_PROMPT.get()] = reason if isinstance(reason, str) else None
                # No content (the cap fell inside the reasoning) is an empty answer, not lm-eval's placeholder.
                texts.append(content if isinstance(content, str) else "")
                if self.on_answer:
                    self.on_answer()
            return texts

    _CHAT_CLASS = KvprobeChat
    return _CHAT_CLASS


_CHAT_CLASS: type | None = None


def make_chat_model(target: lmeval.Target, on_answer: Callable[[], None] | None = None) -> Any:
    kwargs: dict[str, Any] = {
        "base_url": f"{target.url}/v1/chat/completions",
        "model": target.model,
        "tokenizer_backend": None,
        "tokenized_requests": False,
        "num_concurrent": target.num_concurrent,
        "timeout": int(target.timeout_s),
        "header": {"Content-Type": "application/json", **target.headers} | settings.auth_header(target.api_key),
        "auth_token": target.api_key,
        "server": target.name,
        "on_answer": on_answer,
    }
    return _chat_class()(**kwargs)


def _sample_prompt(sample: dict[str, Any]) -> str:
    """The key of a chat sample's prompt: lm-eval logs the request's args, whose first item holds
    the JSON of the messages (a JsonChatStr, or the tuple it was turned into)."""
    context: Any = sample.get("arguments")
    while isinstance(context, list | tuple) and context and not isinstance(context, str):
        context = getattr(context, "prompt", None) or context[0]
    try:
        return prompt_key(orjson.loads(context)) if isinstance(context, str) else ""
    except orjson.JSONDecodeError:
        return ""


def _answer(sample: dict[str, Any]) -> str:
    resp = sample.get("filtered_resps")
    while isinstance(resp, list | tuple) and resp:
        resp = resp[0]
    return str(resp)[:ANSWER_CHARS] if resp is not None else ""


def evaluate_task(target: lmeval.Target, info: TaskInfo, limit: int | None, max_gen_toks: int,
                  tasks_dir: Path, registry: bool,
                  on_answer: Callable[[], None] | None = None) -> tuple[list[SampleRow], float]:
    """One lm-eval run of one task on one server: each document's score (the chosen metric) and, for
    a chat task, whether the cap cut its answer; and the seconds it took."""
    t0 = time.perf_counter()
    if info.chat:
        lm = make_chat_model(target, on_answer)
        extra: dict[str, Any] = {"apply_chat_template": True,
                                 "gen_kwargs": {"max_gen_toks": max_gen_toks, "temperature": 0, "do_sample": False}}
    else:
        lm = lmeval.make_model(target)
        extra = {}
    with lmeval.quiet():
        out = lmeval.simple_evaluate(model=lm, tasks=[info.name], task_manager=task_manager(tasks_dir, registry),
                                     limit=limit, log_samples=True, bootstrap_iters=0, **extra)
    rows = []
    for sample in sorted(out["samples"][info.name], key=lambda s: s["doc_id"]):
        doc = int(sample["doc_id"])
        score = number(sample.get(info.metric), f"{target.name}: {info.name} document {doc} {info.metric}")
        reason = lm.finish.get(_sample_prompt(sample)) if info.chat else None
        rows.append(SampleRow(doc, score, truncated=reason == "length", finish_reason=reason, answer=_answer(sample)))
    return rows, time.perf_counter() - t0
