"""The lever: predicted capacity over KV dtypes x Mamba SSM state dtypes, and one sentence naming the
knob that moves it at this context length.

On an attention-light hybrid the KV dtype can free nothing while the state dtype frees most of the
pool; at long contexts the two trade places. The operator needs to be told which, so the grid is
predicted with the same allocator model as every other memmap figure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvprobe.memmap.allocator import Plan, Settings, mamba_cache_mode, plan, state_dtypes
from kvprobe.memmap.dtypes import STATE_DTYPE_BYTES
from kvprobe.memmap.shape import STATE_KINDS, ModelShape
from kvprobe.memmap.summary import LABELS, MemoryMap

# A ratio that prints as 1.00x moves nothing an operator would turn a knob for.
MOVES = 1.005
KV_KNOB = "kv_cache_dtype"
SSM_KNOB = "mamba_ssm_cache_dtype"


@dataclass(frozen=True)
class Cell:
    kv_dtype: str
    ssm_dtype: str | None  # resolved (never "auto"); None for a model without recurrent state
    kv_cache_tokens: int
    max_concurrency: float
    ratio: float  # to the reference cell

    def to_json(self) -> dict[str, Any]:
        return {"kv_dtype": self.kv_dtype, "ssm_dtype": self.ssm_dtype, "kv_cache_tokens": self.kv_cache_tokens,
                "max_concurrency": self.max_concurrency, "ratio": self.ratio}


@dataclass
class Lever:
    mm: MemoryMap
    kv_dtypes: list[str]
    ssm_dtypes: list[str]  # empty for a model without recurrent state
    cells: list[Cell]
    mode: str | None  # mamba_cache_mode the grid was predicted with: align (prefix caching on) or none
    other_mode: Lever | None = None  # the same grid with prefix caching flipped, for the note

    @property
    def reference(self) -> Cell:
        return self.cells[0]

    def cell(self, kv_dtype: str, ssm_dtype: str | None) -> Cell:
        return next(c for c in self.cells if c.kv_dtype == kv_dtype and c.ssm_dtype == ssm_dtype)

    def best_kv(self) -> Cell | None:
        """The best other KV dtype with the reference's state dtype."""
        row = [c for c in self.cells if c.ssm_dtype == self.reference.ssm_dtype and c is not self.reference]
        return max(row, key=lambda c: c.ratio, default=None)

    def best_ssm(self) -> Cell | None:
        """The best other state dtype with the reference's KV dtype."""
        col = [c for c in self.cells if c.kv_dtype == self.reference.kv_dtype and c is not self.reference]
        return max(col, key=lambda c: c.ratio, default=None)

    def best(self) -> Cell:
        return max(self.cells, key=lambda c: c.ratio)

    def knob(self) -> str | None:
        """The knob that moves capacity most here (servers.toml `knob` spelling), None when neither does;
        a tie names the KV dtype, the default knob."""
        kv, ssm = self.best_kv(), self.best_ssm()
        kv_r, ssm_r = kv.ratio if kv else 0.0, ssm.ratio if ssm else 0.0
        if max(kv_r, ssm_r) < MOVES:
            return None
        return SSM_KNOB if ssm_r > kv_r else KV_KNOB

    def sentence(self) -> str:
        if not self.ssm_dtypes:
            return self.mm.conclusion()  # no state: KV dtype is the whole lever, said as memmap always has
        where = f"At {self.mm.max_model_len:,} tokens with prefix caching {'on' if self.mode == 'align' else 'off'}"
        kv, ssm, share = self.best_kv(), self.best_ssm(), self._share()
        kv_moves, ssm_moves = bool(kv and kv.ratio >= MOVES), bool(ssm and ssm.ratio >= MOVES)
        if kv:
            kv_change = f"KV dtype changes capacity by {kv.ratio:.2f}x ({kv.kv_dtype})"
        elif self.mm.model.attention:
            kv_change = "KV dtype was not compared"
        else:
            kv_change = "KV dtype changes nothing (no attention)"
        ssm_change = f"{ssm.ratio:.2f}x ({ssm.ssm_dtype})" if ssm else "nothing"
        ref_ssm = self.reference.ssm_dtype or ""
        if ssm and STATE_DTYPE_BYTES.get(ref_ssm) == min(STATE_DTYPE_BYTES.values()):
            ssm_change = ssm_change[:-1] + f"; the state is {ref_ssm} already)"  # nothing smaller to pick
        if not kv_moves and not ssm_moves:
            return (f"{where}, neither knob raises capacity: {kv_change}, the Mamba SSM state dtype {ssm_change}; "
                    f"{share}.")
        if kv and not ssm_moves:
            return (f"{where}, KV dtype is the lever: {kv.kv_dtype} is predicted to give {kv.ratio:.2f}x, the "
                    f"Mamba SSM state dtype {ssm_change}; {share}.")
        assert ssm is not None  # ssm_moves
        flag = f"`--mamba-ssm-cache-dtype {ssm.ssm_dtype}`"
        if not kv_moves or kv is None:
            return (f"{where}, {kv_change} and the Mamba SSM state dtype is the lever: {ssm.ssm_dtype} is predicted "
                    f"to give {ssm.ratio:.2f}x ({flag}), as {share}.")
        both = self.cell(kv.kv_dtype, ssm.ssm_dtype)
        together = f"and both together {both.ratio:.2f}x ({kv.kv_dtype} KV with {ssm.ssm_dtype} state); {share}"
        kv_text = f"KV dtype {kv.kv_dtype} {kv.ratio:.2f}x"
        ssm_text = f"the Mamba SSM state dtype {ssm.ssm_dtype} {ssm.ratio:.2f}x ({flag})"
        if f"{kv.ratio:.2f}" == f"{ssm.ratio:.2f}":
            return f"{where}, both knobs move capacity by as much: {kv_text}, {ssm_text}, {together}."
        if ssm.ratio > kv.ratio:
            return (f"{where}, both knobs move capacity and the Mamba SSM state dtype is the larger lever: "
                    f"{ssm.ssm_dtype} is predicted to give {ssm.ratio:.2f}x ({flag}), {kv_text}, {together}.")
        return (f"{where}, both knobs move capacity and KV dtype is the larger lever: {kv.kv_dtype} is predicted "
                f"to give {kv.ratio:.2f}x, {ssm_text}, {together}.")

    def _share(self) -> str:
        kinds = [k for k in STATE_KINDS if self.mm.model.count(k)]
        label = LABELS[kinds[0]] if len(kinds) == 1 else "recurrent state"
        return f"{label} is {self.mm.state_share():.0%} of each sequence's bytes"

    def prefix_caching_note(self) -> str | None:
        """What flipping prefix caching does to the same grid: it changes how many state blocks each
        sequence holds, so it moves capacity as much as either dtype and must be pinned on both servers."""
        other = self.other_mode
        if other is None or not self.ssm_dtypes:
            return None
        base = self.mm.plans[self.mm.reference].max_concurrency
        flipped = other.reference
        ratio = flipped.max_concurrency / base if base else float("nan")
        blocks, other_blocks = _state_blocks(self.mm.plans[self.mm.reference]), _state_blocks(
            other.mm.plans[other.mm.reference])
        how = ("off (`--no-enable-prefix-caching`, mamba_cache_mode none)" if other.mode == "none"
               else "on (mamba_cache_mode align)")
        text = (f"With prefix caching {how} each sequence keeps {other_blocks} state block"
                f"{'s' if other_blocks != 1 else ''} instead of {blocks}: the reference is predicted at "
                f"{flipped.kv_cache_tokens:,} tokens, {ratio:.2f}x as many")
        ssm = other.best_ssm()
        if ssm is not None:
            text += f", and {ssm.ssm_dtype} SSM state gives {ssm.ratio:.2f}x over that"
        return text + "."

    def to_json(self) -> dict[str, Any]:
        ref = self.reference
        kv, ssm = self.best_kv(), self.best_ssm()
        return {
            "sentence": self.sentence(),
            "knob": self.knob(),
            "max_model_len": self.mm.max_model_len,
            "mamba_cache_mode": self.mode,
            "reference": {"kv_dtype": ref.kv_dtype, "ssm_dtype": ref.ssm_dtype},
            "kv_dtypes": self.kv_dtypes,
            "ssm_dtypes": self.ssm_dtypes,
            "best": {KV_KNOB: kv.to_json() if kv else None, SSM_KNOB: ssm.to_json() if ssm else None,
                     "both": self.best().to_json()},
            "grid": [c.to_json() for c in self.cells],
            "prefix_caching_note": self.prefix_caching_note(),
        }


