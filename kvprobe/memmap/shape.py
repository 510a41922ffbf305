"""A Hugging Face config.json -> the layers that hold per-request state, the way vLLM builds them.

Every decoder layer gets one mixer kind. Attention mixers hold KV per token; state mixers (Mamba1,
Mamba2, gated-delta-net linear attention) hold a fixed state per sequence; MLP and MoE blocks hold
nothing and are only counted, so the report can say so.

Where each field comes from (vLLM 0.32 model code, read from the installed wheel):
- Mamba2 (NemotronH, Bamba, GraniteMoeHybrid): MambaStateShapeCalculator.mamba2_state_shape,
  intermediate = heads x head_dim; conv state (conv_kernel - 1, intermediate + 2 x groups x state),
  SSM state (heads, head_dim, state); MambaMixer2 adds one prefill checkpoint block.
- Mamba1 (Jamba, Mamba): conv (conv_kernel - 1, intermediate), SSM (intermediate, state).
- Gated delta net (Qwen3-Next, Qwen3.5): conv (kernel - 1, 2 x k_heads x k_dim + v_heads x v_dim),
  SSM (v_heads, v_dim, k_dim).
- MLA (DeepSeek V2/V3, Kimi K2): one latent of kv_lora_rank + qk_rope_head_dim per token, no V.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe.errors import ConfigError

FULL = "full_attention"
SLIDING = "sliding_window"
MLA = "mla"
MAMBA2 = "mamba2"
MAMBA1 = "mamba1"
GDN = "gdn"
MLP = "mlp"
MOE = "moe"

ATTENTION_KINDS = (FULL, SLIDING, MLA)
STATE_KINDS = (MAMBA2, MAMBA1, GDN)
NO_KV_KINDS = (MLP, MOE)
LAYER_KINDS = (*ATTENTION_KINDS, *STATE_KINDS, *NO_KV_KINDS)


@dataclass(frozen=True)
class AttentionLayer:
    kind: str  # FULL, SLIDING or MLA
    num_kv_heads: int
    head_dim: int
    head_dim_v: int  # 0 for MLA: the latent is read as both K and V
    window: int | None = None


@dataclass(frozen=True)
class StateLayer:
    kind: str  # MAMBA2, MAMBA1 or GDN
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    checkpoint_blocks: int  # extra blocks per request in vLLM's "align" mode (MambaMixer2: 1)


Layer = AttentionLayer | StateLayer


@dataclass
class ModelShape:
    name: str
    model_type: str
    dtype: str  # the model dtype vLLM's "auto" KV dtype resolves to
    layers: list[Layer]  # the layers that hold state, in model order
    no_kv: dict[str, int]  # MLP / MoE blocks: they hold no KV
    max_position_embeddings: int | None
    ssm_dtype_default: str = "auto"  # the model's own --mamba-ssm-cache-dtype default
    notes: list[str] = field(default_factory=list)
    rope_factor: float = 1.0  # the RoPE scaling factor vLLM stretches max_position_embeddings by (1: none)

    def longest(self) -> tuple[int, str] | None:
        """The longest max_model_len vLLM serves this model at (without VLLM_ALLOW_LONG_MAX_MODEL_LEN), and
        where it comes from in config.json; None when the config does not say."""
        mpe = self.max_position_embeddings
        if not isinstance(mpe, int) or isinstance(mpe, bool) or mpe <= 0:
            return None
        if self.rope_factor == 1.0:
            return mpe, f"max_position_embeddings {mpe:,}"
        return int(mpe * self.rope_factor), \
            f"max_position_embeddings {mpe:,} x rope scaling factor {self.rope_factor:g}"

    def count(self, kind: str) -> int:
        if kind in NO_KV_KINDS:
            return self.no_kv.get(kind, 0)
        return sum(1 for layer in self.layers if layer.kind == kind)

    @property
    def attention(self) -> list[AttentionLayer]:
        return [la for la in self.layers if isinstance(la, AttentionLayer)]


class _Cfg:
    """Field access that names the missing field in one line."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data = data
        self.source = source

    def get(self, *names: str, default: Any = None) -> Any:
        for name in names:
            if self.data.get(name) is not None:
                return self.data[name]
        return default

    def need(self, *names: str) -> Any:
        value = self.get(*names)
        if value is None:
            raise ConfigError([f"{self.source}: field {' or '.join(names)} is missing: "
                               "memmap needs it to size the cache"])
        return value

    def int(self, *names: str, default: int | None = None) -> int:
        value = self.get(*names) if default is not None else self.need(*names)
        if value is None:
            return default  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 0:
            raise ConfigError([f"{self.source}: field {names[0]} = {value!r} is not a whole number"])
        return int(value)


