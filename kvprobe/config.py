"""servers.toml: schema, defaults and validation (one clear line per problem)."""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvprobe import settings
from kvprobe.errors import ConfigError

# Header names that carry credentials: those belong in the environment (api_key_env), not in a file.
_SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
# Keys someone writes a credential under: refused with the environment advice, the value never shown.
_SECRET_KEYS = {"api_key", "apikey", "key", "token", "api_token", "access_token", "bearer", "bearer_token",
                "password", "secret", "authorization"}

# Bars that are fractions, a relative change or a share of answers, with the sign a loss reads with: 5 is
# +500%, not the 5% its author meant, and a bar that loose passes anything. From servers.toml, one over
# LARGE_BAR needs allow_large_bars = true, or the unit spelled out ("500%").
FRACTION_BARS = {"perplexity_delta_max": "+", "capacity_gain_min": "+", "throughput_drop_max": "-",
                 "p99_latency_rise_max": "+", "needle_recall_drop_max": "-", "truncation_rise_max": "+",
                 "task_accuracy_drop_max": "-"}
LARGE_BAR = 0.5
_PERCENT = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%")
# parse_config validates with this context: only a bar as an operator wrote it is held to LARGE_BAR (a
# verdict's recorded bars are validated again by `kvprobe verify`, without it).
_WRITTEN = {"written": True}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _fraction(value: Any, sign: str | None, written: bool, member: str = "") -> Any:
    """A bar's value: "5%" is 0.05; a bare number over LARGE_BAR is refused when `written` (`sign` set:
    a fraction bar, without allow_large_bars). `member`: the task, in a table of per-task bars."""
    if isinstance(value, str) and (match := _PERCENT.fullmatch(value.strip())):
        return float(match[1]) / 100
    large = isinstance(value, int | float) and not isinstance(value, bool) and value > LARGE_BAR
    if written and sign and large:
        key = f"{member} " if member else ""
        raise ValueError(f"{key}= {value:g} reads as {sign}{value:.0%}: write {value / 100:g} for {value:g}%, "
                         "or set allow_large_bars = true")
    return value


class Bars(_Strict):
    """Acceptance bars, fixed before any number comes in; stored in the verdict."""

    # First, so the bars' validator sees it. Not stored: the verdict records the bars' values themselves.
    allow_large_bars: bool = Field(False, exclude=True, description="let a fraction bar be over 0.5 (50%) as a "
                                   "bare number; \"60%\" needs no permission")
    perplexity_delta_max: float = Field(0.01, ge=0, description="relative perplexity rise, candidate vs reference")
    needle_recall_drop_max: float = Field(
        0.10, ge=0, le=1, description="needle recall drop (absolute). A pass needs about ln(0.025) / ln(1 - bar) "
        "scored needles even when none is lost (35 for 0.10, 72 for 0.05): size needle.count with it. A bar of "
        "0 can only fail or be inconclusive")
    truncation_rise_max: float = Field(
        0.10, ge=0, le=1, description="rise in the share of answers cut at the answer cap (needles and each "
        "task), candidate vs reference on the same cases")
    capacity_gain_min: float = Field(0.05, ge=0, description="below this a candidate frees nothing")
    throughput_drop_max: float = Field(0.05, ge=0, le=1, description="relative output-token throughput drop")
    p99_latency_rise_max: float = Field(0.10, ge=0, description="relative p99 latency rise")
    kl_mean_max: float | None = Field(None, ge=0, description="optional bar on mean KL divergence (nats)")
    task_accuracy_drop_max: float | dict[str, float] = Field(
        0.10, description="task accuracy drop (absolute, in the task's metric): one bar for every task, or "
        "a table of task name -> bar, with `default` for the tasks it does not name. As for needles, a 0/1 "
        "score needs about ln(0.025) / ln(1 - bar) documents to pass (35 for 0.10, 72 for 0.05, 183 for "
        "0.02); the shipped kvprobe_qa has 40")
    top1_agreement_min: float | None = Field(None, ge=0, le=1, description="optional bar on top-1 agreement")


    @field_validator(*FRACTION_BARS, "top1_agreement_min", mode="before")
    @classmethod
    def _as_written(cls, value: Any, info: ValidationInfo) -> Any:
        sign = FRACTION_BARS.get(info.field_name or "") if not info.data.get("allow_large_bars") else None
        written = bool((info.context or {}).get("written"))
        if isinstance(value, dict):  # task_accuracy_drop_max per task
            return {k: _fraction(v, sign, written, k) for k, v in value.items()}
        return _fraction(value, sign, written)

    @field_validator("task_accuracy_drop_max")
    @classmethod
    def _task_bars(cls, value: float | dict[str, float]) -> float | dict[str, float]:
        values = value.values() if isinstance(value, dict) else [value]
        if any(v < 0 or v > 1 for v in values):
            raise ValueError("an accuracy drop is a fraction in [0, 1]")
        return value

    def task_bar(self, task: str) -> float | None:
        """The bar on `task`; None when a table names neither it nor a default."""
        bar = self.task_accuracy_drop_max
        return bar if not isinstance(bar, dict) else bar.get(task, bar.get("default"))