def _state_blocks(p: Plan) -> int:
    return max((g.blocks_per_request for g in p.groups if g.kind in STATE_KINDS), default=0)


def ssm_choices(model: ModelShape, settings: Settings) -> list[str]:
    """The state dtypes worth predicting: the model's default, then every dtype vLLM accepts."""
    default = state_dtypes(model, replace(settings, mamba_ssm_cache_dtype="auto"))[1]
    return list(dict.fromkeys([default, *STATE_DTYPE_BYTES]))


def _grid(model: ModelShape, kv_dtypes: list[str], max_model_len: int, settings: Settings,
          ssm_dtypes: list[str], ref_ssm: str | None) -> list[Cell]:
    plans: dict[tuple[str, str | None], Plan] = {}
    for ssm in ssm_dtypes or [None]:
        cell_settings = settings if ssm is None else replace(settings, mamba_ssm_cache_dtype=ssm)
        for kv in kv_dtypes:
            plans[(kv, ssm)] = plan(model, kv, max_model_len, cell_settings)
    ref = plans.pop((kv_dtypes[0], ref_ssm))
    ordered = [((kv_dtypes[0], ref_ssm), ref), *plans.items()]  # the reference cell first

    def ratio(p: Plan) -> float:
        if ref.kv_cache_tokens == 0:  # under one token: compare the unrounded figure, as MemoryMap.ratio does
            return p.max_concurrency / ref.max_concurrency
        return p.kv_cache_tokens / ref.kv_cache_tokens

    return [Cell(kv, ssm, p.kv_cache_tokens, p.max_concurrency, ratio(p)) for (kv, ssm), p in ordered]