def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the model config: {exc.strerror}"]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}): "
                           "pass a Hugging Face config.json"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: not a JSON object: pass a Hugging Face config.json"])
    return data


def model_shape(data: dict[str, Any], source: str = "config.json", name: str | None = None) -> ModelShape:
    """The state-holding layers of the model described by a config.json dict."""
    top = data
    text = data.get("text_config")
    if isinstance(text, dict) and text.get("num_hidden_layers"):
        data = {**{k: v for k, v in top.items() if k != "text_config"}, **text}
    cfg = _Cfg(data, source)
    arch = (top.get("architectures") or [None])[0]
    model_type = str(cfg.get("model_type", default="") or "")
    name = name or str(top.get("_name_or_path") or arch or model_type or "model")
    notes: list[str] = []

    dtype = str(cfg.get("dtype", "torch_dtype", default="") or "")
    if dtype in ("", "auto"):
        dtype = "bfloat16"
        notes.append("config has no dtype: assumed bfloat16")
    elif dtype in ("float32", "float"):
        dtype = "bfloat16"
        notes.append("config dtype float32: vLLM's dtype=auto serves it in 16 bits, sized as bfloat16")
    elif dtype not in ("bfloat16", "float16", "half"):
        raise ConfigError([f"{source}: dtype {dtype!r} is not one memmap can size: expected bfloat16 or float16"])

    kinds, no_kv = _layer_kinds(cfg, model_type, arch or "")
    layers: list[Layer] = []
    builders = {
        FULL: lambda: _attention(cfg, FULL),
        SLIDING: lambda: _attention(cfg, SLIDING),
        MLA: lambda: _mla(cfg),
        MAMBA2: lambda: _mamba2(cfg),
        MAMBA1: lambda: _mamba1(cfg),
        GDN: lambda: _gdn(cfg),
    }
    cache: dict[str, Layer] = {}
    for kind in kinds:
        if kind not in cache:
            cache[kind] = builders[kind]()
        layers.append(cache[kind])
    if not layers:
        raise ConfigError([f"{source}: no attention or state layers found: memmap cannot size this model"])

    ssm_default = "auto"
    if model_type.startswith("nemotron_h") or (arch or "").startswith("NemotronH"):
        # vLLM's NemotronHForCausalLMConfig: the HF field, else float32.
        ssm_default = str(cfg.get("mamba_ssm_cache_dtype", default="float32"))
    elif model_type.startswith("qwen3_5"):
        ssm_default = str(cfg.get("mamba_ssm_dtype", default="auto"))
    return ModelShape(name=name, model_type=model_type, dtype="float16" if dtype == "half" else dtype,
                      layers=layers, no_kv=no_kv, max_position_embeddings=cfg.get("max_position_embeddings"),
                      ssm_dtype_default=ssm_default, notes=notes, rope_factor=_rope_factor(cfg, model_type))


# RoPE types whose max_position_embeddings is already the scaled length: vLLM (_get_and_verify_max_len, 0.32)
# applies their factor no second time. Any other type's factor stretches the length vLLM serves.
_ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _rope_factor(cfg: _Cfg, model_type: str) -> float:
    """The factor vLLM multiplies max_position_embeddings by: rope_scaling (or transformers' newer
    rope_parameters, one dict or one per layer type), 1 for Gemma 3, whose length is already scaled."""
    params = cfg.get("rope_scaling", "rope_parameters")
    if "gemma3" in model_type or not isinstance(params, dict):
        return 1.0
    entries = [params] if {"rope_type", "type", "factor"} & set(params) else \
        [v for v in params.values() if isinstance(v, dict)]
    factor = 1.0
    for rp in entries:
        kind = rp.get("rope_type") or rp.get("type") or "default"
        value = rp.get("factor")
        if kind not in _ROPE_PRESCALED and isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            factor = float(value)
    return factor