class Server(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    url: str
    role: Literal["reference", "candidate"] = "candidate"
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(600.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    model: str | None = Field(None, description="model id to request; default: the first of /v1/models")
    tokenizer: str | None = Field(None, description="local tokenizer path for a server without /tokenizer_info "
                                                    "(default: its /v1/models root, when on this disk)")
    attention_backend: str | None = Field(
        None, min_length=1, max_length=80,
        description="the attention backend the server's log says it uses (\"Using FLASH_ATTN attention backend\"): "
                    "vLLM does not expose the one it resolves")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return base_url(value)

    @field_validator("headers")
    @classmethod
    def _no_secret_headers(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in value if k.lower() in _SECRET_HEADERS)
        if bad:
            raise ValueError(f"header {bad[0]!r} carries a secret: put the key in an environment "
                             "variable and name it in api_key_env")
        return value

    def api_key(self) -> str | None:
        return settings.api_key(self.api_key_env)

    def unset_key_env(self) -> str | None:
        """The variable api_key_env names, when the environment leaves it unset: requests then go
        without a key, which a server that needs one answers with 401."""
        return self.api_key_env if self.api_key_env and not self.api_key() else None


def base_url(value: str) -> str:
    """The server's base URL (scheme, host, port): ValueError, in words naming the fix, for anything
    else. Only an optional /v1 may follow, as OpenAI-style clients write it: kvprobe adds the API paths
    itself, so a path would be requested under another path, and the plan's host:port would hide it."""
    parsed = urlparse(value.strip())
    if parsed.username is not None or parsed.password is not None:  # before any echo of the value
        raise ValueError("credentials in the URL: put the key in an environment variable and name it in "
                         "api_key_env (the URL is not shown)")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL like http://127.0.0.1:8000")
    try:
        port = parsed.port
    except ValueError:  # urllib's words ("Port out of range 0-65535") name neither the port nor the fix
        port = -1
    if port is not None and not 1 <= port <= 65535:
        written = parsed.netloc.rpartition(":")[2]
        kind = "is out of range" if written.isdigit() else "is not a number"
        raise ValueError(f"port {written} {kind}: a port is 1-65535")
    base = f"{parsed.scheme}://{parsed.netloc}"
    rest = value.strip()[len(base):]
    if rest.rstrip("/").removesuffix("/v1"):
        raise ValueError(f"the path {rest} is not part of a server's address: give {base} (with or without "
                         "/v1): kvprobe adds the API paths itself")
    return base


class SmokeSettings(_Strict):
    prompt_fraction: float = Field(0.5, gt=0, lt=1, description="smoke prompt length, share of max_model_len")
    max_tokens: int = Field(8, ge=1)


class PerplexitySettings(_Strict):
    task: str = "kvprobe_ppl"
    limit: int | None = Field(None, ge=1, description="at most this many passages")
    num_concurrent: int = Field(4, ge=2)
    prefill_chunk_tokens: int = Field(2048, ge=1, description="the servers' max_num_batched_tokens")
    reference_repeats: int = Field(2, ge=2, description="reference runs, for the noise floor")
    bootstrap_resamples: int = Field(2000, ge=100, description="unused since rules/3 (t intervals); still read")
    seed: int = Field(0, description="unused since rules/3; still read")
    passages: str | None = Field(None, description="your own passages: a JSONL file, one {\"text\": ...} per "
                                 "line (relative to servers.toml); scored instead of the shipped task")
    include_path: str | None = Field(None, description="your own lm-eval task folder; `task` names the task in it")
    delta_unit: Literal["byte", "word", "token"] = Field(
        "byte", description="which perplexity the delta and the bar are on (byte: the unit of bits_per_byte)")


class AgreementSettings(_Strict):
    top_k: int = Field(20, ge=1, le=20, description="prompt logprobs per position (vLLM caps at 20)")
    passages: int = Field(4, ge=1, description="the first N passages of the perplexity task")
    # Past one 2048-token prefill chunk, so later positions read the (quantized) cache.
    max_tokens_per_passage: int = Field(4096, ge=16)
    # One at a time: a server then splits every prompt into the same prefill chunks in every pass,
    # so the reference matches itself exactly and candidates differ only by their KV dtype.
    concurrency: int = Field(1, ge=1, description="requests in flight per server")


class NeedleSettings(_Strict):
    count: int = Field(180, ge=1, description="needles per server; case i sits in grid cell i mod cells (36 lengths x "
                       "5 depths at 180). At the default 0.10 recall bar, 180 fail a candidate that loses twice the "
                       "bar, 5% of its answers flipping beside the loss, with probability 0.85 (0.66 at 115), and "
                       "pass one equal to the reference with 0.999")
    lengths: list[int] | None = Field(None, description="prompt lengths in tokens (chat template included); "
                                      "default: spread from min_length to the largest that fits")
    depths: list[float] | None = Field(None, description="needle depths in [0, 1]; default 0, .25, .5, .75, 1")
    min_length: int = Field(1024, ge=64)
    max_tokens: int = Field(1024, ge=1, description="answer budget, reasoning included")
    templates: list[str] = Field(default_factory=lambda: ["ruler"], min_length=1,
                                 description="needle/question templates from tasks/needle/templates.json")
    seed: int = 0
    stream: bool = False
    concurrency: int = Field(2, ge=1, description="cases in flight per server")
    tiktoken_encoding: str = Field("cl100k_base", description="estimate when no server has /tokenize")

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or min(value) < 16):
            raise ValueError("give at least one length, each at least 16 tokens")
        return None if value is None else sorted(set(value))

    @field_validator("depths")
    @classmethod
    def _depths(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or min(value) < 0 or max(value) > 1):
            raise ValueError("depths are fractions of the haystack: give at least one, each in [0, 1]")
        return None if value is None else sorted(set(value))


class TasksSettings(_Strict):
    """Task accuracy through lm-eval (`--probes ...,tasks`): each task on every server, identical greedy
    requests, the candidate's per-sample scores paired with the reference's."""

    names: list[str] = Field(default_factory=lambda: ["kvprobe_qa"], min_length=1,
                             description="lm-eval task names (default: the shipped kvprobe_qa)")
    include_path: str | None = Field(None, description="your own lm-eval task folder, with local data files "
                                     "(relative to servers.toml); default: the shipped tasks/")
    registry: bool = Field(False, description="also lm-eval's own task registry (its data must be on disk: "
                           "nothing is downloaded)")
    limit: int | None = Field(None, ge=1, description="at most this many documents per task")
    metric: dict[str, str] = Field(default_factory=dict, description="task -> the metric its bar is on "
                                   "(default: the task's first metric)")
    max_gen_toks: int = Field(1024, ge=1, description="answer cap for generate_until tasks, reasoning included")
    num_concurrent: int = Field(4, ge=1, description="requests in flight per server")
    bootstrap_resamples: int = Field(2000, ge=100, description="unused since rules/3 (score intervals); still read")
    seed: int = Field(0, description="unused since rules/3; still read")

    @field_validator("names")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("task names must be unique")
        return value


class Slo(_Strict):
    """Per-request service-level objective for goodput; a request is good when it meets every set limit."""

    ttft_s: float | None = Field(None, gt=0, description="time to first token (reasoning or content)")
    tpot_s: float | None = Field(None, gt=0, description="time per output token after the first")
    e2e_s: float | None = Field(None, gt=0, description="end-to-end request time")


class LoadShape(_Strict):
    """One load shape: unset fields take the [load] values. Several shapes show a load-shape
    dependence (e.g. a KV dtype faster on short prompts and slower on long ones)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    agents: list[int] | None = Field(None, min_length=1)
    turns: int | None = Field(None, ge=1)
    system_tokens: int | None = Field(None, ge=0)
    tokens_per_turn: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)

    @field_validator("agents")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and min(value) < 1:
            raise ValueError("agent counts must be >= 1")
        return value


class LoadSettings(_Strict):
    """Concurrent multi-turn agents, streamed chat. Each agent's turn carries the shared system prompt,
    the conversation so far and a new tool-output-like block of tokens_per_turn tokens plus a question;
    the assistant turns in that history are fixed text, so every server gets byte-identical prompts."""

    agents: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16], min_length=1,
                              description="the sweep: concurrent agents per case")
    turns: int = Field(4, ge=1, description="turns per conversation (the context grows each turn)")
    system_tokens: int = Field(512, ge=0, description="shared system prompt")
    tokens_per_turn: int = Field(256, ge=1, description="new tool-output tokens per turn")
    max_output_tokens: int = Field(64, ge=1)
    ignore_eos: bool = Field(True, description="generate exactly max_output_tokens (vLLM's ignore_eos), "
                             "so every server does the same work")
    temperature: float = Field(0.0, ge=0)
    shapes: list[LoadShape] = Field(default_factory=list,
                                    description="several load shapes; default one shape from the fields above")
    requests_per_case: int | None = Field(None, ge=1, description="request budget per case "
                                          "(default: one conversation per agent)")
    duration_s: float | None = Field(None, gt=0, description="time budget per case: agents start new "
                                     "conversations until it is spent")
    endpoint: Literal["sweep"] | int = Field(
        "sweep", description="the primary speed endpoint, declared before the run: output tokens/s as the mean "
        "over the agent sweep of the per-case log ratios (\"sweep\"), or one operating point by its agent count "
        "(e.g. 8, one of `agents`). Only it and `latency_endpoint` gate adopt; per-case figures are guardrails")
    latency_endpoint: Literal["itl_p99", "tpot_p99", "ttft_p90", "e2e_p90", "ttft_p99", "e2e_p99"] | None = Field(
        None, description="optional second primary endpoint, a latency percentile at the same scope; ttft_p99 "
        "and e2e_p99 need at least 100 requests per run (requests_per_case or duration_s), else use p90")
    max_blocks: int = Field(20, ge=2, description="the most paired blocks (each: every case on the reference "
                            "and each undecided candidate, back to back in a balanced order)")
    look_every: int = Field(4, ge=1, description="blocks between looks of the sequential decision (from 4 on)")
    budget_s: float | None = Field(None, gt=0, description="time budget of the load probe: no block starts "
                                   "after it is spent, and an undecided endpoint is inconclusive")
    advisory: bool = Field(False, description="speed is reported but never changes a decision or the exit "
                           "code (`kvprobe canary --advisory-speed` sets it)")
    repeats: int | None = Field(None, ge=1, description="a fixed design instead: exactly this many blocks, "
                                "looked at once at the end (no early stop; >= 2 for an interval); default the "
                                "sequential design")
    warmup: bool = Field(True, description="before measuring, one unrecorded case per shape and server "
                         "(a cold server's first batches are several times slower)")
    mode: Literal["closed", "open"] = Field("closed", description="closed: an agent sends its next turn when "
                                            "the last finished; open: Poisson arrivals at `rate`")
    rate: float | None = Field(None, gt=0, description="open loop: requests per second (Poisson)")
    seed: int = Field(0, description="workload text and open-loop arrival times (not a sampling seed)")
    processes: int | None = Field(None, ge=1, description="client worker processes per case, agents sharded "
                                  "over them (default: one per 256 agents, at most one per core; one process "
                                  "meets the timing targets up to 256 streams, measured)")
    metrics_interval_s: float = Field(0.5, gt=0, description="/metrics sampling period during a case")
    settle_s: float = Field(2.0, ge=0, description="idle pause before each case: servers that share cores (a "
                            "test box) are slowed for up to ~1 s after another server's case while its threads "
                            "wind down; measured as a 0.5-1 s TTFT stall on the next server")
    request_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="server name -> JSON fields merged into that server's load requests. For fault "
        "tests only: the servers then get different requests. Example: {seed = 1, temperature = 0.7} with "
        "an uncached prompt over 2048 tokens kills a vLLM 0.32 CPU server (chunked prefill + seeded sampling)")
    slo: Slo = Field(default_factory=Slo)

    @model_validator(mode="after")
    def _open_needs_rate(self) -> LoadSettings:
        if self.mode == "open" and self.rate is None:
            raise ValueError("mode = \"open\" needs rate (requests per second)")
        if min(self.agents) < 1:
            raise ValueError("agent counts must be >= 1")
        names = [s.name for s in self.shapes]
        if len(set(names)) != len(names):
            raise ValueError("shape names must be unique")
        if isinstance(self.endpoint, int) and not self.shapes and self.endpoint not in self.agents:
            raise ValueError(f"endpoint = {self.endpoint} is not one of agents {self.agents}")
        return self

    @property
    def blocks(self) -> int:
        """The most blocks the design plans."""
        return self.repeats if self.repeats is not None else self.max_blocks


class FillSettings(_Strict):
    fraction: float = Field(1.05, gt=0, description="serve this many new tokens, as a share of the claimed "
                            "capacity (> 1 walks every block id)")
    prompt_tokens: int | None = Field(None, ge=64, description="tokens per request (default: max_model_len)")
    concurrency: int = Field(2, ge=1, description="requests in flight per server")


class Config(_Strict):
    knob: str = Field("kv_cache_dtype", pattern=r"^[a-z][a-z0-9_]*$",
                      description="the one setting the servers may differ in: kv_cache_dtype, "
                      "mamba_ssm_cache_dtype, mamba_cache_dtype, or any vllm:cache_config_info label")
    bars: Bars = Field(default_factory=Bars)
    server: list[Server] = Field(min_length=1)
    model_config_path: str | None = Field(None, alias="model_config", description="HF config.json for memmap")
    smoke: SmokeSettings = Field(default_factory=SmokeSettings)
    perplexity: PerplexitySettings = Field(default_factory=PerplexitySettings)
    agreement: AgreementSettings = Field(default_factory=AgreementSettings)
    needle: NeedleSettings = Field(default_factory=NeedleSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    fill: FillSettings = Field(default_factory=FillSettings)
    tasks: TasksSettings = Field(default_factory=TasksSettings)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def servers(self) -> list[Server]:
        return self.server

    @property
    def reference(self) -> Server:
        return next(s for s in self.server if s.role == "reference")

    @property
    def candidates(self) -> list[Server]:
        return [s for s in self.server if s.role == "candidate"]

    def public_dict(self) -> dict[str, Any]:
        """The config as recorded in a run: no secrets (only env var names; header names, not values)."""
        data = self.model_dump(mode="json", by_alias=True)
        for server in data["server"]:
            server["headers"] = sorted(server["headers"])
        return data


# -- one line per problem -------------------------------------------------------------------------

# The fix for a value that does not match a field's pattern, by the field's name.
_PATTERN_FIXES = {
    "name": "use letters, digits and . _ - only, starting with a letter or digit",
    "knob": "use a vLLM setting's name in lower case with underscores, e.g. kv_cache_dtype",
    "api_key_env": "give the NAME of the environment variable that holds the key (letters, digits, _), "
                   "not the key itself",
}
# The fix for a single table where a list of tables belongs, by the key.
_LIST_FIXES = {"server": "write each server as its own [[server]] table (two brackets)",
               "shapes": "write each shape as its own [[load.shapes]] table (two brackets)"}
# What a type error expects, in TOML's words.
_EXPECTED = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string in quotes", "list_type": "a list, like [1, 2]",
    "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table",
}


@dataclass
class _Place:
    """Where a pydantic error is in servers.toml: its key path without union member tags, the table
    (model) its last key sits in, and how deep the union field it is under sits (0: none)."""

    path: list[str | int]
    table: type[BaseModel] | None
    union_depth: int


def _keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _table_of(annotation: Any) -> type[BaseModel] | None:
    """The table type a field holds: itself, a list of it, or it or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((t for t in map(_table_of, get_args(annotation)) if t is not None), None)


def _is_union(annotation: Any) -> bool:
    """A union pydantic tries member by member, tagging each error with the member (`X | None` is not one)."""
    return (get_origin(annotation) in (Union, UnionType)
            and sum(a is not type(None) for a in get_args(annotation)) > 1)


def _place(loc: tuple[Any, ...]) -> _Place:
    model: type[BaseModel] | None = Config
    place = _Place([], None, 0)
    tag_next = False
    for item in loc:
        if tag_next:  # the union member pydantic tried ("float", "dict[str,float]"): not a key
            tag_next = False
            continue
        place.path.append(item)
        if isinstance(item, int) or model is None:  # a list index, or a key inside a plain table (headers)
            continue
        place.table = model
        field = model.model_fields.get(item) or next(
            (f for f in model.model_fields.values() if f.alias == item), None)
        model = _table_of(field.annotation) if field else None
        if field is not None and _is_union(field.annotation):
            tag_next, place.union_depth = True, len(place.path)
    return place


def _where(path: list[str | int]) -> str:
    parts: list[str] = []
    for item in path:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts) or "(top level)"


