"""The lever chart: a heat-map of predicted capacity over --kv-cache-dtype (rows) x
--mamba-ssm-cache-dtype (columns), each cell its tokens and its ratio to the reference cell."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kvprobe.memmap import Lever
from kvprobe.report.save import save_png


def lever_chart(lv: Lever, path: str | Path) -> Path:
    """Write the chart as a PNG at `path` and return the path."""
    # An Agg canvas of its own, as bytes_chart.py does: pyplot's global state stays untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    kvs, ssms = lv.kv_dtypes, lv.ssm_dtypes
    ratios = [[lv.cell(kv, ssm).ratio for ssm in ssms] for kv in kvs]
    flat = [r for row in ratios for r in row]
    fig = Figure(figsize=(max(6.5, 1.7 * len(ssms) + 3.5), 2.6 + 0.6 * len(kvs)), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # Centred on 1.0 so "frees nothing" is always the same neutral colour, gains green, losses red.
    span = max(abs(max(flat) - 1), abs(min(flat) - 1), 0.05)
    image = ax.imshow(ratios, cmap="RdYlGn", vmin=1 - span, vmax=1 + span, aspect="auto")
    for i, kv in enumerate(kvs):
        for j, ssm in enumerate(ssms):
            c = lv.cell(kv, ssm)
            dark = abs(c.ratio - 1) > 0.7 * span  # the colour map's ends: black text would not read
            ax.text(j, i, f"{c.kv_cache_tokens:,} tok\n{c.ratio:.2f}x", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black", fontweight="bold" if c is lv.reference else "normal")
            if c is lv.reference:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    ax.set_xticks(range(len(ssms)), ssms)
    ax.set_yticks(range(len(kvs)), kvs)
    ax.set_xlabel("--mamba-ssm-cache-dtype")
    ax.set_ylabel("--kv-cache-dtype")
    caching = "on" if lv.mode == "align" else "off"
    ax.set_title(f"Capacity by KV x SSM state dtype: {lv.mm.model.name}, {lv.mm.max_model_len:,} tokens, "
                 f"prefix caching {caching}", fontsize=9)
    fig.colorbar(image, ax=ax, label="x the reference (outlined)", fraction=0.05)
    note = "\n".join(textwrap.wrap(lv.sentence().replace("`", ""), 130))
    fig.text(0.01, 0.01, f"{note}\nvLLM allocator model, {lv.mm.settings.kv_memory_bytes / 2**30:g} GiB KV memory",
             fontsize=6.5, color="#444444", va="bottom")
    fig.tight_layout(rect=(0, 0.06 + 0.025 * note.count("\n"), 1, 1))
    return save_png(fig, path)
