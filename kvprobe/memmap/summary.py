"""A memory map over several KV dtypes: ratios to the reference, the ceiling, one sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvprobe.memmap.allocator import Plan, Settings, plan
from kvprobe.memmap.shape import ATTENTION_KINDS, LAYER_KINDS, NO_KV_KINDS, STATE_KINDS, ModelShape

LABELS = {
    "full_attention": "full-attention KV", "sliding_window": "sliding-window KV", "mla": "MLA latent KV",
    "mamba2": "Mamba2 state", "mamba1": "Mamba1 state", "gdn": "gated-delta-net state",
    "mlp": "MLP (no KV)", "moe": "MoE (no KV)",
}


@dataclass
class MemoryMap:
    model: ModelShape
    max_model_len: int
    settings: Settings
    plans: dict[str, Plan]  # in the order asked; the first is the reference

    @property
    def reference(self) -> str:
        return next(iter(self.plans))

    def kinds(self) -> list[str]:
        """Layer kinds present, attention first, then state, then the no-KV blocks."""
        return [k for k in LAYER_KINDS if self.model.count(k)]

    def ratio(self, dtype: str) -> float:
        """Capacity relative to the reference, as the servers' kv_cache_size_tokens would compare."""
        ref = self.plans[self.reference]
        if ref.kv_cache_tokens == 0:  # less than one token of capacity: compare the unrounded figure
            return self.plans[dtype].max_concurrency / ref.max_concurrency
        return self.plans[dtype].kv_cache_tokens / ref.kv_cache_tokens

    def bytes_per_sequence(self, dtype: str) -> dict[str, int]:
        allocated = self.plans[dtype].bytes_per_sequence
        return {k: (0 if k in NO_KV_KINDS else allocated.get(k, 0)) for k in self.kinds()}

    def state_share(self, dtype: str | None = None) -> float:
        p = self.plans[dtype or self.reference]
        state = sum(v for k, v in p.bytes_per_sequence.items() if k in STATE_KINDS)
        return state / p.total_bytes_per_sequence

    def ceiling(self) -> float | None:
        """The most any KV dtype could raise capacity over the reference: if attention KV cost
        nothing and state pages lost their padding, each sequence would still hold its real state.
        None when there is no state (dense models: KV is the whole lever)."""
        p = self.plans[self.reference]
        floor = sum(g.blocks_per_request * g.real_bytes_per_block for g in p.groups if g.kind in STATE_KINDS)
        return None if floor == 0 else p.total_bytes_per_sequence / floor

    def to_json(self) -> dict[str, Any]:
        """`kvprobe memmap --json`: a stable shape scripts read (tests/memmap hold it)."""
        return {"dtypes": {
            d: {
                "kv_cache_tokens": p.kv_cache_tokens,
                "max_concurrency": p.max_concurrency,
                "ratio": self.ratio(d),
                "bytes_per_sequence": self.bytes_per_sequence(d),
            } for d, p in self.plans.items()
        }}

    def details(self) -> dict[str, Any]:
        """Everything behind the numbers, for run directories."""
        return {
            "model": self.model.name, "model_type": self.model.model_type, "model_dtype": self.model.dtype,
            "max_model_len": self.max_model_len, "reference": self.reference,
            "settings": self.settings.__dict__,
            "layers": {k: self.model.count(k) for k in self.kinds()},
            "ceiling_ratio": self.ceiling(), "state_share": self.state_share(),
            "conclusion": self.conclusion(), "notes": self.model.notes,
            **self.to_json(),
            "plans": {d: {
                "attention_block_size": p.attention_block_size, "num_blocks": p.num_blocks,
                "bytes_per_block": p.bytes_per_block, "blocks_per_request": p.blocks_per_request,
                "attention_bytes_per_token": p.attention_bytes_per_token,
                "state_page_bytes": p.state_page_bytes, "state_page_padded": p.state_page_padded,
                "padding_pct": p.padding_pct, "padding_per_sequence": p.padding_per_sequence,
                "groups": [{"kind": g.kind, "layers": len(g.layers), "blocks_per_request": g.blocks_per_request}
                           for g in p.groups],
            } for d, p in self.plans.items()},
        }

    def conclusion(self) -> str:
        """One sentence: how much of each sequence is KV, and how far a KV dtype can move capacity."""
        L = f"{self.max_model_len:,}"
        others = [d for d in self.plans if d != self.reference]
        best = max(others, key=self.ratio) if others else None
        state_kinds = [k for k in STATE_KINDS if self.model.count(k)]
        if not state_kinds:
            kinds = [LABELS[k] for k in ATTENTION_KINDS if self.model.count(k)]
            verb = "is" if len(kinds) == 1 else "together are"
            head = f"{' and '.join(kinds)} {verb} all of each sequence's bytes at {L} tokens"
            head += ": KV dtype is the whole lever"
            head = head[0].upper() + head[1:]
            if best:
                return f"{head} ({best} gives {self.ratio(best):.2f}x the {self.reference} capacity)."
            return f"{head}."
        p = self.plans[self.reference]
        main = max(state_kinds, key=lambda k: p.bytes_per_sequence.get(k, 0))
        label = LABELS[main] if len(state_kinds) == 1 else "recurrent state"
        share = f"{label[0].upper()}{label[1:]} is {self.state_share():.0%} of each sequence's bytes at {L} tokens"
        cap = f"no KV dtype can raise capacity by more than {self.ceiling():.2f}x"
        if best:
            return f"{share}: {best} changes capacity by {self.ratio(best):.2f}x, and {cap}."
        return f"{share}: {cap}."


def memory_map(model: ModelShape, dtypes: list[str], max_model_len: int, settings: Settings) -> MemoryMap:
    unique = list(dict.fromkeys(dtypes))
    return MemoryMap(model, max_model_len, settings, {d: plan(model, d, max_model_len, settings) for d in unique})