def _table_name(path: list[str | int]) -> str:
    keys = [str(p) for p in path[:-1] if isinstance(p, str)]
    if not keys:
        return "the top level"
    return f"[[{'.'.join(keys)}]]" if isinstance(path[-2], int) else f"[{'.'.join(keys)}]"


def _suggest(place: _Place) -> str | None:
    """The key of its table an unknown key is closest to, if any is close."""
    close = difflib.get_close_matches(str(place.path[-1]), _keys(place.table) if place.table else [], n=1)
    return close[0] if close else None


def _unknown(place: _Place) -> str:
    if str(place.path[-1]).lower().replace("-", "_") in _SECRET_KEYS:
        return ("keys are read only from the environment: export the key in a variable and name it in the "
                "[[server]] table, api_key_env = \"NAME\" (the value is not shown)")
    if (meant := _suggest(place)) is not None:
        return f"unknown key: did you mean '{meant}'?"
    known = ", ".join(_keys(place.table)) if place.table else ""
    return f"unknown key: remove it ({_table_name(place.path)} takes {known})"


def _explain(err: dict[str, Any], place: _Place) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    key = next((str(p) for p in reversed(place.path) if isinstance(p, str)), "")
    if kind == "extra_forbidden":
        return _unknown(place)
    if kind == "missing":
        return f"required key is missing: {_LIST_FIXES.get(key, 'add it')}"
    if kind == "list_type" and key in _LIST_FIXES:
        return _LIST_FIXES[key]
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}".replace("'", '"')
    if kind == "string_pattern_mismatch":
        return _PATTERN_FIXES.get(key, err["msg"])
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds:
        words, name = bounds[kind]
        return f"must be {words} {ctx[name]}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty" if ctx.get("min_length") == 1 else f"give at least {ctx['min_length']}"
    return err["msg"].removeprefix("Value error, ")