def _ffn_kind(cfg: _Cfg, index: int) -> str:
    experts = cfg.get("n_routed_experts", "num_experts", "num_local_experts", default=0) or 0
    if not experts:
        return MLP
    if index < (cfg.get("first_k_dense_replace", default=0) or 0):
        return MLP
    period = cfg.get("expert_layer_period")
    if period:
        return MOE if index % period == (cfg.get("expert_layer_offset", default=0) or 0) else MLP
    if index in (cfg.get("mlp_only_layers", default=[]) or []):
        return MLP
    return MOE


def _tally(kinds: list[str]) -> dict[str, int]:
    return {k: kinds.count(k) for k in NO_KV_KINDS if kinds.count(k)}


def _layer_kinds(cfg: _Cfg, model_type: str, arch: str) -> tuple[list[str], dict[str, int]]:
    """One mixer kind per state-holding layer, and the count of MLP/MoE blocks (no KV)."""
    # NemotronH: the pattern lists mixers and FFNs as separate layers.
    pattern = cfg.get("hybrid_override_pattern")
    block_types = cfg.get("layers_block_type")
    if pattern or (block_types and model_type.startswith("nemotron_h")):
        chars = {"M": MAMBA2, "*": FULL, "-": MLP, "E": MOE}
        words = {"mamba": MAMBA2, "linear_attention": MAMBA2, "m": MAMBA2, "attention": FULL,
                 "full_attention": FULL, "mlp": MLP, "moe": MOE}
        if pattern:
            unknown = sorted(set(pattern) - set(chars))
            table, seq = chars, list(pattern)
        else:
            unknown = sorted({str(w) for w in block_types} - set(words))
            table, seq = words, [str(w) for w in block_types]
        if unknown:
            raise ConfigError([f"{cfg.source}: layer type(s) {', '.join(unknown)} in the NemotronH pattern "
                               "are not ones memmap knows (mamba, attention, mlp, moe)"])
        kinds = [table[s] for s in seq]
        return [k for k in kinds if k not in NO_KV_KINDS], _tally(kinds)

    n = cfg.int("num_hidden_layers", "n_layer", "num_layers")
    if model_type.startswith("falcon_h1"):
        raise ConfigError([f"{cfg.source}: Falcon-H1 runs attention and Mamba in the same layer: "
                           "memmap does not model that layout"])

    ffn = [_ffn_kind(cfg, i) for i in range(n)]
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        words = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
                 "sliding_window": SLIDING, "linear_attention": GDN, "mamba": MAMBA2}
        unknown = sorted({str(t) for t in layer_types} - set(words))
        if unknown:
            raise ConfigError([f"{cfg.source}: layer_types has {', '.join(unknown)}: memmap models full, "
                               "sliding, linear (gated delta net) attention and Mamba layers only"])
        kinds = [words[str(t)] for t in layer_types[:n]]
        if GDN in kinds and not cfg.get("linear_num_value_heads"):
            raise ConfigError([f"{cfg.source}: linear_attention layers without linear_num_value_heads: "
                               "memmap sizes only gated-delta-net (Qwen3-Next style) linear attention"])
        if MAMBA2 in kinds and model_type.startswith("jamba"):
            kinds = [MAMBA1 if k == MAMBA2 else k for k in kinds]
        return _mla_if(cfg, kinds), _tally(ffn)

    if model_type in ("mamba", "falcon_mamba"):
        return [MAMBA1] * n, {}
    if model_type == "mamba2":
        return [MAMBA2] * n, {}
    if cfg.get("attn_layer_period") is not None:  # Jamba
        period, offset = cfg.int("attn_layer_period"), cfg.int("attn_layer_offset", default=0)
        return [FULL if i % period == offset else MAMBA1 for i in range(n)], _tally(ffn)
    if cfg.get("attn_layer_indices") is not None:  # Bamba
        attn = set(cfg.need("attn_layer_indices"))
        return [FULL if i in attn else MAMBA2 for i in range(n)], _tally(ffn)
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):  # Qwen3-Next without layer_types
        return [FULL if (i + 1) % interval == 0 else GDN for i in range(n)], _tally(ffn)

    window = cfg.get("sliding_window")
    kinds = [FULL] * n
    if window and cfg.get("use_sliding_window", default=True):
        pattern_every = cfg.get("sliding_window_pattern")
        if model_type.startswith("gemma2"):
            kinds = [SLIDING if i % 2 == 0 else FULL for i in range(n)]
        elif pattern_every:  # Gemma 3: every p-th layer is global
            kinds = [FULL if (i + 1) % pattern_every == 0 else SLIDING for i in range(n)]
        elif cfg.get("max_window_layers") is not None and model_type.startswith("qwen"):
            first = cfg.int("max_window_layers")
            kinds = [SLIDING if i >= first else FULL for i in range(n)]
        else:  # Mistral: every layer slides
            kinds = [SLIDING] * n
    return _mla_if(cfg, kinds), _tally(ffn)


