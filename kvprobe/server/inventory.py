"""Per-server facts (health, version, model, cache config, capacity) and the first-prefill smoke.

A server that reports healthy may still be unable to serve (a kernel built for another arch dies
at the first real prefill), so every inventory ends with one long real prompt.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvprobe.corpus import filler_text
from kvprobe.errors import AuthError, KvprobeError, ServerError, Unreachable, Unreadable
from kvprobe.server.client import Client
from kvprobe.server.metrics import Capacity, parse_metrics
from kvprobe.server.platform import Platform, arch_mismatch, platform_from_system_env
from kvprobe.server.tokens import filler_ids
from kvprobe.server.untrusted import MAX_MODEL_LEN, number, optional_count

# unreadable: it answered, but not in a shape kvprobe can read (its model list, its token ids)
Status = Literal["ok", "unreachable", "unauthorized", "unreadable", "broken"]
# No inventory could be taken: nothing to compare, and the run cannot start (exit 2).
NOT_TAKEN = ("unreachable", "unauthorized", "unreadable")


@dataclass
class Smoke:
    ok: bool
    prompt_tokens: int | None = None
    target_tokens: int | None = None
    seconds: float | None = None
    output: str | None = None
    error: str | None = None
    approximate: bool = False  # no /tokenize: the prompt length is a character estimate
    system_fingerprint: str | None = None
    attention_block: int | None = None  # tokens per attention block the server reported

    def what(self) -> str:
        """`272 tokens, past one 256-token attention block`: what the smoke asked of the server."""
        spans = self.attention_block is not None and (self.target_tokens or 0) > self.attention_block
        return f"{self.target_tokens} tokens" + (f", past one {self.attention_block}-token attention block"
                                                 if spans else "")


@dataclass
class Inventory:
    name: str
    url: str
    role: str = "candidate"
    status: Status = "ok"
    error: str | None = None
    healthy: bool = False
    version: str | None = None
    model: str | None = None
    model_root: str | None = None
    max_model_len: int | None = None
    cache_config: dict[str, str] | None = None
    capacity: Capacity | None = None
    kv_usage: float | None = None
    has_tokenize: bool = False
    server_info: dict[str, Any] | None = None  # flattened engine config (dev mode only), no secrets
    platform: Platform | None = None  # None: no /server_info, the platform is not exposed
    # The attention backend and where it was learnt: "server_info" (forced with --attention-backend) or
    # "declared" (servers.toml, from the server's log); None: not exposed. vLLM logs what it resolved
    # ("Using FLASH_ATTN attention backend") but /server_info carries only a forced choice.
    attention_backend: str | None = None
    attention_backend_source: str | None = None
    smoke: Smoke | None = None
    warnings: list[str] = field(default_factory=list)
    # What the server sent that could not be read (each also a warning): the field is None instead.
    unreadable: list[str] = field(default_factory=list)
    metrics_text: str | None = field(default=None, repr=False)

    @property
    def cache_dtype(self) -> str | None:
        return (self.cache_config or {}).get("cache_dtype")

    @property
    def system_fingerprint(self) -> str | None:
        return self.smoke.system_fingerprint if self.smoke else None

    @property
    def serving(self) -> bool:
        return self.status == "ok"

    def cannot_read(self, line: str) -> None:
        self.warnings.append(line)
        self.unreadable.append(line)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("metrics_text")
        data["cache_dtype"] = self.cache_dtype
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Inventory:
        data = dict(data)
        data.pop("cache_dtype", None)
        if data.get("capacity"):
            data["capacity"] = Capacity(**data["capacity"])
        if data.get("smoke"):
            data["smoke"] = Smoke(**data["smoke"])
        data["platform"] = Platform.from_dict(data.get("platform"))
        return cls(**data)


def smoke_length(max_model_len: int, fraction: float, max_tokens: int, block_size: int | None) -> int:
    """Tokens in the smoke prompt: `fraction` of max_model_len, but past one attention block when the
    server's block is known and the context has room. A prompt inside one block never reaches what runs
    at block boundaries: a vLLM 0.32 CPU hybrid with prefix caching serves 256 tokens and dies at 268
    (the Mamba state checkpoint per block)."""
    target = max(16, int(max_model_len * fraction))
    if block_size and target <= block_size:
        target = max(target, min(block_size + 16, max_model_len - max_tokens))
    return target


async def smoke_test(client: Client, max_model_len: int, fraction: float, max_tokens: int,
                     has_tokenize: bool, unreadable: list[str] | None = None,
                     block_size: int | None = None) -> Smoke:
    """The first-prefill smoke; a usage count the server sent that is not a count goes to `unreadable`
    (the smoke is judged on the text it generated)."""
    target = smoke_length(max_model_len, fraction, max_tokens, block_size)
    # A fresh random prefix makes every block's hash new: a prefix-cache hit is not a prefill.
    prefix = f"kvprobe smoke {secrets.token_hex(8)}\n"
    try:
        if has_tokenize:  # a real prompt of exactly `target` tokens
            prompt, approximate = await filler_ids(client, target, prefix=prefix), False
        else:  # ~4 characters a token in English: an estimate, marked as such
            prompt, approximate = prefix + filler_text()[: target * 4], True
        t0 = time.perf_counter()
        data = await client.completions({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        seconds = time.perf_counter() - t0
    except ServerError as exc:
        return Smoke(ok=False, target_tokens=target, error=exc.detail if exc.status else str(exc))
    data = data if isinstance(data, dict) else {}
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    usage = data.get("usage")
    counts: dict[str, int | None] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        try:
            counts[key] = optional_count(usage, key, "/v1/completions usage")
        except Unreadable as exc:
            counts[key] = None
            if unreadable is not None:
                unreadable.append(str(exc))
    text = choice.get("text")
    # With its count unreadable, the text itself shows whether anything was generated.
    garbled = isinstance(usage, dict) and usage.get("completion_tokens") is not None \
        and counts["completion_tokens"] is None
    generated = bool(text) if garbled else bool(counts["completion_tokens"])
    if not isinstance(text, str) or not generated:
        return Smoke(ok=False, target_tokens=target, seconds=seconds,
                     error=f"no tokens generated (finish_reason={choice.get('finish_reason')!r})")
    fingerprint = data.get("system_fingerprint")
    return Smoke(ok=True, prompt_tokens=counts["prompt_tokens"], target_tokens=target, seconds=seconds,
                 output=text[:200], approximate=approximate,
                 system_fingerprint=fingerprint if isinstance(fingerprint, str) else None)


# What a server problem during the inventory makes of the server: the first class that matches.
_STATUS_OF: tuple[tuple[type[ServerError], str], ...] = (
    (AuthError, "unauthorized"), (Unreachable, "unreachable"), (Unreadable, "unreadable"), (ServerError, "broken"))


async def take_inventory(
    client: Client,
    *,
    role: str = "candidate",
    smoke_fraction: float = 0.5,
    smoke_max_tokens: int = 8,
    run_smoke: bool = True,
) -> Inventory:
    """Everything kvprobe learns about one server before measuring it; never raises for a server
    problem: the problem is in .status and .error."""
    inv = Inventory(name=client.name, url=client.url, role=role)
    try:
        inv.healthy = await client.health()
        inv.version = await client.version()
        sent_len = await _read_models(client, inv)
        await _read_metrics(client, inv)
        await _read_server_info(client, inv)
        inv.has_tokenize = await _has_tokenize(client, inv)
    except ServerError as exc:
        inv.status = next(status for kind, status in _STATUS_OF if isinstance(exc, kind))
        inv.error = str(exc)
        return inv
    if run_smoke:
        if not sent_len:  # an unreadable one already has its line
            inv.warnings.append("max_model_len unknown: smoke prompt of 2048 tokens")
        await _first_prefill(client, inv, smoke_fraction, smoke_max_tokens)
    return inv


async def _read_models(client: Client, inv: Inventory) -> bool:
    """The served model, its root and max_model_len from /v1/models; whether the server sent a length."""
    models = await client.models()
    if not models:
        raise ServerError(client.name, "/v1/models lists no model", path="/v1/models")
    first = next((m for m in models if m.get("id") == client.model), models[0])
    root = first.get("root")
    inv.model, inv.model_root = first["id"], root if isinstance(root, str) else None
    if first.get("max_model_len") is None:
        return False
    try:
        inv.max_model_len = number(first["max_model_len"], "/v1/models max_model_len", integer=True,
                                   minimum=1, maximum=MAX_MODEL_LEN)
    except Unreadable as exc:
        inv.cannot_read(str(exc))
    return True


async def _read_server_info(client: Client, inv: Inventory) -> None:
    """Engine facts, the platform (compiled-for vs run-on) and a forced attention backend from /server_info."""
    if (info := await client.server_info()) is None:
        return
    inv.server_info = engine_facts(info)
    inv.platform = platform_from_system_env(info.get("system_env"))
    if (mismatch := arch_mismatch(inv.platform)) is not None:
        inv.warnings.append(f"{mismatch}: the vLLM build carries no kernels for this GPU's architecture "
                            "(compiled-for is not run-on); expect it to fail at the first real prefill")
    forced = inv.server_info.get("vllm_config.attention_config.backend")
    if isinstance(forced, str) and forced:
        inv.attention_backend, inv.attention_backend_source = forced[:80], "server_info"


async def _has_tokenize(client: Client, inv: Inventory) -> bool:
    try:
        await client.tokenize(prompt="kvprobe")
    except ServerError as exc:
        if exc.status not in (404, 405, 501):
            raise
        inv.warnings.append("no /tokenize endpoint: token counts are estimates")
        return False
    return True


async def _first_prefill(client: Client, inv: Inventory, fraction: float, max_tokens: int) -> None:
    """The smoke: one real long request; a server that fails it is broken whatever it reported."""
    unreadable: list[str] = []
    block = attention_block(inv)
    inv.smoke = await smoke_test(client, inv.max_model_len or 4096, fraction, max_tokens, inv.has_tokenize,
                                 unreadable, block)
    inv.smoke.attention_block = block
    for line in unreadable:
        inv.cannot_read(line)
    if not inv.smoke.ok:
        inv.status = "broken"
        inv.error = f"{client.name}: first-prefill smoke ({inv.smoke.what()}) failed: {inv.smoke.error}"


# Only these machine facts are kept from /server_info's system_env: env_vars and pip lists can carry
# secrets or noise, and a host name is not a setting. The CPU and NVIDIA facts are in Inventory.platform.
_SYSTEM_FACTS = ("vllm_version", "torch_version", "hip_runtime_version", "rocm_version")


# A real engine config nests under 10 deep. The facts are compared and written to the run directory,
# and orjson writes 255 levels at most (a server's JSON may have 1024); a deeper value is not a fact.
_MAX_DEPTH = 16
_TOO_DEEP = "(unreadable: nested more than 16 deep)"


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 0)]  # not recursive: a garbage value may nest past Python's recursion limit
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return False


def _flatten(obj: Any, prefix: str, out: dict[str, Any], depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        out[prefix] = _TOO_DEEP
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}", out, depth + 1)
    else:
        out[prefix] = _TOO_DEEP if _deeper_than(obj, _MAX_DEPTH - depth) else obj


def attention_block(inv: Inventory) -> int | None:
    """Tokens per attention block as the server reports it (hybrids: after page alignment)."""
    labels = inv.cache_config or {}
    for label in ("effective_attention_block_size", "block_size"):
        try:
            # Through number(): int() alone takes "-5" and "1_000", and a block of -5 sizes the smoke.
            return number(labels.get(label), f"/metrics {label}", integer=True, minimum=1,
                          maximum=MAX_MODEL_LEN, text=True)
        except Unreadable:  # absent ("None") or garbled: the next label, else unknown
            continue
    return None


def engine_facts(info: dict[str, Any]) -> dict[str, Any]:
    """/server_info as flat `vllm_config.a.b` / `vllm_env.X` / `system.x` keys; secret-bearing parts
    dropped (vLLM already leaves out env vars whose names contain KEY)."""
    out: dict[str, Any] = {}
    _flatten(info.get("vllm_config") or {}, "vllm_config", out)
    env = info.get("vllm_env")
    for name, value in (env if isinstance(env, dict) else {}).items():
        if not any(word in name for word in ("KEY", "TOKEN", "SECRET", "PASSWORD")):
            out[f"vllm_env.{name}"] = _TOO_DEEP if _deeper_than(value, _MAX_DEPTH) else value
    system = info.get("system_env")
    system = system if isinstance(system, dict) else {}
    for name in _SYSTEM_FACTS:
        if name in system:
            out[f"system.{name}"] = _TOO_DEEP if _deeper_than(system[name], _MAX_DEPTH) else system[name]
    return out


async def _read_metrics(client: Client, inv: Inventory) -> None:
    try:
        inv.metrics_text = await client.metrics_text()
        snap = parse_metrics(inv.metrics_text)
    except ServerError as exc:
        if isinstance(exc, Unreachable | AuthError):
            raise
        inv.warnings.append(f"/metrics unavailable: {exc.detail}")
        return
    except KvprobeError as exc:
        inv.cannot_read(str(exc))
        return
    for line in snap.unreadable:
        inv.cannot_read(line)
    inv.cache_config = snap.cache_config
    inv.kv_usage = snap.kv_usage
    try:
        inv.capacity = snap.capacity()
    except Unreadable as exc:
        inv.cannot_read(f"{exc}: KV capacity unreadable")
        return
    if snap.cache_config is None:
        inv.warnings.append("/metrics has no vllm:cache_config_info: cache config and capacity unknown")
    elif inv.capacity and inv.capacity.estimate:
        inv.warnings.append("no kv_cache_size_tokens label: capacity is num_gpu_blocks x block_size "
                            "(an estimate, wrong for hybrid models)")


def declare_backend(inv: Inventory, declared: str | None) -> None:
    """The operator's `attention_backend` for a server whose /server_info does not force one."""
    if not declared:
        return
    if inv.attention_backend_source == "server_info":
        if inv.attention_backend != declared:
            inv.warnings.append(f"servers.toml declares attention_backend {declared!r}, but the server forces "
                                f"{inv.attention_backend!r}: the server's is used")
        return
    inv.attention_backend, inv.attention_backend_source = declared, "declared"


async def take_inventories(clients: list[Client], roles: dict[str, str] | None = None,
                           backends: dict[str, str | None] | None = None, **kw: Any) -> list[Inventory]:
    roles, backends = roles or {}, backends or {}
    inventories = list(await asyncio.gather(
        *(take_inventory(c, role=roles.get(c.name, "candidate"), **kw) for c in clients)))
    for inv in inventories:
        declare_backend(inv, backends.get(inv.name))
    return inventories