def _line(source: str, path: list[str | int], text: str) -> str:
    # "bars.perplexity_delta_max = 5 reads as ...": a message that quotes the value follows the key
    sep = " " if text.startswith("= ") else ": "
    return f"{source}: {_where(path)}{sep}{text}"


def _problems(exc: ValidationError, source: str) -> list[str]:
    """One line per problem: an error under a union field is pydantic's one per member tried, said once
    (the members' expectations joined by "or"), or only where the value went deeper into one member."""
    placed = [(_place(err["loc"]), err) for err in exc.errors()]
    # A required key an unknown one is a slip of ([[servers]]) is said once, by the did-you-mean.
    meant = {(*p.path[:-1], _suggest(p)) for p, e in placed if e["type"] == "extra_forbidden"}
    groups: dict[tuple[Any, ...], list[tuple[_Place, dict[str, Any]]]] = {}
    for place, err in placed:
        if err["type"] == "missing" and tuple(place.path) in meant:
            continue
        root = place.path[:place.union_depth] if place.union_depth else place.path
        groups.setdefault(tuple(root), []).append((place, err))
    lines: list[str] = []
    for root, members in groups.items():
        deeper = [(p, e) for p, e in members if len(p.path) > len(root)]
        if deeper:
            lines += [_line(source, p.path, _explain(e, p)) for p, e in deeper]
            continue
        said = list(dict.fromkeys(_explain(e, p) for p, e in members))
        if all(text.startswith("must be ") for text in said):
            said = ["must be " + " or ".join(text.removeprefix("must be ") for text in said)]
        lines.append(_line(source, list(root), "; ".join(said)))
    return list(dict.fromkeys(lines))


