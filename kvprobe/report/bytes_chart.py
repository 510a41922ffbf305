"""The "where the bytes are" chart: one stacked bar per KV dtype, the bytes one max-length sequence
holds in vLLM's pool, split by layer type, with page padding as its own segment."""

from __future__ import annotations

from pathlib import Path

from kvprobe.memmap import MemoryMap
from kvprobe.memmap.shape import NO_KV_KINDS
from kvprobe.memmap.summary import LABELS
from kvprobe.report.save import save_png

COLORS = {
    "full_attention": "#4c72b0", "sliding_window": "#64b5cd", "mla": "#8172b2",
    "mamba2": "#dd8452", "mamba1": "#c44e52", "gdn": "#937860", "padding": "#bbbbbb",
}


def bytes_chart(mm: MemoryMap, path: str | Path) -> Path:
    """Write the chart as a PNG at `path` and return the path."""
    # An Agg canvas of its own, as plots.py does: pyplot's global backend and figure registry stay untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dtypes = list(mm.plans)
    kinds = [k for k in mm.kinds() if k not in NO_KV_KINDS]
    mib = 1024 * 1024
    fig = Figure(figsize=(max(6.5, 1.4 * len(dtypes) + 4.5), 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    bottoms = [0.0] * len(dtypes)
    for kind in [*kinds, "padding"]:
        heights = []
        for d in dtypes:
            p = mm.plans[d]
            if kind == "padding":
                heights.append(sum(p.padding_per_sequence.values()) / mib)
            else:
                heights.append((p.bytes_per_sequence.get(kind, 0) - p.padding_per_sequence.get(kind, 0)) / mib)
        if not any(heights):
            continue
        label = "page padding" if kind == "padding" else LABELS[kind]
        ax.bar(dtypes, heights, bottom=bottoms, label=label, color=COLORS[kind], width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for i, d in enumerate(dtypes):
        p = mm.plans[d]
        ax.annotate(f"{p.kv_cache_tokens:,} tok\n{mm.ratio(d):.2f}x", (i, bottoms[i]), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_ylabel(f"MiB per sequence of {mm.max_model_len:,} tokens")
    ax.set_xlabel("--kv-cache-dtype")
    ax.set_ylim(0, max(bottoms) * 1.2)
    ax.set_title(f"Where the bytes are: {mm.model.name}", fontsize=10)
    no_kv = [f"{mm.model.count(k)} {k.upper() if k == 'mlp' else 'MoE'}" for k in NO_KV_KINDS if mm.model.count(k)]
    note = f" ({', '.join(no_kv)} blocks hold no KV)" if no_kv else ""
    fig.text(0.01, 0.01, f"vLLM allocator model, {mm.settings.kv_memory_bytes / 2**30:g} GiB KV memory{note}",
             fontsize=7, color="#555555")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save_png(fig, path)