def lever(mm: MemoryMap, kv_dtypes: list[str] | None = None, *, flip: bool = True) -> Lever:
    """The grid around `mm`'s settings (its reference KV dtype and SSM dtype are the reference cell).

    `kv_dtypes` defaults to the memory map's; fp8 is added when only one is given and the model has
    attention, so the sentence can always say what the KV dtype does."""
    model, settings = mm.model, mm.settings
    kvs = list(dict.fromkeys(kv_dtypes or list(mm.plans)))
    if kvs[0] != mm.reference:
        kvs = [mm.reference, *[k for k in kvs if k != mm.reference]]
    if len(kvs) == 1 and model.attention:
        kvs.append("fp8")
    has_state = any(model.count(k) for k in STATE_KINDS)
    ssms = ssm_choices(model, settings) if has_state else []
    ref_ssm = state_dtypes(model, settings)[1] if has_state else None
    mode = mamba_cache_mode(model, settings) if has_state else None
    out = Lever(mm, kvs, ssms, _grid(model, kvs, mm.max_model_len, settings, ssms, ref_ssm), mode)
    if flip and has_state and model.attention:
        flipped = replace(settings, mamba_cache_mode="none" if mode == "align" else "align")
        other_mm = MemoryMap(model, mm.max_model_len, flipped,
                             {mm.reference: plan(model, mm.reference, mm.max_model_len, flipped)})
        out.other_mode = lever(other_mm, kvs, flip=False)
    return out