def parse_config(data: dict[str, Any], source: str = "servers.toml") -> Config:
    try:
        config = Config.model_validate(data, context=_WRITTEN)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, source)) from None
    problems: list[str] = []
    seen: set[str] = set()
    for i, server in enumerate(config.server):
        if server.name in seen:
            problems.append(f"{source}: server[{i}].name: duplicate name {server.name!r}: names must be unique")
        seen.add(server.name)
    bar = config.bars.task_accuracy_drop_max
    if isinstance(bar, dict):
        unknown = sorted(set(bar) - set(config.tasks.names) - {"default"})
        if unknown:
            problems.append(f"{source}: bars.task_accuracy_drop_max: {', '.join(unknown)} is not in tasks.names "
                            f"({', '.join(config.tasks.names)}): add it there or remove its bar")
        missing = [t for t in config.tasks.names if config.bars.task_bar(t) is None]
        if missing:
            problems.append(f"{source}: bars.task_accuracy_drop_max: no bar for {', '.join(missing)}: name it "
                            "or give a default")
    extra = sorted(set(config.tasks.metric) - set(config.tasks.names))
    if extra:
        problems.append(f"{source}: tasks.metric: {', '.join(extra)} is not in tasks.names")
    refs = [s.name for s in config.server if s.role == "reference"]
    if len(refs) != 1:
        found = ", ".join(refs) if refs else "none"
        problems.append(f"{source}: server.role: exactly one server must have role = \"reference\" "
                        f"(found {found})")
    elif not config.candidates:  # eval would only keep the reference, exit 0: a CI job would pass on nothing
        problems.append(f"{source}: server: no candidate to compare with the reference {refs[0]}: add a "
                        "[[server]] with role = \"candidate\" (the default)")
    if problems:
        raise ConfigError(problems)
    return config