def _mla_if(cfg: _Cfg, kinds: list[str]) -> list[str]:
    if cfg.get("kv_lora_rank") is None:
        return kinds
    if SLIDING in kinds:
        raise ConfigError([f"{cfg.source}: sliding-window MLA is not modelled by memmap"])
    return [MLA if k == FULL else k for k in kinds]


def _attention(cfg: _Cfg, kind: str) -> AttentionLayer:
    heads = cfg.int("num_attention_heads", "n_head")
    kv_heads = cfg.int("num_key_value_heads", "num_kv_heads", default=heads)
    if cfg.get("multi_query"):
        kv_heads = 1
    head_dim = cfg.get("head_dim", "attention_head_dim")
    if head_dim is None:
        head_dim = cfg.int("hidden_size") // heads
    window = cfg.int("sliding_window") if kind == SLIDING else None
    return AttentionLayer(kind, kv_heads, int(head_dim), int(head_dim), window)


def _mla(cfg: _Cfg) -> AttentionLayer:
    return AttentionLayer(MLA, 1, cfg.int("kv_lora_rank") + cfg.int("qk_rope_head_dim"), 0)


def _mamba2(cfg: _Cfg) -> StateLayer:
    heads = cfg.int("mamba_num_heads", "mamba_n_heads")
    head_dim = cfg.int("mamba_head_dim", "mamba_d_head")
    state = cfg.int("ssm_state_size", "mamba_d_state", "state_size")
    conv = cfg.int("conv_kernel", "mamba_d_conv")
    groups = cfg.int("n_groups", "mamba_n_groups")
    intermediate = heads * head_dim
    return StateLayer(MAMBA2, (conv - 1, intermediate + 2 * groups * state), (heads, head_dim, state), 1)


def _mamba1(cfg: _Cfg) -> StateLayer:
    # Jamba's intermediate_size is its MLP's; its Mamba width is mamba_expand x hidden_size.
    if cfg.get("mamba_expand") is not None:
        intermediate = cfg.int("mamba_expand") * cfg.int("hidden_size")
    else:
        intermediate = cfg.get("intermediate_size") or cfg.int("expand") * cfg.int("hidden_size")
    state = cfg.int("mamba_d_state", "state_size", "ssm_state_size")
    conv = cfg.int("mamba_d_conv", "conv_kernel")
    return StateLayer(MAMBA1, (conv - 1, int(intermediate)), (int(intermediate), state), 0)


def _gdn(cfg: _Cfg) -> StateLayer:
    nk, nv = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    dk, dv = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    conv = cfg.int("linear_conv_kernel_dim")
    return StateLayer(GDN, (conv - 1, 2 * nk * dk + nv * dv), (nv, dv, dk), 0)