def unset_keys(config: Config, source: str = "servers.toml") -> list[str]:
    """A line per api_key_env variable the environment leaves unset, at the first server naming it. Not an
    error: the key is optional, and a server that needs one stops the run at its first request (401,
    naming the variable)."""
    named: dict[str, list[tuple[int, Server]]] = {}
    for i, server in enumerate(config.server):
        if var := server.unset_key_env():
            named.setdefault(var, []).append((i, server))
    lines = []
    for var, servers in named.items():
        who = " and ".join(server.name for _, server in servers)
        verb, need = ("is", f"{who} needs") if len(servers) == 1 else ("are", "they need")
        lines.append(f"{source}: server[{servers[0][0]}].api_key_env: {var} is not set, so {who} {verb} sent no "
                     f"API key: export it if {need} one")
    return lines


def _endpoint(url: str) -> tuple[str, str | None, int]:
    parsed = urlparse(url)
    return parsed.scheme, parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


def shared_urls(config: Config, source: str = "servers.toml") -> list[str]:
    """A line per server at the URL of one listed before it. `check` refuses it; eval runs it (an A/A
    comparison measures the noise a candidate is judged against) and says it."""
    first: dict[tuple[str, str | None, int], Server] = {}
    lines = []
    for i, server in enumerate(config.server):
        other = first.setdefault(_endpoint(server.url), server)
        if other is not server:
            lines.append(f"{source}: server[{i}].url: {server.name} and {other.name} are the same server "
                         f"({server.url}): a server compared with itself measures only noise; point each "
                         "[[server]] at its own server")
    return lines


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    # Paths inside servers.toml are relative to the file, not to wherever kvprobe was started.
    if isinstance(data.get("model_config"), str) and not Path(data["model_config"]).is_absolute():
        data["model_config"] = str(path.parent / data["model_config"])
    for table, key in (("perplexity", "passages"), ("perplexity", "include_path"), ("tasks", "include_path")):
        section = data.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str) and not Path(section[key]).is_absolute():
            section[key] = str(path.parent / section[key])
    config = parse_config(data, str(path))
    if config.perplexity.passages:  # before any server is asked anything
        check_passages(Path(config.perplexity.passages), f"{path}: perplexity.passages")
    for where, folder in (("perplexity", config.perplexity.include_path), ("tasks", config.tasks.include_path)):
        if folder and not Path(folder).is_dir():
            raise ConfigError([f"{path}: {where}.include_path {folder}: not a folder"])
    return config


def check_passages(path: Path, where: str = "perplexity.passages") -> int:
    """The number of passages in a JSONL file; ConfigError naming the file and line otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError([f"{where} {path}: cannot read: {why}"]) from None
    count = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError([f"{where} {path} line {n}: not JSON: give one {{\"text\": ...}} per line"]) from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
            raise ConfigError([f"{where} {path} line {n}: needs a non-empty \"text\" string"])
        count += 1
    if count == 0:
        raise ConfigError([f"{where} {path}: no passages (one {{\"text\": ...}} per line)"])
    return count
